#pragma once
// The communicator a role's collectives run on: NCCL where the group may use
// it (comm/group_backend.h: a CUDA job, an NCCL build, one GPU per member),
// else MPI. Every member of the group calls it together (it gathers the
// members' devices), and group rank 0 logs the choice and its reason.

#include <mpi.h>

#include <memory>
#include <string>

#include "moerl/comm/communicator.h"

namespace moerl::app {

// `cuda_device`: this rank's CUDA device, or -1 on CPU. `host`: the rank's
// placement host name (World::placement_host), which tells members apart.
// `nccl_wanted`: false when run.collectives = "mpi".
std::unique_ptr<comm::Communicator> make_group_communicator(MPI_Comm group, const std::string& name, int cuda_device,
                                                            const std::string& host, bool nccl_wanted = true);

}  // namespace moerl::app
