// `mpirun -np N moerl bench sync`: weight publication (bucketed, checksummed,
// version-fenced, through WeightPublisher/WeightReceiver) against a plain
// MPI_Bcast of the same bytes, in the same job. Time is from a common start
// (barrier) to the moment the last rank holds the bytes in its parameters
// (max over ranks; the receivers' apply() is included: a buffer swap, as in
// the actors).
//
// Cases per size: "publish" (the learner's way: a snapshot copy, training
// goes on meanwhile) and "publish_in_place" (buckets sent straight from the
// parameters). Each reports where the time went: the publisher's time inside
// publish(), the staging+checksum time on each side, and apply(). A
// "checksum" case compares the bucket CRC-32C with the single-stream one.

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <climits>
#include <numeric>
#include <vector>

#include "moerl/bench/registry.h"
#include "moerl/comm/mpi_communicator.h"
#include "moerl/core/check.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/mpi_session.h"
#include "moerl/storage/checksum.h"
#include "moerl/sync/weight_sync.h"

namespace {

double now_s() { return moerl::runtime::monotonic_seconds(); }

double slowest(double seconds) {
  double max = 0;
  MPI_Allreduce(&seconds, &max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return max;
}

double time_plain_bcast(moerl::PageAlignedBytes& bytes) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = now_s();
  for (size_t at = 0; at < bytes.size(); at += INT_MAX / 2) {
    const int count = static_cast<int>(std::min<size_t>(INT_MAX / 2, bytes.size() - at));
    MPI_Bcast(bytes.data() + at, count, MPI_BYTE, 0, MPI_COMM_WORLD);
  }
  return slowest(now_s() - start);
}

// One publication's timings, each the slowest rank's.
struct Timing {
  double total = 0, blocking = 0, publisher_checksum = 0, receiver_checksum = 0, apply = 0;
};

Timing time_publication(std::int64_t version, moerl::sync::WeightPublisher* publisher,
                        moerl::sync::WeightReceiver* receiver) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = now_s();
  double blocking = 0, publisher_checksum = 0, receiver_checksum = 0, apply = 0;
  if (publisher) {
    publisher->publish(version);
    publisher->finish();
    blocking = publisher->last().blocking_s;
    publisher_checksum = publisher->last().checksum_s;
  } else {
    receiver->wait_ready(600);
    const double applying = now_s();
    receiver->apply();
    apply = now_s() - applying;
    receiver_checksum = receiver->last().checksum_s;
  }
  Timing t;
  t.total = slowest(now_s() - start);
  t.blocking = slowest(blocking);
  t.publisher_checksum = slowest(publisher_checksum);
  t.receiver_checksum = slowest(receiver_checksum);
  t.apply = slowest(apply);
  return t;
}

moerl::bench::BenchCase publication_case(moerl::comm::Communicator& comm, size_t bytes_total, size_t bucket,
                                         bool snapshot, int repetitions) {
  const int rank = comm.rank();
  // Aligned as parameters are (a tensor's storage starts on 64 bytes): how
  // the buffers at both ends are aligned changes the copy's speed by up to
  // 1.5x (core/page_aligned_bytes.h), and a malloc'd vector is not.
  moerl::PageAlignedBytes weights(bytes_total);
  std::iota(weights.begin(), weights.end(), static_cast<std::uint8_t>(rank));
  std::vector<moerl::sync::WeightView> views{{"weights", weights.data(), weights.size()}};
  moerl::sync::SyncOptions sync_options;
  sync_options.bucket_bytes = bucket;
  sync_options.timeout_s = 600;
  sync_options.snapshot = snapshot;
  std::unique_ptr<moerl::sync::WeightPublisher> publisher;
  std::unique_ptr<moerl::sync::WeightReceiver> receiver;
  moerl::sync::FlatWeights live;  // a receiver's parameters
  if (rank == 0) {
    publisher = std::make_unique<moerl::sync::WeightPublisher>(comm, views, sync_options);
  } else {
    // As the actors receive: versions land beside the live weights and apply() swaps them.
    receiver = std::make_unique<moerl::sync::WeightReceiver>(comm, views, sync_options,
                                                             [&live](const moerl::sync::FlatWeights& w) { live = w; });
  }
  Timing best;
  best.total = 1e30;
  double best_bcast = 1e30;
  for (int r = 0; r < repetitions; ++r) {
    const Timing t = time_publication(r + 1, publisher.get(), receiver.get());
    if (t.total < best.total) best = t;
    best_bcast = std::min(best_bcast, time_plain_bcast(weights));
  }
  if (publisher) publisher->close();
  while (receiver && !receiver->closed()) receiver->poll();
  const double gigabytes = static_cast<double>(bytes_total) / 1e9;
  moerl::bench::BenchCase c;
  c.name = snapshot ? "publish" : "publish_in_place";
  c.params = {{"bytes", static_cast<std::int64_t>(bytes_total)},
              {"ranks", std::int64_t{comm.size()}},
              {"bucket_bytes", static_cast<std::int64_t>(bucket)}};
  c.metrics = {{"GB_per_s", gigabytes / best.total}, {"seconds", best.total},
               {"publish_call_s", best.blocking},    {"stage_crc_s", best.publisher_checksum},
               {"verify_s", best.receiver_checksum}, {"apply_s", best.apply}};
  c.baseline = {{"GB_per_s", gigabytes / best_bcast}, {"seconds", best_bcast}};
  c.ratio_metric = "GB_per_s";
  return c;
}

// Bucket CRC-32C (ISA-L) against a memcpy of the same bytes: both are one
// pass over memory, so the ratio says how close the checksum comes to the
// memory bound.
moerl::bench::BenchCase checksum_case(size_t bytes_total, int repetitions) {
  std::vector<std::uint8_t> bytes(bytes_total), copy(bytes_total);
  std::iota(bytes.begin(), bytes.end(), std::uint8_t{7});
  double best_crc = 1e30, best_copy = 1e30;
  const std::uint32_t first = moerl::storage::crc32c(bytes.data(), bytes.size());
  for (int r = 0; r < repetitions; ++r) {
    double t = now_s();
    const std::uint32_t crc = moerl::storage::crc32c(bytes.data(), bytes.size());
    best_crc = std::min(best_crc, now_s() - t);
    MOERL_CHECK(crc == first, "checksum benchmark: CRC-32C of the same bytes changed");
    t = now_s();
    std::memcpy(copy.data(), bytes.data(), bytes_total);
    best_copy = std::min(best_copy, now_s() - t);
  }
  MOERL_CHECK(copy == bytes, "checksum benchmark: the copy differs");
  const double gigabytes = static_cast<double>(bytes_total) / 1e9;
  moerl::bench::BenchCase c;
  c.name = "checksum";
  c.params = {{"bytes", static_cast<std::int64_t>(bytes_total)},
              {"implementation", std::string("ISA-L crc32_iscsi")},
              {"baseline", std::string("memcpy")}};
  c.metrics = {{"GB_per_s", gigabytes / best_crc}};
  c.baseline = {{"GB_per_s", gigabytes / best_copy}};
  c.ratio_metric = "GB_per_s";
  return c;
}

moerl::bench::BenchReport run(const moerl::bench::BenchOptions& options) {
  const auto session = moerl::runtime::start_mpi_unless_running();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) throw moerl::Error("bench sync needs at least 2 ranks: mpirun -np 3 moerl bench sync");

  moerl::bench::BenchReport report;
  report.quiet = rank != 0;
  const std::vector<size_t> sizes = options.quick
                                        ? std::vector<size_t>{size_t{1} << 20}
                                        : std::vector<size_t>{size_t{4} << 20, size_t{64} << 20, size_t{256} << 20};
  const size_t bucket = size_t{4} << 20;
  const int repetitions = options.quick ? 1 : 5;
  moerl::comm::MpiCommunicator comm(MPI_COMM_WORLD, "bench sync group");
  if (rank == 0) report.cases.push_back(checksum_case(sizes.back(), repetitions));
  for (const size_t bytes_total : sizes)
    for (const bool snapshot : {true, false})
      report.cases.push_back(publication_case(comm, bytes_total, bucket, snapshot, repetitions));
  return report;
}

}  // namespace

MOERL_BENCHMARK("sync",
                "weight publication GB/s (buckets, CRC-32C, version fence) vs plain MPI_Bcast; run under mpirun", run);
