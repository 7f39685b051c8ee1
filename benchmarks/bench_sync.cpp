// `mpirun -np N moerl bench sync`: weight publication (bucketed, checksummed,
// version-fenced, through WeightPublisher/WeightReceiver) against a plain
// MPI_Bcast of the same bytes, in the same job. Time is from a common start
// (barrier) to the moment the last rank holds the bytes (max over ranks).

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <vector>

#include "moerl/bench/registry.h"
#include "moerl/comm/mpi_communicator.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/mpi_session.h"
#include "moerl/sync/weight_sync.h"

namespace {

double now_s() { return moerl::runtime::monotonic_seconds(); }

double slowest(double seconds) {
  double max = 0;
  MPI_Allreduce(&seconds, &max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return max;
}

double time_plain_bcast(std::vector<std::uint8_t>& bytes) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = now_s();
  for (size_t at = 0; at < bytes.size(); at += INT_MAX / 2) {
    const int count = static_cast<int>(std::min<size_t>(INT_MAX / 2, bytes.size() - at));
    MPI_Bcast(bytes.data() + at, count, MPI_BYTE, 0, MPI_COMM_WORLD);
  }
  return slowest(now_s() - start);
}

double time_publication(moerl::comm::Communicator& comm, std::vector<std::uint8_t>& bytes, size_t bucket,
                        std::int64_t version, moerl::sync::WeightPublisher* publisher,
                        moerl::sync::WeightReceiver* receiver) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = now_s();
  if (publisher) {
    publisher->publish(version);
    publisher->finish();
  } else {
    receiver->wait_ready(600);
    receiver->apply();
  }
  return slowest(now_s() - start);
}

moerl::bench::BenchReport run(const moerl::bench::BenchOptions& options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  std::unique_ptr<moerl::runtime::MpiSession> session;
  if (!initialized) session = std::make_unique<moerl::runtime::MpiSession>(nullptr, nullptr);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) throw moerl::Error("bench sync needs at least 2 ranks: mpirun -np 3 moerl bench sync");

  moerl::bench::BenchReport report;
  report.quiet = rank != 0;
  const std::vector<size_t> sizes = options.quick ? std::vector<size_t>{size_t{1} << 20}
                                                  : std::vector<size_t>{size_t{4} << 20, size_t{64} << 20, size_t{256} << 20};
  const size_t bucket = size_t{4} << 20;
  const int repetitions = options.quick ? 1 : 3;
  moerl::comm::MpiCommunicator comm(MPI_COMM_WORLD, "bench sync group");
  for (const size_t bytes_total : sizes) {
    std::vector<std::uint8_t> weights(bytes_total, static_cast<std::uint8_t>(rank));
    std::vector<moerl::sync::WeightView> views{{"weights", weights.data(), weights.size()}};
    moerl::sync::SyncOptions sync_options;
    sync_options.bucket_bytes = bucket;
    sync_options.timeout_s = 600;
    std::unique_ptr<moerl::sync::WeightPublisher> publisher;
    std::unique_ptr<moerl::sync::WeightReceiver> receiver;
    if (rank == 0) {
      publisher = std::make_unique<moerl::sync::WeightPublisher>(comm, views, sync_options);
    } else {
      receiver = std::make_unique<moerl::sync::WeightReceiver>(comm, views, sync_options);
    }
    double best_sync = 1e30, best_bcast = 1e30;
    for (int r = 0; r < repetitions; ++r) {
      best_sync = std::min(best_sync, time_publication(comm, weights, bucket, r + 1, publisher.get(), receiver.get()));
      best_bcast = std::min(best_bcast, time_plain_bcast(weights));
    }
    if (publisher) publisher->close();
    while (receiver && !receiver->closed()) receiver->poll();
    const double gigabytes = static_cast<double>(bytes_total) / 1e9;
    moerl::bench::BenchCase c;
    c.name = "publish";
    c.params = {{"bytes", static_cast<std::int64_t>(bytes_total)}, {"ranks", std::int64_t{size}},
                {"bucket_bytes", static_cast<std::int64_t>(bucket)}};
    c.metrics = {{"GB_per_s", gigabytes / best_sync}, {"seconds", best_sync}};
    c.baseline = {{"GB_per_s", gigabytes / best_bcast}, {"seconds", best_bcast}};
    c.ratio_metric = "GB_per_s";
    report.cases.push_back(c);
  }
  return report;
}

}  // namespace

MOERL_BENCHMARK("sync", "weight publication GB/s (buckets, CRC-32, version fence) vs plain MPI_Bcast; run under mpirun", run);
