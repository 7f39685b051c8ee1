#pragma once
// Publishing new policy weights from learner 0 to the actors.
//
// A publication of version v is one header broadcast (version, layout
// fingerprint, sizes), then a broadcast of each bucket of [sync] bucket_mb of
// the weights laid end to end, then one broadcast of every bucket's CRC-32C;
// all non-blocking and pipelined:
//
//   publisher: checksum bucket b while it travels (sent in place), or stage
//              bucket b+1 while bucket b travels (snapshot)
//   receiver:  checksum bucket b as soon as it lands, while bucket b+1 travels
//
// The checksums travel last so that no bucket waits for its own: with Open
// MPI's single-copy shared memory the receiver pulls a bucket while the
// publisher checksums it. (Measured on 2 cores: a checksum posted before its
// bucket put the publisher's CRC time on the critical path.)
//
// The publisher snapshots the parameters into a staging buffer (copying and
// checksumming in one pass, storage/checksum.h), so training goes on while the
// bytes travel; publish() returns once the last bucket is posted. With
// snapshot = false (the caller keeps the parameters unchanged until the
// publication completes) a bucket that lies inside one parameter is sent
// straight from the parameter's memory: no copy at all.
//
// A receiver keeps a header broadcast posted at all times (on the group's
// control() channel: MPI even when the buckets go over NCCL, where a posted
// collective would be a kernel spinning on the actor's GPU), lands the buckets
// in its own staging buffer while it keeps generating (poll() between decode
// steps drives the transfer and checksums each bucket as it lands), and only
// when every bucket has passed marks the version ready: apply() makes it the
// live parameters between two decode steps. An actor never generates with a
// half-received version. A bucket that fails its checksum refuses the
// version; the receiver still takes the rest of its buckets (into staging) so
// that its collectives stay matched with the publisher's.
//
// apply() either copies staging into the parameters (the views' memory) or,
// in swap mode, copies nothing: the parameters live in one of two flat
// buffers the receiver owns, the version lands in the other, and apply()
// swaps the two and re-points the parameters (a Rebind the owner provides,
// module_weights.h for a LibTorch module). The copy was a third of a
// publication's time on 2 cores (23 of 102 ms at 256 MB).
//
// Collectives on the sync communicator match in order, so the publisher and
// every receiver must be constructed together and the publisher must close()
// before the group is torn down (receivers then stop re-posting headers).
//
// Metrics (telemetry): the publisher records sync.publication_s (publish()
// to the last bucket sent), sync.stage_s, sync.publish_GB_per_s; a receiver
// sync.verify_s and sync.receive_GB_per_s. The learner adds sync.publish_s,
// sync.bytes and sync.versions_in_flight; the actor sync.receive_s.
//
// Memory: the checksums run on host memory, so views must be host memory
// (with an NCCL communicator too; device weights would need a device CRC).

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moerl/comm/communicator.h"
#include "moerl/config/sections.h"
#include "moerl/core/page_aligned_bytes.h"

namespace moerl::sync {

// One parameter's bytes in host memory (a view; the owner keeps it alive).
struct WeightView {
  std::string name;
  void* data = nullptr;
  size_t bytes = 0;
};

struct SyncOptions {
  size_t bucket_bytes = size_t{4} << 20;  // the largest bucket (small weights get at least 8, >= 256 KiB)
  double timeout_s = 120.0;               // a publication must complete by then
  int root = 0;                           // the publisher's rank in the communicator
  // false: the caller leaves the parameters unchanged until the publication
  // completes (finish() or progress() == true), so buckets go out without a copy.
  bool snapshot = true;
  int corrupt_bucket_for_test = -1;  // flips a byte of this bucket, after checksumming, in the next publication
};

// A version's bytes, the views laid end to end in order, from a page
// boundary (core/page_aligned_bytes.h: the publisher's staging and every
// receiver's buffer are then aligned alike). Shared, because parameters
// re-pointed into one (swap mode) keep it alive while they use it.
using FlatWeights = std::shared_ptr<PageAlignedBytes>;
// Re-points the parameters into `weights`, each at its view's flat offset.
using Rebind = std::function<void(const FlatWeights& weights)>;

// Options of a run: [sync] bucket_mb and [cluster] message_timeout_s.
SyncOptions sync_options(const config::SyncSection& sync, double timeout_s);

struct SyncStats {
  std::int64_t version = -1;
  size_t bytes = 0;
  size_t buckets = 0;
  double seconds = 0;       // publish() to completion (publisher) or header to ready (receiver)
  double blocking_s = 0;    // publisher: time inside publish() (the caller's cost)
  double checksum_s = 0;    // time spent staging and checksumming (publisher) or verifying (receiver)
  size_t copied_bytes = 0;  // publisher: bytes copied into staging (0 when sent in place)
  double gigabytes_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0; }
};

class SyncError : public Error {
 public:
  using Error::Error;
};

// A version whose bytes failed their checksum (a transient fault: the
// receiver keeps its weights and takes the next version). A layout mismatch
// is a plain SyncError: no later version can fix it.
class CorruptVersionError : public SyncError {
 public:
  using SyncError::SyncError;
};

// FNV-1a over names and sizes: both sides must hold the same layout.
std::uint64_t layout_fingerprint(const std::vector<WeightView>& views);

class WeightPublisher {
 public:
  WeightPublisher(comm::Communicator& comm, std::vector<WeightView> views, SyncOptions options = {});
  ~WeightPublisher();

  // Snapshots the parameters and starts sending them as `version`. A previous
  // publication must have completed (finish() or progress() == true).
  void publish(std::int64_t version);
  // Fault injection: the next publication flips a byte of `bucket` after checksumming it.
  void corrupt_next_publication(int bucket) { options_.corrupt_bucket_for_test = bucket; }
  bool progress();  // non-blocking; true when the publication is complete
  void finish();    // waits (with the timeout)
  bool in_flight() const { return !requests_.empty(); }
  // Tells the receivers that no more versions come; call once, at shutdown.
  void close();
  const SyncStats& last() const { return last_; }
  // After the group lost a member (comm::PeerFailure): lets the broadcasts
  // in flight end, which they do with errors once the group is revoked, so
  // that their buffers can go. The publisher is unusable afterwards; the
  // owner builds a new one on the survivors' group.
  void abandon(double timeout_s = 5.0);

 private:
  // Bucket b's bytes in the parameter itself when it may go from there (no
  // snapshot, inside one parameter), else null.
  const std::uint8_t* in_place_source(size_t b) const;
  // Copies bucket b into staging, checksumming it into checksums_[b].
  const std::uint8_t* stage_bucket(size_t b);
  size_t bucket_size(size_t b) const;
  size_t view_at(size_t at) const;  // the view holding flat offset `at`
  void drive();                     // lets completed broadcasts go, oldest first

  comm::Communicator& comm_;
  std::vector<WeightView> views_;
  std::vector<size_t> view_offsets_;  // flat offset of each view
  SyncOptions options_;
  std::uint64_t fingerprint_;
  size_t total_bytes_ = 0;
  PageAlignedBytes staging_;  // aligned like the receivers' buffers
  std::vector<std::uint32_t> checksums_;
  std::vector<std::uint8_t> header_bytes_;
  std::deque<std::unique_ptr<comm::CommRequest>> requests_;
  double started_ = 0;
  SyncStats last_;
  bool closed_ = false;
};

// What an actor needs of whatever brings it new weights: the one
// publisher's WeightReceiver below, or the ShardedWeightReceiver of
// expert-parallel learners (sync/sharded_weight_sync.h), which fences one
// version over several channels.
class VersionReceiver {
 public:
  virtual ~VersionReceiver() = default;
  // Drives the transfer; true when a verified version is ready to apply.
  virtual bool poll() = 0;
  virtual std::int64_t ready_version() const = 0;
  // Makes the ready version the parameters; returns it (or the current one).
  virtual std::int64_t apply() = 0;
  virtual std::int64_t current_version() const = 0;
  virtual bool closed() const = 0;  // the publisher said no more versions come
  virtual bool wait_ready(double timeout_s) = 0;
  virtual SyncStats last() const = 0;
};

class WeightReceiver : public VersionReceiver {
 public:
  // apply() copies each version into the views' memory.
  WeightReceiver(comm::Communicator& comm, std::vector<WeightView> views, SyncOptions options = {});
  // Swap mode: takes the views' current bytes into a buffer of its own and
  // calls rebind with it at once; apply() swaps buffers and calls it again.
  // A buffer still held by someone else (a tensor that outlived a rebind)
  // is never landed in: staging is then allocated afresh.
  WeightReceiver(comm::Communicator& comm, std::vector<WeightView> views, SyncOptions options, Rebind rebind);
  ~WeightReceiver();

  // Drives any publication in progress; true when a verified version is
  // ready to apply. Throws CorruptVersionError on a checksum mismatch (the
  // next version is received as usual), SyncError on a layout mismatch and
  // CommTimeout when a started publication does not finish in time.
  bool poll() override;
  std::int64_t ready_version() const override { return ready_version_; }
  // Makes the ready version the parameters (a copy, or a swap); returns it
  // (or the current one if none is ready).
  std::int64_t apply() override;
  std::int64_t current_version() const override { return current_version_; }
  // Drops the ready version unapplied, so that the next one is received: a
  // sharded receiver (sharded_weight_sync.h) whose other channel refused it.
  void discard_ready() { ready_version_ = current_version_; }
  bool closed() const override { return closed_; }
  // Blocks until a version is ready or the publisher closed (with the timeout).
  bool wait_ready(double timeout_s) override;
  SyncStats last() const override { return last_; }
  // As WeightPublisher::abandon.
  void abandon(double timeout_s = 5.0);
  // A receiver built after a failover: the weights it holds are this version.
  void assume_version(std::int64_t version) { current_version_ = version; }

 private:
  void post_header();
  void start_buckets();
  void checksum_landed_buckets();
  void verify_checksums();
  std::uint8_t* landing_buffer();
  void refuse(std::string reason, bool corrupt = false);

  comm::Communicator& comm_;
  std::vector<WeightView> views_;
  SyncOptions options_;
  std::uint64_t fingerprint_;
  size_t total_bytes_ = 0;
  std::vector<std::uint8_t> header_bytes_;
  FlatWeights staging_;                          // where versions land
  FlatWeights live_;                             // swap mode: where the parameters live
  Rebind rebind_;                                // swap mode only
  std::vector<std::uint8_t> discard_;            // landing place of a refused version
  std::vector<std::uint32_t> landed_checksums_;  // computed here, bucket by bucket
  std::string refusal_;
  bool refusal_corrupt_ = false;  // the refusal is a checksum failure
  std::vector<std::uint32_t> checksums_;
  std::unique_ptr<comm::CommRequest> header_request_;
  // One per bucket, in order, then the checksums' (last).
  std::vector<std::unique_ptr<comm::CommRequest>> bucket_requests_;
  size_t verified_buckets_ = 0;
  std::int64_t incoming_version_ = -1;
  std::int64_t ready_version_ = -1;
  std::int64_t current_version_ = -1;
  double started_ = 0;
  bool closed_ = false;
  SyncStats last_;
};

}  // namespace moerl::sync
