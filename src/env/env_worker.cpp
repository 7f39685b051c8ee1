#include "moerl/env/env_worker.h"

#include <spdlog/spdlog.h>

#include <thread>

#include "moerl/core/check.h"
#include "moerl/runtime/lost_ranks.h"

namespace moerl::env {

EnvWorkerService::EnvWorkerService(SessionHost& host, runtime::Mailbox& mailbox, int coordinator_rank)
    : host_(host), mailbox_(mailbox), coordinator_(coordinator_rank) {}

int EnvWorkerService::serve_once(double max_wait_s) {
  close_sessions_of_lost_actors();
  bool received = false;
  while (auto message = mailbox_.try_receive<EnvRequestMessage>()) {
    message->second.request.client = message->first;
    host_.submit(std::move(message->second.request));
    received = true;
  }
  while (auto capacity = mailbox_.try_receive<EnvCapacityMessage>(coordinator_))
    host_.set_capacity(capacity->second.sessions);
  const std::vector<EnvReply> replies = received ? host_.poll() : host_.wait(max_wait_s);
  for (const EnvReply& reply : replies) {
    try {
      mailbox_.send(reply.client, EnvReplyMessage{reply});
    } catch (const runtime::PeerLostError& error) {
      // The actor is gone; its sessions close when learner 0 says it was lost.
      // Said, so that a reply lost to a rank that lives on is seen in the log.
      spdlog::warn("env worker: the reply to {} request {} of session {} was not delivered: {}",
                   request_kind_name(reply.kind), reply.request_id, reply.session, error.what());
    }
  }
  return static_cast<int>(replies.size());
}

void EnvWorkerService::close_sessions_of_lost_actors() {
  const std::uint64_t epoch = runtime::lost_ranks().epoch();
  if (epoch == lost_epoch_) return;
  const std::vector<runtime::RankLost> lost = runtime::lost_ranks().all();
  for (size_t i = lost_epoch_; i < lost.size(); ++i) {
    const size_t closed = host_.close_sessions_of(lost[i].rank);
    if (closed > 0) spdlog::warn("env worker: closed {} sessions of lost rank {}", closed, lost[i].rank);
  }
  lost_epoch_ = epoch;
}

void EnvWorkerService::serve(const std::function<bool()>& should_stop) {
  while (!should_stop()) replies_sent_ += serve_once();
}

EnvClient::EnvClient(runtime::Mailbox& mailbox, std::vector<int> worker_ranks)
    : mailbox_(mailbox), workers_(std::move(worker_ranks)) {
  MOERL_CHECK(!workers_.empty(), "EnvClient needs at least one env worker rank");
}

int EnvClient::worker_of(std::uint64_t session) const {
  const auto moved = placement_.find(session);
  if (moved != placement_.end()) return moved->second;
  const int home = workers_[session % workers_.size()];
  if (!lost_.count(home)) return home;
  const int living = pick_living(session);
  return living >= 0 ? living : home;
}

void EnvClient::mark_lost(int rank) { lost_.insert(rank); }

std::vector<int> EnvClient::living_workers() const {
  std::vector<int> living;
  for (int w : workers_)
    if (!lost_.count(w)) living.push_back(w);
  return living;
}

int EnvClient::pick_living(std::uint64_t session) const {
  const std::vector<int> living = living_workers();
  return living.empty() ? -1 : living[session % living.size()];
}

std::uint64_t EnvClient::restore_on(std::uint64_t session, const std::vector<std::uint8_t>& snapshot, int worker_rank) {
  EnvRequest r;
  r.kind = RequestKind::Restore;
  r.session = session;
  r.snapshot = snapshot;
  placement_[session] = worker_rank;
  return send(std::move(r), worker_rank);
}

std::uint64_t EnvClient::send(EnvRequest request, int worker) {
  request.request_id = next_request_++;
  try {
    mailbox_.send(worker, EnvRequestMessage{request});
  } catch (const runtime::PeerLostError&) {
    // The request is lost with the worker; the owner restores the worker's
    // sessions elsewhere (take_newly_lost()), this one included.
    if (!lost_.count(worker)) newly_lost_.push_back(worker);
    lost_.insert(worker);
  }
  return request.request_id;
}

std::vector<int> EnvClient::take_newly_lost() {
  std::vector<int> lost;
  lost.swap(newly_lost_);
  return lost;
}

std::uint64_t EnvClient::open(std::uint64_t session, const TaskSpec& task) {
  EnvRequest r;
  r.kind = RequestKind::Open;
  r.session = session;
  r.task = task;
  const int worker = worker_of(session);
  // Opened away from its home worker (lost, or released): it stays where it
  // is, also once a new process fills the home's rank (mark_rejoined).
  if (worker != workers_[session % workers_.size()]) placement_[session] = worker;
  return send(std::move(r), worker);
}

std::uint64_t EnvClient::restore_from_archive_on(std::uint64_t session, const std::string& path,
                                                 const std::vector<std::string>& replay_after, int worker_rank) {
  EnvRequest r;
  r.kind = RequestKind::Restore;
  r.session = session;
  r.archive_path = path;
  r.replay_after = replay_after;
  placement_[session] = worker_rank;
  return send(std::move(r), worker_rank);
}

std::uint64_t EnvClient::open_on(std::uint64_t session, const TaskSpec& task, int worker_rank) {
  placement_[session] = worker_rank;
  return open(session, task);
}

std::uint64_t EnvClient::step(std::uint64_t session, const std::string& action) {
  EnvRequest r;
  r.kind = RequestKind::Step;
  r.session = session;
  r.action = action;
  return send(std::move(r), worker_of(session));
}

std::uint64_t EnvClient::close(std::uint64_t session) {
  EnvRequest r;
  r.kind = RequestKind::Close;
  r.session = session;
  const int worker = worker_of(session);
  placement_.erase(session);
  return send(std::move(r), worker);
}

std::uint64_t EnvClient::snapshot(std::uint64_t session, bool to_archive) {
  EnvRequest r;
  r.kind = RequestKind::Snapshot;
  r.session = session;
  r.to_archive = to_archive;
  return send(std::move(r), worker_of(session));
}

std::uint64_t EnvClient::restore(std::uint64_t session, const std::vector<std::uint8_t>& snapshot, int worker_index) {
  EnvRequest r;
  r.kind = RequestKind::Restore;
  r.session = session;
  r.snapshot = snapshot;
  const int worker = workers_.at(static_cast<size_t>(worker_index));
  placement_[session] = worker;
  return send(std::move(r), worker);
}

std::uint64_t EnvClient::restore_from_archive(std::uint64_t session, const std::string& path, int worker_index) {
  EnvRequest r;
  r.kind = RequestKind::Restore;
  r.session = session;
  r.archive_path = path;
  const int worker = workers_.at(static_cast<size_t>(worker_index));
  placement_[session] = worker;
  return send(std::move(r), worker);
}

std::optional<EnvReply> EnvClient::poll() {
  if (auto message = mailbox_.try_receive<EnvReplyMessage>()) return std::move(message->second.reply);
  return std::nullopt;
}

EnvReply EnvClient::wait(double timeout_s) {
  std::string ranks;
  for (int w : workers_) ranks += (ranks.empty() ? "" : ", ") + std::to_string(w);
  try {
    return mailbox_.receive<EnvReplyMessage>(MPI_ANY_SOURCE, timeout_s).second.reply;
  } catch (const runtime::TimeoutError&) {
    throw runtime::TimeoutError("no reply from env workers (ranks " + ranks + ") within " + std::to_string(timeout_s) +
                                " s");
  }
}

}  // namespace moerl::env
