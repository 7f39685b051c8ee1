#include "moerl/core/usable_cores.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

namespace moerl {
namespace {

std::optional<std::string> read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<int> cores_from_quota(double quota, double period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  return std::max(1, static_cast<int>(std::ceil(quota / period - 1e-9)));
}

// cgroup v2 (one unified hierarchy, the process's own group mounted at
// /sys/fs/cgroup in a container), else v1's cpu controller.
std::optional<int> cgroup_quota_cores() {
  if (auto v2 = read_first_line("/sys/fs/cgroup/cpu.max")) return cores_from_cpu_max(*v2);
  const auto quota = read_first_line("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
  const auto period = read_first_line("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  if (!quota || !period) return std::nullopt;
  try {
    return cores_from_quota(std::stod(*quota), std::stod(*period));  // quota -1: no limit
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<int> cores_from_cpu_max(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota, period;
  if (!(in >> quota >> period) || quota == "max") return std::nullopt;
  try {
    return cores_from_quota(std::stod(quota), std::stod(period));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

int usable_cores() {
  int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) cores = std::min(cores, std::max(1, CPU_COUNT(&mask)));
  if (const auto quota = cgroup_quota_cores()) cores = std::min(cores, *quota);
  return cores;
}

}  // namespace moerl
