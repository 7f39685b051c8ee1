// (in src/comm so that it builds into moerl_core: it needs no LibTorch)
#include "moerl/sync/weight_sync.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "moerl/core/check.h"
#include "moerl/core/hash.h"
#include <signal.h>

#include "moerl/runtime/fault_plan.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/wire.h"
#include "moerl/storage/checksum.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::sync {
namespace {

constexpr std::uint32_t kHeaderMagic = 0x324E5953;  // "SYN2": checksums after the buckets
constexpr size_t kHeaderBytes = 64;

double now_s() { return runtime::monotonic_seconds(); }

struct HeaderFields {
  std::uint32_t magic = kHeaderMagic;
  std::uint32_t closing = 0;
  std::int64_t version = 0;
  std::uint64_t fingerprint = 0;
  std::uint64_t total_bytes = 0;
  std::uint64_t bucket_bytes = 0;
  std::uint64_t buckets = 0;
};

std::vector<std::uint8_t> encode_header(const HeaderFields& h) {
  runtime::ByteWriter w;
  w.put(h.magic);
  w.put(h.closing);
  w.put(h.version);
  w.put(h.fingerprint);
  w.put(h.total_bytes);
  w.put(h.bucket_bytes);
  w.put(h.buckets);
  auto bytes = w.take();
  bytes.resize(kHeaderBytes, 0);
  return bytes;
}

HeaderFields decode_header(const std::vector<std::uint8_t>& bytes) {
  runtime::ByteReader r(bytes);
  HeaderFields h;
  h.magic = r.get<std::uint32_t>();
  h.closing = r.get<std::uint32_t>();
  h.version = r.get<std::int64_t>();
  h.fingerprint = r.get<std::uint64_t>();
  h.total_bytes = r.get<std::uint64_t>();
  h.bucket_bytes = r.get<std::uint64_t>();
  h.buckets = r.get<std::uint64_t>();
  return h;
}

size_t bucket_count(size_t total, size_t bucket) { return total == 0 ? 0 : (total + bucket - 1) / bucket; }

// [sync] bucket_mb is the largest bucket. Weights that would fit in a few
// buckets are cut finer (down to 256 KiB) so that staging, transfer and
// verification still overlap: one 4 MB bucket of a small model would be
// staged, sent and verified strictly one after another.
constexpr size_t kPipelineBuckets = 8;
constexpr size_t kSmallestBucket = size_t{256} << 10;

size_t pipeline_bucket_bytes(size_t total, size_t configured) {
  const size_t even = (total + kPipelineBuckets - 1) / kPipelineBuckets;
  const size_t rounded = (std::max(kSmallestBucket, even) + 63) / 64 * 64;
  return std::min(configured, rounded);
}

// The collective a late version is stuck in: the first not yet complete
// (`requests` is not empty).
template <typename Requests>
comm::CommRequest& first_unfinished(const Requests& requests) {
  for (const auto& request : requests)
    if (!request->test()) return *request;
  return *requests.back();
}

}  // namespace

SyncOptions sync_options(const config::SyncSection& sync, double timeout_s) {
  SyncOptions options;
  options.bucket_bytes = static_cast<size_t>(sync.bucket_mb) << 20;
  options.timeout_s = timeout_s;
  return options;
}

std::uint64_t layout_fingerprint(const std::vector<WeightView>& views) {
  std::uint64_t hash = kFnv1aOffset;
  for (const WeightView& v : views) {
    hash = fnv1a(v.name.data(), v.name.size(), hash);
    const std::uint64_t bytes = v.bytes;
    hash = fnv1a(&bytes, sizeof bytes, hash);
  }
  return hash;
}

// ---------------------------------------------------------------- publisher

WeightPublisher::WeightPublisher(comm::Communicator& comm, std::vector<WeightView> views, SyncOptions options)
    : comm_(comm), views_(std::move(views)), options_(options), fingerprint_(layout_fingerprint(views_)) {
  MOERL_CHECK(comm_.rank() == options_.root, "WeightPublisher must run on the root rank of " + comm_.name());
  MOERL_CHECK(options_.bucket_bytes > 0, "[sync] bucket_bytes must be positive");
  for (const WeightView& v : views_) {
    view_offsets_.push_back(total_bytes_);
    total_bytes_ += v.bytes;
  }
  staging_.resize(total_bytes_);
  options_.bucket_bytes = pipeline_bucket_bytes(total_bytes_, options_.bucket_bytes);
}

WeightPublisher::~WeightPublisher() = default;

namespace {

// Waits for a broadcast of a broken group to end (with an error, once the
// group is revoked). True when it did: its buffer may then be freed.
bool let_end(std::unique_ptr<comm::CommRequest>& request, double deadline) {
  while (request) {
    try {
      if (request->test()) break;
    } catch (const Error&) {
      break;  // ended with an error: done with the buffer too
    }
    if (now_s() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  request.reset();
  return true;
}

// Buffers an unfinished broadcast may still write into are never freed
// (staging, up to the model's size; only after a failover that MPI did not
// let finish).
template <typename T, typename Allocator>
void keep_forever(std::vector<T, Allocator>& buffer) {
  new std::vector<T, Allocator>(std::move(buffer));
}

void keep_forever(FlatWeights& buffer) { new FlatWeights(std::move(buffer)); }

}  // namespace

void WeightPublisher::abandon(double timeout_s) {
  const double deadline = now_s() + timeout_s;
  bool ended = true;
  for (auto& request : requests_) ended = let_end(request, deadline) && ended;
  requests_.clear();
  if (!ended) {
    keep_forever(staging_);
    keep_forever(header_bytes_);
    keep_forever(checksums_);
  }
  closed_ = true;
}

size_t WeightPublisher::bucket_size(size_t b) const {
  return std::min(options_.bucket_bytes, total_bytes_ - b * options_.bucket_bytes);
}

// The last view starting at or before flat offset `at`: the one holding it.
size_t WeightPublisher::view_at(size_t at) const {
  return static_cast<size_t>(std::upper_bound(view_offsets_.begin(), view_offsets_.end(), at) - view_offsets_.begin()) -
         1;
}

const std::uint8_t* WeightPublisher::in_place_source(size_t b) const {
  if (options_.snapshot || static_cast<std::int64_t>(b) == options_.corrupt_bucket_for_test) return nullptr;
  const size_t begin = b * options_.bucket_bytes;
  const size_t v = view_at(begin);  // the bucket must end inside it
  if (begin + bucket_size(b) > view_offsets_[v] + views_[v].bytes) return nullptr;
  return static_cast<const std::uint8_t*>(views_[v].data) + (begin - view_offsets_[v]);
}

const std::uint8_t* WeightPublisher::stage_bucket(size_t b) {
  const size_t begin = b * options_.bucket_bytes;
  const size_t end = begin + bucket_size(b);
  size_t v = view_at(begin);  // and the views after it, as far as the bucket reaches
  const double started = now_s();
  std::uint32_t crc = 0;
  for (size_t at = begin; at < end; ++v) {
    const size_t offset = at - view_offsets_[v];
    const size_t n = std::min(views_[v].bytes - offset, end - at);
    crc = storage::copy_with_crc32c(staging_.data() + at, static_cast<const std::uint8_t*>(views_[v].data) + offset, n,
                                    crc);
    at += n;
  }
  checksums_[b] = crc;
  last_.copied_bytes += end - begin;
  // Fault injection: damaged after checksumming, as a flipped bit in transit would be.
  if (static_cast<std::int64_t>(b) == options_.corrupt_bucket_for_test) staging_[begin] ^= 0x5A;
  last_.checksum_s += now_s() - started;
  return staging_.data() + begin;
}

void WeightPublisher::drive() {
  while (!requests_.empty() && requests_.front()->test()) requests_.pop_front();
}

void WeightPublisher::publish(std::int64_t version) {
  MOERL_CHECK(!closed_, "publish after close");
  MOERL_CHECK(requests_.empty(),
              "publish of version " + std::to_string(version) + " while the previous publication is still in flight");
  started_ = now_s();
  const size_t buckets = bucket_count(total_bytes_, options_.bucket_bytes);
  last_ = SyncStats{};
  last_.version = version;
  last_.bytes = total_bytes_;
  last_.buckets = buckets;
  checksums_.assign(buckets, 0);

  HeaderFields header;
  header.version = version;
  header.fingerprint = fingerprint_;
  header.total_bytes = total_bytes_;
  header.bucket_bytes = options_.bucket_bytes;
  header.buckets = buckets;
  header_bytes_ = encode_header(header);
  requests_.push_back(
      comm_.control().broadcast_async(header_bytes_.data(), kHeaderBytes, comm::DataType::Byte, options_.root));
  // A staged bucket leaves as soon as it is staged (staging the next one
  // overlaps its transfer); a bucket sent in place leaves at once and is
  // checksummed while it travels. The checksums follow the last bucket.
  for (size_t b = 0; b < buckets; ++b) {
    const std::uint8_t* in_place = in_place_source(b);
    const std::uint8_t* source = in_place ? in_place : stage_bucket(b);
    requests_.push_back(
        comm_.broadcast_async(const_cast<std::uint8_t*>(source), bucket_size(b), comm::DataType::Byte, options_.root));
    if (in_place) {
      const double started = now_s();
      checksums_[b] = storage::crc32c(in_place, bucket_size(b));
      last_.checksum_s += now_s() - started;
    }
    drive();
  }
  requests_.push_back(
      comm_.broadcast_async(checksums_.data(), buckets * sizeof(std::uint32_t), comm::DataType::Byte, options_.root));
  options_.corrupt_bucket_for_test = -1;
  last_.blocking_s = now_s() - started_;
}

bool WeightPublisher::progress() {
  drive();
  if (requests_.empty() && last_.seconds == 0 && last_.version >= 0) {
    last_.seconds = now_s() - started_;
    auto& m = telemetry::metrics();
    m.record("sync.publication_s", last_.seconds);
    m.record("sync.stage_s", last_.checksum_s);
    m.set("sync.publish_GB_per_s", last_.gigabytes_per_s());
  }
  if (!requests_.empty() && now_s() - started_ > options_.timeout_s)
    throw comm::CommTimeout("publication of weights version " + std::to_string(last_.version) + " in " + comm_.name() +
                            " did not complete within " + std::to_string(options_.timeout_s) + " s (" +
                            first_unfinished(requests_).stall_report(options_.timeout_s) + ")");
  return requests_.empty();
}

void WeightPublisher::finish() {
  while (!progress()) std::this_thread::sleep_for(std::chrono::microseconds(20));
}

void WeightPublisher::close() {
  if (closed_) return;
  finish();
  HeaderFields header;
  header.closing = 1;
  header_bytes_ = encode_header(header);
  comm_.control().broadcast(header_bytes_.data(), kHeaderBytes, comm::DataType::Byte, options_.root,
                            options_.timeout_s);
  closed_ = true;
}

// ---------------------------------------------------------------- receiver

namespace {

FlatWeights flat_weights(size_t bytes) { return std::make_shared<PageAlignedBytes>(bytes); }

}  // namespace

WeightReceiver::WeightReceiver(comm::Communicator& comm, std::vector<WeightView> views, SyncOptions options)
    : comm_(comm), views_(std::move(views)), options_(options), fingerprint_(layout_fingerprint(views_)) {
  MOERL_CHECK(comm_.rank() != options_.root, "WeightReceiver must not run on the publishing rank");
  for (const WeightView& v : views_) total_bytes_ += v.bytes;
  staging_ = flat_weights(total_bytes_);
  post_header();
}

WeightReceiver::WeightReceiver(comm::Communicator& comm, std::vector<WeightView> views, SyncOptions options,
                               Rebind rebind)
    : WeightReceiver(comm, std::move(views), options) {
  MOERL_CHECK(rebind, "WeightReceiver: swap mode needs a rebind function");
  rebind_ = std::move(rebind);
  live_ = flat_weights(total_bytes_);
  size_t at = 0;
  for (const WeightView& v : views_) {
    std::memcpy(live_->data() + at, v.data, v.bytes);
    at += v.bytes;
  }
  rebind_(live_);
}

WeightReceiver::~WeightReceiver() = default;

void WeightReceiver::abandon(double timeout_s) {
  const double deadline = now_s() + timeout_s;
  bool ended = let_end(header_request_, deadline);
  for (auto& request : bucket_requests_) ended = let_end(request, deadline) && ended;
  bucket_requests_.clear();
  if (!ended) {
    keep_forever(staging_);
    keep_forever(header_bytes_);
    keep_forever(discard_);
    keep_forever(checksums_);
  }
  closed_ = true;
}

void WeightReceiver::post_header() {
  header_bytes_.assign(kHeaderBytes, 0);
  // Over control(): it stays posted until the next publication, which over
  // NCCL would be a kernel spinning on this rank's GPU meanwhile.
  header_request_ =
      comm_.control().broadcast_async(header_bytes_.data(), kHeaderBytes, comm::DataType::Byte, options_.root);
}

void WeightReceiver::refuse(std::string reason, bool corrupt) {
  if (!refusal_.empty()) return;
  refusal_ = std::move(reason);
  refusal_corrupt_ = corrupt;
}

// Where the next version lands. In swap mode the staging buffer was the live
// one before the last swap; if anything besides this receiver still holds it
// (a tensor made from a parameter before the swap), its bytes must stay.
std::uint8_t* WeightReceiver::landing_buffer() {
  if (rebind_ && staging_.use_count() > 1) {
    staging_ = flat_weights(total_bytes_);
    telemetry::metrics().add("sync.staging_reallocations");
  }
  return staging_->data();
}

void WeightReceiver::start_buckets() {
  const HeaderFields h = decode_header(header_bytes_);
  if (h.magic != kHeaderMagic) throw SyncError("weight sync header with a bad magic number in " + comm_.name());
  if (h.closing) {
    closed_ = true;
    header_request_.reset();
    return;
  }
  if (h.buckets != bucket_count(h.total_bytes, h.bucket_bytes))
    throw SyncError("weight sync header announces an inconsistent bucket count");
  refusal_.clear();
  std::uint8_t* landing = nullptr;
  if (h.fingerprint != fingerprint_ || h.total_bytes != total_bytes_) {
    // Receive into a scratch buffer to stay in step with the publisher's
    // collectives, then refuse the version.
    refuse("weights version " + std::to_string(h.version) + " from the learner have another layout (" +
           std::to_string(h.total_bytes) + " bytes) than this actor's model (" + std::to_string(total_bytes_) +
           " bytes): different [model]/[moe] settings?");
    discard_.assign(h.total_bytes, 0);
    landing = discard_.data();
  } else {
    landing = landing_buffer();
  }
  incoming_version_ = h.version;
  started_ = now_s();
  checksums_.assign(h.buckets, 0);
  landed_checksums_.assign(h.buckets, 0);
  bucket_requests_.clear();
  verified_buckets_ = 0;
  for (size_t b = 0; b < h.buckets; ++b) {
    const size_t begin = b * h.bucket_bytes;
    const size_t size = std::min<size_t>(h.bucket_bytes, h.total_bytes - begin);
    bucket_requests_.push_back(comm_.broadcast_async(landing + begin, size, comm::DataType::Byte, options_.root));
  }
  bucket_requests_.push_back(
      comm_.broadcast_async(checksums_.data(), h.buckets * sizeof(std::uint32_t), comm::DataType::Byte, options_.root));
  last_ = SyncStats{};
  last_.version = h.version;
  last_.bytes = total_bytes_;
  last_.buckets = h.buckets;
  options_.bucket_bytes = h.bucket_bytes;
  header_request_.reset();
}

// Checksums, in order, every bucket that has landed, while it is still in
// the cache and the next ones travel (verified_buckets_ counts them).
void WeightReceiver::checksum_landed_buckets() {
  const size_t buckets = checksums_.size();
  // [faults] plan "kill actor N while receiving": dead with a publication in flight
  // (its header taken, its buckets posted, not all of them landed).
  if (verified_buckets_ < buckets && runtime::fault_hooks().kill_while_receiving) ::raise(SIGKILL);
  while (verified_buckets_ < buckets && bucket_requests_[verified_buckets_]->test()) {
    const size_t b = verified_buckets_++;
    if (!refusal_.empty()) continue;
    const size_t begin = b * options_.bucket_bytes;
    const double started = now_s();
    landed_checksums_[b] =
        storage::crc32c(staging_->data() + begin, std::min(options_.bucket_bytes, total_bytes_ - begin));
    last_.checksum_s += now_s() - started;
  }
}

// Once the publisher's checksums have landed too: the first bucket whose
// bytes do not match refuses the version.
void WeightReceiver::verify_checksums() {
  const size_t buckets = checksums_.size();
  for (size_t b = 0; b < buckets && refusal_.empty(); ++b) {
    if (landed_checksums_[b] == checksums_[b]) continue;
    const size_t begin = b * options_.bucket_bytes;
    const size_t size = std::min(options_.bucket_bytes, total_bytes_ - begin);
    refuse("weights version " + std::to_string(incoming_version_) + ": bucket " + std::to_string(b) + " of " +
               std::to_string(buckets) + " failed its checksum (bytes " + std::to_string(begin) + ".." +
               std::to_string(begin + size) + "); version refused",
           true);
  }
}

bool WeightReceiver::poll() {
  if (closed_) return ready_version_ > current_version_;
  if (header_request_) {
    if (!header_request_->test()) return ready_version_ > current_version_;
    // The staging buffer still holds a verified version nobody applied yet:
    // receive the next one only after apply(), so what apply() takes is
    // never a mix of two versions. (The publisher waits meanwhile.)
    if (ready_version_ > current_version_) return true;
    start_buckets();
    if (closed_) return ready_version_ > current_version_;
  }
  if (incoming_version_ < 0) return ready_version_ > current_version_;
  checksum_landed_buckets();
  if (verified_buckets_ < checksums_.size() || !bucket_requests_.back()->test()) {
    if (now_s() - started_ > options_.timeout_s)
      throw comm::CommTimeout("receiving weights version " + std::to_string(incoming_version_) + " in " + comm_.name() +
                              " did not complete within " + std::to_string(options_.timeout_s) + " s (" +
                              std::to_string(verified_buckets_) + " of " + std::to_string(checksums_.size()) +
                              " buckets arrived; " +
                              first_unfinished(bucket_requests_).stall_report(options_.timeout_s) + ")");
    return ready_version_ > current_version_;
  }
  // Every collective of this version has completed: refuse it or make it ready.
  if (refusal_.empty()) verify_checksums();
  bucket_requests_.clear();
  incoming_version_ = -1;
  post_header();
  if (!refusal_.empty()) {
    if (refusal_corrupt_) throw CorruptVersionError(refusal_);
    throw SyncError(refusal_);
  }
  ready_version_ = last_.version;
  last_.seconds = now_s() - started_;
  telemetry::metrics().record("sync.verify_s", last_.checksum_s);
  telemetry::metrics().set("sync.receive_GB_per_s", last_.gigabytes_per_s());
  return ready_version_ > current_version_;
}

std::int64_t WeightReceiver::apply() {
  if (ready_version_ <= current_version_) return current_version_;
  if (rebind_) {
    std::swap(live_, staging_);
    rebind_(live_);
  } else {
    size_t at = 0;
    for (const WeightView& v : views_) {
      std::memcpy(v.data, staging_->data() + at, v.bytes);
      at += v.bytes;
    }
  }
  current_version_ = ready_version_;
  return current_version_;
}

bool WeightReceiver::wait_ready(double timeout_s) {
  const double deadline = now_s() + timeout_s;
  while (!poll()) {
    if (closed_) return false;
    if (now_s() > deadline)
      throw comm::CommTimeout("no new weights version arrived in " + comm_.name() + " within " +
                              std::to_string(timeout_s) + " s" +
                              (header_request_ ? " (" + header_request_->stall_report(timeout_s) + ")" : ""));
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return true;
}

}  // namespace moerl::sync
