#include "moerl/app/group_communicators.h"

#include <spdlog/spdlog.h>

#include "moerl/comm/group_backend.h"
#include "moerl/comm/mpi_communicator.h"

#ifdef MOERL_WITH_NCCL
#include "moerl/comm/nccl_communicator.h"
#endif

namespace moerl::app {

std::unique_ptr<comm::Communicator> make_group_communicator(MPI_Comm group, const std::string& name, int cuda_device,
                                                            const std::string& host, bool nccl_wanted) {
  const bool cuda = cuda_device >= 0;
  const comm::MemberDevice mine{host, cuda ? comm::cuda_bus_id(cuda_device) : ""};
  const comm::GroupBackendChoice choice =
      comm::choose_group_backend(cuda, comm::nccl_built(), comm::gather_member_devices(group, mine), name, nccl_wanted);
  int group_rank = 0;
  MPI_Comm_rank(group, &group_rank);
  if (group_rank == 0 && cuda) spdlog::info("{}", choice.reason);
#ifdef MOERL_WITH_NCCL
  if (choice.backend == comm::GroupBackend::GroupNccl)
    return std::make_unique<comm::NcclCommunicator>(group, cuda_device, name);
#endif
  return std::make_unique<comm::MpiCommunicator>(group, name);
}

}  // namespace moerl::app
