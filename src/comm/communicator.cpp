#include "moerl/comm/communicator.h"

#include <chrono>
#include <sstream>
#include <thread>

#include "moerl/comm/stall_inspector.h"

namespace moerl::comm {

size_t element_size(DataType type) {
  switch (type) {
    case DataType::Float32: return 4;
    case DataType::Float64: return 8;
    case DataType::Int64: return 8;
    case DataType::Byte: return 1;
  }
  return 1;
}

const char* data_type_name(DataType type) {
  switch (type) {
    case DataType::Float32: return "float32";
    case DataType::Float64: return "float64";
    case DataType::Int64: return "int64";
    case DataType::Byte: return "byte";
  }
  return "unknown";
}

void CommRequest::wait(double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  int pause_us = 1;
  while (!test()) {
    if (Clock::now() > deadline) throw CommTimeout(timeout_message(timeout_s));
    // Spin briefly first: collectives on one host finish in microseconds.
    if (pause_us > 64) std::this_thread::sleep_for(std::chrono::microseconds(std::min(pause_us, 1000)));
    pause_us *= 2;
  }
}

namespace {

// ": <who is missing>", asked of the group's members, or a generic hint where
// the backend cannot tell.
std::string missing_part(CommRequest& request, double timeout_s) {
  const std::string missing = request.missing_members(stall_grace_s(timeout_s));
  return missing.empty() ? " (a rank of the group is missing or stuck)" : ": " + missing;
}

}  // namespace

std::string CommRequest::stall_report(double timeout_s) { return describe() + missing_part(*this, timeout_s); }

std::string CommRequest::timeout_message(double timeout_s) {
  std::ostringstream seconds;
  seconds << timeout_s;  // "60", "0.5": no trailing zeros
  return describe() + " did not complete within " + seconds.str() + " s" + missing_part(*this, timeout_s);
}

void Communicator::broadcast(void* data, size_t count, DataType type, int root, double timeout_s) {
  broadcast_async(data, count, type, root)->wait(timeout_s);
}

void Communicator::allreduce_sum(void* data, size_t count, DataType type, double timeout_s) {
  allreduce_sum_async(data, count, type)->wait(timeout_s);
}

void Communicator::barrier(double timeout_s) { barrier_async()->wait(timeout_s); }

}  // namespace moerl::comm
