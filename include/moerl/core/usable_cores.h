#pragma once
// The cores this process may use, which is what its compute threads should
// be sized by. std::thread::hardware_concurrency() counts the machine's
// online cores; in a container (a Kubernetes pod with a CPU limit, a Slurm
// step confined by cgroups or an affinity mask) that can be many times more
// than the process gets, and oversized thread pools then fight over the few.

#include <optional>
#include <string>

namespace moerl {

// Cores allowed by a cgroup CPU quota, from the text of cgroup v2's cpu.max
// ("QUOTA PERIOD", or "max PERIOD" for no limit), rounded up; nullopt for no
// limit or text that is not a quota.
std::optional<int> cores_from_cpu_max(const std::string& cpu_max);

// The smallest of: the online cores, the process's CPU affinity mask, and
// the cgroup CPU quota (v2 cpu.max, or v1 cfs_quota_us / cfs_period_us). At least 1.
int usable_cores();

}  // namespace moerl
