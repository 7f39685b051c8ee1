#include "moerl/sync/sharded_weight_sync.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "moerl/core/check.h"
#include "moerl/runtime/mailbox.h"

namespace moerl::sync {
namespace {

// Channels of one member: the sum of their bytes and buckets, the slowest one's times.
template <typename Channels>
SyncStats combined(const Channels& channels) {
  SyncStats total;
  for (const auto& channel : channels) {
    const SyncStats& s = channel->last();
    total.version = std::max(total.version, s.version);
    total.bytes += s.bytes;
    total.buckets += s.buckets;
    total.seconds = std::max(total.seconds, s.seconds);
    total.blocking_s = std::max(total.blocking_s, s.blocking_s);
    total.checksum_s += s.checksum_s;
    total.copied_bytes += s.copied_bytes;
  }
  return total;
}

SyncOptions rooted_at_zero(SyncOptions options) {
  options.root = 0;  // the learner member is rank 0 of each of its channels
  return options;
}

}  // namespace

// ---------------------------------------------------------------- publisher

ShardedWeightPublisher::ShardedWeightPublisher(MPI_Comm comm, ExpertSyncLayout layout, int member,
                                               std::vector<ShardedWeightView> views, SyncOptions options)
    : channels_(std::make_unique<ExpertSyncChannels>(comm, layout, ExpertSyncSide::ExpertSyncLearner, member,
                                                     std::move(views), options.timeout_s)) {
  for (size_t c : channels_->mine())
    publishers_.push_back(std::make_unique<WeightPublisher>(channels_->communicator(c), channels_->channel_views(c),
                                                            rooted_at_zero(options)));
}

ShardedWeightPublisher::~ShardedWeightPublisher() = default;

void ShardedWeightPublisher::publish(std::int64_t version) {
  // Every channel's buckets are posted before this returns; they travel
  // together while the caller goes on.
  for (auto& publisher : publishers_) publisher->publish(version);
}

bool ShardedWeightPublisher::progress() {
  bool done = true;
  for (auto& publisher : publishers_) done = publisher->progress() && done;
  return done;
}

void ShardedWeightPublisher::finish() {
  for (auto& publisher : publishers_) publisher->finish();
}

bool ShardedWeightPublisher::in_flight() const {
  return std::any_of(publishers_.begin(), publishers_.end(), [](const auto& p) { return p->in_flight(); });
}

void ShardedWeightPublisher::close() {
  for (auto& publisher : publishers_) publisher->close();
}

void ShardedWeightPublisher::corrupt_next_publication(size_t channel, int bucket) {
  const auto& mine = channels_->mine();
  const auto it = std::find(mine.begin(), mine.end(), channel);
  MOERL_CHECK(it != mine.end(), "expert sync: this learner member does not publish channel " + std::to_string(channel));
  publishers_[static_cast<size_t>(it - mine.begin())]->corrupt_next_publication(bucket);
}

SyncStats ShardedWeightPublisher::last() const { return combined(publishers_); }

// ---------------------------------------------------------------- receiver

ShardedWeightReceiver::ShardedWeightReceiver(MPI_Comm comm, ExpertSyncLayout layout, int member,
                                             std::vector<ShardedWeightView> views, SyncOptions options)
    : channels_(std::make_unique<ExpertSyncChannels>(comm, layout, ExpertSyncSide::ExpertSyncActor, member,
                                                     std::move(views), options.timeout_s)) {
  for (size_t c : channels_->mine())
    receivers_.push_back(std::make_unique<WeightReceiver>(channels_->communicator(c), channels_->channel_views(c),
                                                          rooted_at_zero(options)));
}

ShardedWeightReceiver::~ShardedWeightReceiver() = default;

bool ShardedWeightReceiver::poll() {
  // Every channel is driven on every poll, also after one of them refused a
  // version: the others' collectives must go on matching their publishers'.
  std::string refusal;
  for (size_t i = 0; i < receivers_.size(); ++i) {
    WeightReceiver& receiver = *receivers_[i];
    try {
      receiver.poll();
    } catch (const CorruptVersionError& e) {
      const std::int64_t version = receiver.last().version;
      if (version > refused_version_ && refusal.empty())
        refusal = "channel '" + plan().channels()[channels()[i]].name + "': " + e.what();
      refused_version_ = std::max(refused_version_, version);
    }
  }
  discard_stale();
  if (!refusal.empty()) throw CorruptVersionError(refusal);
  return ready_version() > current_version_;
}

void ShardedWeightReceiver::discard_stale() {
  std::int64_t newest = -1;
  for (const auto& receiver : receivers_) newest = std::max(newest, receiver->ready_version());
  for (auto& receiver : receivers_) {
    const std::int64_t ready = receiver->ready_version();
    if (ready > receiver->current_version() && (ready <= refused_version_ || ready < newest)) receiver->discard_ready();
  }
}

std::int64_t ShardedWeightReceiver::ready_version() const {
  if (receivers_.empty()) return current_version_;
  const std::int64_t version = receivers_.front()->ready_version();
  for (const auto& receiver : receivers_)
    if (receiver->ready_version() != version || version <= receiver->current_version()) return current_version_;
  return version;
}

std::int64_t ShardedWeightReceiver::apply() {
  const std::int64_t version = ready_version();
  if (version <= current_version_) return current_version_;
  for (auto& receiver : receivers_) receiver->apply();
  current_version_ = version;
  return current_version_;
}

bool ShardedWeightReceiver::closed() const {
  const bool all_closed =
      std::all_of(receivers_.begin(), receivers_.end(), [](const auto& receiver) { return receiver->closed(); });
  return all_closed && ready_version() <= current_version_;
}

bool ShardedWeightReceiver::wait_ready(double timeout_s) {
  const double deadline = runtime::monotonic_seconds() + timeout_s;
  while (!poll()) {
    if (closed()) return false;
    if (runtime::monotonic_seconds() > deadline)
      throw comm::CommTimeout("no new weights version arrived on all " + std::to_string(receivers_.size()) +
                              " expert sync channels within " + std::to_string(timeout_s) + " s (current version " +
                              std::to_string(current_version_) + ")");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return true;
}

size_t ShardedWeightReceiver::bytes_per_version() const {
  size_t total = 0;
  for (size_t c : channels()) total += plan().channels()[c].bytes();
  return total;
}

SyncStats ShardedWeightReceiver::last() const { return combined(receivers_); }

}  // namespace moerl::sync
