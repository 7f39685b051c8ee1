#pragma once
// What the learner MPI tests (mpi.learner_modes, mpi.learner_dynamic_sampling)
// share beyond their scripted episodes (scripted_turns.h): a run directory
// every rank agrees on, a barrier with a deadline, and parameter values
// compared bit for bit.

#include <mpi.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "moerl/core/error.h"
#include "moerl/runtime/mailbox.h"

namespace moerl_test {

// A temporary directory named after rank 0's process id, the same on every rank.
inline std::string shared_temp_dir(const std::string& prefix) {
  long long pid = static_cast<long long>(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  return (std::filesystem::temp_directory_path() / (prefix + std::to_string(pid))).string();
}

// Waits for every rank without spinning (ranks outnumber cores); throws
// (failing the test case) after `timeout_s`.
inline void polite_barrier(MPI_Comm comm, double timeout_s = 180) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  const double deadline = moerl::runtime::monotonic_seconds() + timeout_s;
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done && moerl::runtime::monotonic_seconds() > deadline)
      throw moerl::Error("a rank did not reach the end of the test within " + std::to_string(timeout_s) + " s");
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

inline std::vector<float> float_values(const torch::Tensor& x) {
  const torch::Tensor c = x.detach().contiguous().reshape({-1});
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

using ParameterValues = std::vector<std::vector<float>>;  // per parameter, flattened

inline ParameterValues parameter_values(const std::vector<torch::Tensor>& parameters) {
  ParameterValues values;
  for (const auto& p : parameters) values.push_back(float_values(p));
  return values;
}

// Indices of the parameters whose values differ in any bit or in size (all
// of the longer list's extra ones when the counts differ).
inline std::vector<size_t> differing_parameters(const ParameterValues& x, const ParameterValues& y) {
  std::vector<size_t> differing;
  for (size_t p = 0; p < std::max(x.size(), y.size()); ++p)
    if (p >= x.size() || p >= y.size() || x[p].size() != y[p].size() ||
        std::memcmp(x[p].data(), y[p].data(), x[p].size() * sizeof(float)) != 0)
      differing.push_back(p);
  return differing;
}

}  // namespace moerl_test
