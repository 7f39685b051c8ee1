// comm::choose_group_backend: which groups may run on NCCL, from what every
// member reports (host, GPU), and the reason the log gives.

#include <catch2/catch.hpp>

#include "moerl/comm/group_backend.h"

using namespace moerl::comm;

namespace {

std::vector<MemberDevice> members(std::initializer_list<std::pair<const char*, const char*>> list) {
  std::vector<MemberDevice> out;
  for (const auto& [host, bus] : list) out.push_back({host, bus});
  return out;
}

}  // namespace

TEST_CASE("group backend: NCCL when every member has a GPU of its own", "[comm][group_backend]") {
  const auto choice = choose_group_backend(true, true,
                                           members({{"node-a", "0000:19:00.0"},
                                                    {"node-a", "0000:3b:00.0"},
                                                    {"node-b", "0000:19:00.0"}}),  // same bus id, other host
                                           "learner group");
  CHECK(choice.backend == GroupBackend::GroupNccl);
  CHECK(choice.reason == "learner group uses NCCL: 3 members, one GPU each");
}

TEST_CASE("group backend: a shared GPU keeps the group on MPI and names the members", "[comm][group_backend]") {
  // The one-GPU machine: learner 0 and two actors on the same device.
  const auto choice = choose_group_backend(
      true, true, members({{"gpu-1", "0000:19:00.0"}, {"gpu-1", "0000:3b:00.0"}, {"gpu-1", "0000:19:00.0"}}),
      "weight-sync group");
  CHECK(choice.backend == GroupBackend::GroupMpi);
  CHECK(choice.reason ==
        "weight-sync group uses MPI: members 0 and 2 share GPU 0000:19:00.0 on gpu-1 (NCCL refuses two ranks of one "
        "group on one device)");
}

TEST_CASE("group backend: CPU jobs, builds without NCCL and members without a GPU use MPI", "[comm][group_backend]") {
  const auto two_gpus = members({{"a", "0000:19:00.0"}, {"a", "0000:3b:00.0"}});
  const auto cpu = choose_group_backend(false, true, two_gpus, "learner group");
  CHECK(cpu.backend == GroupBackend::GroupMpi);
  CHECK(cpu.reason == "learner group uses MPI: the job runs on CPU");
  const auto no_nccl = choose_group_backend(true, false, two_gpus, "learner group");
  CHECK(no_nccl.backend == GroupBackend::GroupMpi);
  CHECK(no_nccl.reason == "learner group uses MPI: this moerl was built without NCCL");
  const auto mpi_asked = choose_group_backend(true, true, two_gpus, "learner group", /*nccl_wanted=*/false);
  CHECK(mpi_asked.backend == GroupBackend::GroupMpi);
  CHECK(mpi_asked.reason == "learner group uses MPI: run.collectives = \"mpi\"");
  const auto gpu_less = choose_group_backend(true, true, members({{"a", "0000:19:00.0"}, {"b", ""}}), "sync");
  CHECK(gpu_less.backend == GroupBackend::GroupMpi);
  CHECK(gpu_less.reason == "sync uses MPI: member 1 on b has no GPU");
}

TEST_CASE("group backend: a group of one on a GPU may use NCCL", "[comm][group_backend]") {
  CHECK(choose_group_backend(true, true, members({{"a", "0000:19:00.0"}}), "g").backend == GroupBackend::GroupNccl);
}
