#pragma once
// Which backend a group of ranks runs its collectives on: NCCL (device
// memory, the fast path between GPUs) or MPI (host memory).
//
// NCCL only where it can work: the job runs on CUDA, moerl was built with
// NCCL, and no two members of the group share a GPU. NCCL 2.5 and later
// refuse the last outright ("Duplicate GPU detected") because its topology
// search assumes one rank per device; several ranks sharing one GPU (a
// one-GPU test machine, or more actors than devices) therefore keep that
// group on MPI, and the log says why. The decision is a pure function of what
// every member reports (host, device), so that every member reaches the same
// one and the rule is unit-tested without a GPU; gather_member_devices
// collects the reports over MPI.

#include <mpi.h>

#include <string>
#include <vector>

namespace moerl::comm {

// Where one member computes: its host and its GPU's PCI bus id ("" = no GPU).
struct MemberDevice {
  std::string host;
  std::string gpu_bus_id;
};

enum class GroupBackend { GroupMpi, GroupNccl };

struct GroupBackendChoice {
  GroupBackend backend = GroupBackend::GroupMpi;
  std::string reason;  // one sentence for the log: why this backend
};

// `members` in group rank order; `group` names the group in the reason.
// `nccl_wanted` false (run.collectives = "mpi") keeps every group on MPI.
GroupBackendChoice choose_group_backend(bool cuda_job, bool nccl_built, const std::vector<MemberDevice>& members,
                                        const std::string& group, bool nccl_wanted = true);

// Every member's report, in rank order of `comm` (collective over `comm`).
std::vector<MemberDevice> gather_member_devices(MPI_Comm comm, const MemberDevice& mine);

// The PCI bus id of CUDA device `device` ("0000:19:00.0"), or "" when moerl
// was built without CUDA or the device cannot be queried.
std::string cuda_bus_id(int device);

// Whether this build has the NCCL backend (MOERL_WITH_NCCL).
bool nccl_built();

}  // namespace moerl::comm
