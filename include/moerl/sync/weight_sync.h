#pragma once
// Publishing new policy weights from learner 0 to the actors.
//
// A publication of version v is one header broadcast (version, layout
// fingerprint, sizes), one broadcast of per-bucket CRC-32C checksums (hardware
// instruction where available), then the weights
// in buckets of [sync] bucket_bytes, all non-blocking. The publisher first
// copies the parameters into a staging buffer, so training goes on while the
// bytes travel. A receiver keeps a header broadcast posted at all times,
// lands the buckets in its own staging buffer while it keeps generating
// (poll() between decode steps drives the transfer), checks every bucket's
// checksum, and only then marks the version ready: apply() copies it into the
// live parameters between two decode steps. An actor never generates with a
// half-received version.
//
// Collectives on the sync communicator match in order, so the publisher and
// every receiver must be constructed together and the publisher must close()
// before the group is torn down (receivers then stop re-posting headers).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moerl/comm/communicator.h"
#include "moerl/config/sections.h"

namespace moerl::sync {

// One parameter's bytes in host memory (a view; the owner keeps it alive).
struct WeightView {
  std::string name;
  void* data = nullptr;
  size_t bytes = 0;
};

struct SyncOptions {
  size_t bucket_bytes = size_t{4} << 20;
  double timeout_s = 120.0;          // a publication must complete by then
  int root = 0;                      // the publisher's rank in the communicator
  int corrupt_bucket_for_test = -1;  // flips a byte of this bucket after checksumming
};

// Options of a run: [sync] bucket_mb and [cluster] message_timeout_s.
SyncOptions sync_options(const config::SyncSection& sync, double timeout_s);

struct SyncStats {
  std::int64_t version = -1;
  size_t bytes = 0;
  size_t buckets = 0;
  double seconds = 0;               // publish() to completion (publisher) or header to ready (receiver)
  double gigabytes_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0; }
};

class SyncError : public Error {
 public:
  using Error::Error;
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
  bool progress();                  // non-blocking; true when the publication is complete
  void finish();                    // waits (with the timeout)
  bool in_flight() const { return !requests_.empty(); }
  // Tells the receivers that no more versions come; call once, at shutdown.
  void close();
  const SyncStats& last() const { return last_; }

 private:
  struct Header;
  comm::Communicator& comm_;
  std::vector<WeightView> views_;
  SyncOptions options_;
  std::uint64_t fingerprint_;
  size_t total_bytes_ = 0;
  std::vector<std::uint8_t> staging_;
  std::vector<std::uint32_t> checksums_;
  std::vector<std::uint8_t> header_bytes_;
  std::vector<std::unique_ptr<comm::CommRequest>> requests_;
  double started_ = 0;
  SyncStats last_;
  bool closed_ = false;
};

class WeightReceiver {
 public:
  WeightReceiver(comm::Communicator& comm, std::vector<WeightView> views, SyncOptions options = {});
  ~WeightReceiver();

  // Drives any publication in progress; true when a verified version is
  // ready to apply. Throws SyncError on a checksum or layout mismatch and
  // CommTimeout when a started publication does not finish in time.
  bool poll();
  std::int64_t ready_version() const { return ready_version_; }
  // Copies the ready version into the parameters; returns it (or the current one if none is ready).
  std::int64_t apply();
  std::int64_t current_version() const { return current_version_; }
  bool closed() const { return closed_; }
  // Blocks until a version is ready or the publisher closed (with the timeout).
  bool wait_ready(double timeout_s);
  const SyncStats& last() const { return last_; }

 private:
  void post_header();
  void start_buckets();
  void verify();

  comm::Communicator& comm_;
  std::vector<WeightView> views_;
  SyncOptions options_;
  std::uint64_t fingerprint_;
  size_t total_bytes_ = 0;
  std::vector<std::uint8_t> header_bytes_;
  std::vector<std::uint8_t> staging_;
  std::vector<std::uint8_t> discard_;  // landing place of a refused version
  std::string refusal_;
  std::vector<std::uint32_t> checksums_;
  std::unique_ptr<comm::CommRequest> header_request_;
  std::vector<std::unique_ptr<comm::CommRequest>> bucket_requests_;
  std::int64_t incoming_version_ = -1;
  std::int64_t ready_version_ = -1;
  std::int64_t current_version_ = -1;
  double started_ = 0;
  bool closed_ = false;
  SyncStats last_;
};

}  // namespace moerl::sync
