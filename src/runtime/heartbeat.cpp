#include "moerl/runtime/heartbeat.h"

#include <chrono>
#include <cstdio>

#include "moerl/runtime/env_join.h"
#include "moerl/runtime/fault_tolerance.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/logging.h"
#include "moerl/runtime/lost_ranks.h"
#include "moerl/runtime/rank_layout.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::runtime {

void Heartbeat::encode(ByteWriter& w) const {
  w.put(rank);
  w.put_string(role);
  w.put(role_index);
  w.put_string(host);
  w.put(pid);
  w.put(sequence);
  w.put(weight_version);
  w.put(live_sessions);
  w.put(queue_depth);
}

Heartbeat Heartbeat::decode(ByteReader& r) {
  Heartbeat h;
  h.rank = r.get<std::int32_t>();
  h.role = r.get_string();
  h.role_index = r.get<std::int32_t>();
  h.host = r.get_string();
  h.pid = r.get<std::int64_t>();
  h.sequence = r.get<std::uint64_t>();
  h.weight_version = r.get<std::int64_t>();
  h.live_sessions = r.get<std::int32_t>();
  h.queue_depth = r.get<std::int32_t>();
  return h;
}

void CoordinatorBeat::encode(ByteWriter& w) const {
  w.put(sequence);
  w.put(step);
  w.put(version);
}

CoordinatorBeat CoordinatorBeat::decode(ByteReader& r) {
  CoordinatorBeat b;
  b.sequence = r.get<std::uint64_t>();
  b.step = r.get<std::int64_t>();
  b.version = r.get<std::int64_t>();
  return b;
}

void JobAbort::encode(ByteWriter& w) const {
  w.put(status);
  w.put_string(reason);
}

JobAbort JobAbort::decode(ByteReader& r) {
  JobAbort a;
  a.status = r.get<std::int32_t>();
  a.reason = r.get_string();
  return a;
}

HeartbeatThread::HeartbeatThread(Mailbox& mailbox, const RankLayout& layout, Heartbeat identity, Options options,
                                 std::function<void(const std::string&)> coordinator_lost)
    : mailbox_(mailbox),
      layout_(layout),
      identity_(std::move(identity)),
      options_(options),
      coordinator_lost_(std::move(coordinator_lost)) {
  if (options_.mode == Mode::ModeCoordinator)
    health_ = std::make_unique<RankHealth>(layout_, options_.timeout_s, monotonic_seconds());
  if (!options_.faults.empty())
    faults_ = std::make_unique<FaultInjector>(options_.faults, layout_, identity_.rank, monotonic_seconds());
  thread_ = std::thread([this] { run(); });
}

HeartbeatThread::~HeartbeatThread() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void HeartbeatThread::set_job_progress(std::int64_t step, std::int64_t published_version) {
  step_ = step;
  version_ = published_version;
}

std::vector<LostRank> HeartbeatThread::take_lost() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<LostRank> lost;
  lost.swap(lost_);
  return lost;
}

void HeartbeatThread::revive(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (health_) health_->revive(rank, monotonic_seconds());
}

std::optional<Heartbeat> HeartbeatThread::last_heartbeat(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!health_) return std::nullopt;
  const Heartbeat* last = health_->last(rank);
  return last ? std::optional<Heartbeat>(*last) : std::nullopt;
}

std::vector<HeartbeatThread::RankAge> HeartbeatThread::rank_ages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<RankAge> ages;
  if (!health_) return ages;
  const double now = monotonic_seconds();
  for (int rank = 1; rank < layout_.world_size(); ++rank)
    ages.push_back({rank, layout_.assignment(rank).role, now - health_->last_heard(rank), health_->is_lost(rank)});
  return ages;
}

void HeartbeatThread::run() {
  // Short ticks: a JobAbort or a silent rank is acted on within 20 ms of its deadline.
  while (!stop_) {
    try {
      tick(monotonic_seconds());
    } catch (const std::exception& error) {
      // One beat that could not go out is not a reason to stop beating.
      std::fprintf(stderr, "moerl: rank %d heartbeat: %s\n", identity_.rank, error.what());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void HeartbeatThread::tick(double now) {
  if (const auto abort = poll_job_abort()) {
    std::fprintf(stderr, "moerl: rank %d (%s %d) ends with the job: rank %d aborted it: %s\n", identity_.rank,
                 identity_.role.c_str(), identity_.role_index, abort->rank, abort->reason.c_str());
    std::fflush(stderr);
    end_this_rank(abort->status);
  }
  if (options_.mode == Mode::ModeMember) tick_member(now);
  if (options_.mode == Mode::ModeCoordinator) tick_coordinator(now);
  if (faults_) faults_->check(step_.load(), now);
}

void HeartbeatThread::tick_member(double now) {
  while (auto notice = mailbox_.try_receive<RankLost>(RankLayout::kCoordinatorRank)) {
    if (fault_tolerant_mpi()) fence(notice->second, identity_.host);  // (see Coordinator::on_rank_lost)
    if (lost_ranks().add(notice->second))
      std::fprintf(stderr, "moerl: rank %d (%s %d) learned that rank %d (%s %d) was lost: %s\n", identity_.rank,
                   identity_.role.c_str(), identity_.role_index, notice->second.rank, notice->second.role.c_str(),
                   notice->second.role_index, notice->second.why.c_str());
  }
  while (auto rejoined = mailbox_.try_receive<RankRejoined>(RankLayout::kCoordinatorRank)) {
    if (lost_ranks().rejoin(rejoined->second.rank))
      std::fprintf(stderr, "moerl: rank %d (%s %d) learned that rank %d rejoined the job (a new process)\n",
                   identity_.rank, identity_.role.c_str(), identity_.role_index, rejoined->second.rank);
  }
  while (auto beat = mailbox_.try_receive<CoordinatorBeat>(RankLayout::kCoordinatorRank)) {
    last_coordinator_beat_ = now;
    step_ = beat->second.step;
    version_ = beat->second.version;
  }
  if (now >= next_beat_) {
    Heartbeat h = identity_;
    h.sequence = ++identity_.sequence;
    h.weight_version = load_.weight_version.load();
    h.live_sessions = load_.live_sessions.load();
    h.queue_depth = load_.queue_depth.load();
    next_beat_ = now + options_.interval_s;
    mailbox_.send(RankLayout::kCoordinatorRank, h);
  }
  if (watching_ && last_coordinator_beat_ >= 0 && now - last_coordinator_beat_ > options_.timeout_s) {
    const std::string what = "learner 0 (rank 0) lost: no heartbeat from it for " +
                             std::to_string(static_cast<int>(now - last_coordinator_beat_)) +
                             " s ([cluster] heartbeat_timeout_s)";
    watching_ = false;
    if (coordinator_lost_) {
      coordinator_lost_(what);
    } else {
      abort_job(identity_.role + " " + std::to_string(identity_.role_index), what, kLostRankExitStatus);
    }
  }
}

void HeartbeatThread::tick_coordinator(double now) {
  std::vector<LostRank> lost;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (auto beat = mailbox_.try_receive<Heartbeat>()) health_->beat(beat->second, now);
    health_->published(version_.load(), now);
    lost = health_->check(now, mailbox_.failed_peers());
    for (const std::string& behind : health_->actors_behind(now)) {
      std::fprintf(stderr, "moerl: %s\n", behind.c_str());
      telemetry::metrics().add("coordinator.actors_behind");
    }
    lost_.insert(lost_.end(), lost.begin(), lost.end());
  }
  if (now < next_beat_) return;
  next_beat_ = now + options_.interval_s;
  CoordinatorBeat beat;
  beat.sequence = ++identity_.sequence;
  beat.step = step_.load();
  beat.version = version_.load();
  for (int rank = 0; rank < layout_.world_size(); ++rank) {
    if (rank == RankLayout::kCoordinatorRank) continue;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (health_->is_lost(rank)) continue;
    }
    try {
      mailbox_.send(rank, beat);
    } catch (const PeerLostError&) {
      // MPI knows it is dead; the next check declares it lost.
    }
  }
}

}  // namespace moerl::runtime
