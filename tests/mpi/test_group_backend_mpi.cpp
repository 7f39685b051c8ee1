// Group backends over real MPI: every member gathers every member's report
// and reaches the same choice; and, where moerl has NCCL and a GPU is
// visible, the NCCL communicator moves host and device buffers and carries a
// whole weight-sync publication (scripts/gpu_check.sh runs it on a GPU with
// one NCCL "host" per rank, NCCL_HOSTID, so that ranks sharing the one GPU
// may form a group).

#include <catch2/catch.hpp>
#include <mpi.h>

#include <cstdio>
#include <numeric>
#include <vector>

#include "moerl/comm/group_backend.h"
#include "moerl/sync/weight_sync.h"

#ifdef MOERL_WITH_NCCL
#include <cuda_runtime.h>

#include "moerl/comm/nccl_communicator.h"
#endif

using namespace moerl;

namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

}  // namespace

TEST_CASE("every member gathers every member's device report and makes the same choice", "[group_backend]") {
  const int rank = world_rank();
  const int size = world_size();
  // Two ranks per host; each its own GPU, except that rank 2 reuses rank 0's bus id on another host.
  comm::MemberDevice mine{"host-" + std::to_string(rank / 2), "bus-" + std::to_string(rank % 2)};
  const auto members = comm::gather_member_devices(MPI_COMM_WORLD, mine);
  REQUIRE(members.size() == static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    CHECK(members[static_cast<size_t>(r)].host == "host-" + std::to_string(r / 2));
    CHECK(members[static_cast<size_t>(r)].gpu_bus_id == "bus-" + std::to_string(r % 2));
  }
  CHECK(comm::choose_group_backend(true, true, members, "g").backend == comm::GroupBackend::GroupNccl);

  // Every rank on one host, one GPU: all reach MPI, naming members 0 and 1.
  const auto shared = comm::gather_member_devices(MPI_COMM_WORLD, {"one-host", "0000:19:00.0"});
  const auto choice = comm::choose_group_backend(true, true, shared, "g");
  CHECK(choice.backend == comm::GroupBackend::GroupMpi);
  CHECK(choice.reason.find("members 0 and 1 share GPU 0000:19:00.0 on one-host") != std::string::npos);
}

TEST_CASE("NCCL communicator: host and device buffers, and a weight-sync publication", "[nccl]") {
#ifndef MOERL_WITH_NCCL
  WARN("moerl was built without NCCL: the NCCL communicator test does not apply");
#else
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    WARN("no CUDA device visible: the NCCL communicator test does not apply here");
    return;
  }
  const int rank = world_rank();
  const int size = world_size();
  comm::NcclCommunicator comm(MPI_COMM_WORLD, rank % devices, "test NCCL group");
  const double timeout_s = 60;

  // A host buffer: staged through the device and copied back on completion.
  std::vector<float> host(1001, rank == 0 ? 0.0f : -1.0f);
  if (rank == 0) std::iota(host.begin(), host.end(), 0.5f);
  comm.broadcast(host.data(), host.size(), comm::DataType::Float32, 0, timeout_s);
  for (size_t i = 0; i < host.size(); i += 97) REQUIRE(host[i] == static_cast<float>(i) + 0.5f);

  std::vector<double> sums(7, rank + 1.0);
  comm.allreduce_sum(sums.data(), sums.size(), comm::DataType::Float64, timeout_s);
  for (double s : sums) REQUIRE(s == size * (size + 1) / 2.0);

  // A device buffer: NCCL reads and writes it in place.
  std::vector<float> values(4099, static_cast<float>(rank));
  float* device = nullptr;
  REQUIRE(cudaMalloc(&device, values.size() * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpy(device, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  comm.allreduce_sum(device, values.size(), comm::DataType::Float32, timeout_s);
  REQUIRE(cudaMemcpy(values.data(), device, values.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(device);
  for (float v : values) REQUIRE(v == static_cast<float>(size * (size - 1) / 2));

  // The weight-sync protocol (host staging, CRC-32C per bucket) over NCCL.
  std::vector<float> weights(300007);
  auto fill = [&](std::int64_t version) {
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<float>(version * 1000003 + i % 4093);
  };
  std::vector<sync::WeightView> views{{"w", weights.data(), weights.size() * sizeof(float)}};
  sync::SyncOptions options;
  options.bucket_bytes = 256 << 10;
  options.timeout_s = timeout_s;
  const std::int64_t versions = 3;
  if (rank == 0) {
    sync::WeightPublisher publisher(comm, views, options);
    for (std::int64_t v = 1; v <= versions; ++v) {
      fill(v);
      publisher.publish(v);
      publisher.finish();
      REQUIRE(cudaStreamQuery(comm.stream()) == cudaSuccess);
    }
    std::printf("nccl: last publication %.1f MB at %.2f GB/s\n", publisher.last().bytes / 1e6,
                publisher.last().gigabytes_per_s());
    publisher.close();
  } else {
    sync::WeightReceiver receiver(comm, views, options);
    for (std::int64_t v = 1; v <= versions; ++v) {
      REQUIRE(receiver.wait_ready(timeout_s));
      REQUIRE(receiver.apply() == v);
      std::vector<float> expected(weights.size());
      for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<float>(v * 1000003 + i % 4093);
      REQUIRE(weights == expected);
      // Nothing left on the GPU while the next header waits (it waits on
      // control(), over MPI): a spinning broadcast kernel here would hold any
      // kernel that CUDA must load first, as it held the first GPU run's actor.
      REQUIRE(cudaStreamQuery(comm.stream()) == cudaSuccess);
    }
    while (!receiver.closed()) receiver.poll();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::printf("nccl checked on %d ranks\n", size);
#endif
}
