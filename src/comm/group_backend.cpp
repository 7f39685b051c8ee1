#include "moerl/comm/group_backend.h"

#include <algorithm>
#include <map>

#include "moerl/core/check.h"

#ifdef MOERL_WITH_NCCL
#include <cuda_runtime.h>
#endif

namespace moerl::comm {

GroupBackendChoice choose_group_backend(bool cuda_job, bool nccl_built, const std::vector<MemberDevice>& members,
                                        const std::string& group, bool nccl_wanted) {
  GroupBackendChoice choice;
  if (!cuda_job) {
    choice.reason = group + " uses MPI: the job runs on CPU";
    return choice;
  }
  if (!nccl_wanted) {
    choice.reason = group + " uses MPI: run.collectives = \"mpi\"";
    return choice;
  }
  if (!nccl_built) {
    choice.reason = group + " uses MPI: this moerl was built without NCCL";
    return choice;
  }
  std::map<std::pair<std::string, std::string>, size_t> first_on_device;
  for (size_t rank = 0; rank < members.size(); ++rank) {
    const MemberDevice& m = members[rank];
    if (m.gpu_bus_id.empty()) {
      choice.reason = group + " uses MPI: member " + std::to_string(rank) + " on " + m.host + " has no GPU";
      return choice;
    }
    const auto [it, fresh] = first_on_device.emplace(std::make_pair(m.host, m.gpu_bus_id), rank);
    if (!fresh) {
      choice.reason = group + " uses MPI: members " + std::to_string(it->second) + " and " + std::to_string(rank) +
                      " share GPU " + m.gpu_bus_id + " on " + m.host +
                      " (NCCL refuses two ranks of one group on one device)";
      return choice;
    }
  }
  choice.backend = GroupBackend::GroupNccl;
  choice.reason = group + " uses NCCL: " + std::to_string(members.size()) + " members, one GPU each";
  return choice;
}

std::vector<MemberDevice> gather_member_devices(MPI_Comm comm, const MemberDevice& mine) {
  // Fixed-width records: host names and bus ids are short, and one
  // MPI_Allgather of fixed records needs no second round for lengths.
  constexpr size_t kField = 128;
  int size = 0;
  MOERL_MPI_CHECK(MPI_Comm_size(comm, &size));
  std::vector<char> record(2 * kField, '\0');
  std::copy_n(mine.host.begin(), std::min(mine.host.size(), kField - 1), record.begin());
  std::copy_n(mine.gpu_bus_id.begin(), std::min(mine.gpu_bus_id.size(), kField - 1), record.begin() + kField);
  std::vector<char> all(record.size() * static_cast<size_t>(size));
  MOERL_MPI_CHECK(MPI_Allgather(record.data(), static_cast<int>(record.size()), MPI_CHAR, all.data(),
                                static_cast<int>(record.size()), MPI_CHAR, comm));
  std::vector<MemberDevice> members(static_cast<size_t>(size));
  for (size_t r = 0; r < members.size(); ++r) {
    const char* at = all.data() + r * record.size();
    members[r].host = std::string(at);
    members[r].gpu_bus_id = std::string(at + kField);
  }
  return members;
}

std::string cuda_bus_id(int device) {
#ifdef MOERL_WITH_NCCL
  char bus_id[64] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return bus_id;
#else
  (void)device;
  return "";
#endif
}

bool nccl_built() {
#ifdef MOERL_WITH_NCCL
  return true;
#else
  return false;
#endif
}

}  // namespace moerl::comm
