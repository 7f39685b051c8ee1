#pragma once
// Which device a rank computes on ([run] device). The rule is LibTorch free
// so that it can be unit-tested without a GPU: the caller asks LibTorch how
// many CUDA devices this process sees and passes the count in.
//
//   env workers              always the CPU (they host environments, no model)
//   learners, actors         device = "cpu": the CPU
//   (standby actors too)     device = "cuda": cuda:(local rank % visible devices)
//
// The local rank (this process's index among the job's processes on its
// host) comes from the launcher when it says so: OMPI_COMM_WORLD_LOCAL_RANK
// (mpirun, also under scripts/launch.sh), then SLURM_LOCALID (srun); else from
// the ranks that share the host (MPI_COMM_TYPE_SHARED, runtime::World).
// The modulo lets several ranks share a device (NCCL allows it for tests;
// a production layout gives each learner and actor its own).

#include <optional>
#include <string>

#include "moerl/config/sections.h"
#include "moerl/runtime/rank_layout.h"

namespace moerl::runtime {

struct DeviceChoice {
  bool cuda = false;  // false: the CPU
  int index = 0;      // the CUDA device ordinal when cuda

  // "cpu" or "cuda:N", as torch::Device parses it.
  std::string label() const;
  bool operator==(const DeviceChoice& other) const { return cuda == other.cuda && index == other.index; }
};

// The launcher's local rank from its environment values (null when unset):
// Open MPI's first, then Slurm's. nullopt when neither holds a number >= 0.
std::optional<int> launcher_local_rank(const char* ompi_local_rank, const char* slurm_local_id);

// The rule above. `visible_devices` is what LibTorch reports (0 without CUDA);
// with device = "cuda" and none visible the result is nullopt for learners and
// actors (the caller stops the job, naming rank and host), and the CPU for env workers.
std::optional<DeviceChoice> choose_device(config::RunDevice device, Role role, int local_rank, int visible_devices);

}  // namespace moerl::runtime
