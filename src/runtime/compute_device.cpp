#include "moerl/runtime/compute_device.h"

#include <cerrno>
#include <climits>
#include <cstdlib>

namespace moerl::runtime {
namespace {

std::optional<int> parse_rank(const char* text) {
  if (text == nullptr || *text == '\0') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || value < 0 || value > INT_MAX) return std::nullopt;
  return static_cast<int>(value);
}

}  // namespace

std::string DeviceChoice::label() const { return cuda ? "cuda:" + std::to_string(index) : "cpu"; }

std::optional<int> launcher_local_rank(const char* ompi_local_rank, const char* slurm_local_id) {
  if (const auto rank = parse_rank(ompi_local_rank)) return rank;
  return parse_rank(slurm_local_id);
}

std::optional<DeviceChoice> choose_device(config::RunDevice device, Role role, int local_rank, int visible_devices) {
  if (device == config::RunDevice::Cpu || role == Role::EnvWorker) return DeviceChoice{};
  if (visible_devices < 1) return std::nullopt;
  DeviceChoice choice;
  choice.cuda = true;
  choice.index = (local_rank < 0 ? 0 : local_rank) % visible_devices;
  return choice;
}

}  // namespace moerl::runtime
