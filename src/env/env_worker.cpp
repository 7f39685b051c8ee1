#include "moerl/env/env_worker.h"

#include <thread>

namespace moerl::env {

SessionHostOptions session_host_options(const config::Config& config, int compute_threads) {
  SessionHostOptions options;
  options.env = config.env;
  options.external = config.env_external;
  options.faults = config.faults;
  // Environment steps mostly wait (on processes, on I/O); a few threads per
  // core keep them overlapped without taking compute from the rank.
  options.threads = config.env.threads > 0 ? static_cast<int>(config.env.threads) : std::max(2, 2 * compute_threads);
  options.archive_dir = config.env.archive_dir.empty() ? config.run_directory() + "/archive/env" : config.env.archive_dir;
  return options;
}

EnvWorkerService::EnvWorkerService(SessionHost& host, runtime::Mailbox& mailbox, int coordinator_rank)
    : host_(host), mailbox_(mailbox), coordinator_(coordinator_rank) {}

int EnvWorkerService::serve_once(double max_wait_s) {
  bool received = false;
  while (auto message = mailbox_.try_receive<EnvRequestMessage>()) {
    message->second.request.client = message->first;
    host_.submit(std::move(message->second.request));
    received = true;
  }
  while (auto capacity = mailbox_.try_receive<EnvCapacityMessage>(coordinator_))
    host_.set_capacity(capacity->second.sessions);
  const std::vector<EnvReply> replies = received ? host_.poll() : host_.wait(max_wait_s);
  for (const EnvReply& reply : replies) mailbox_.send(reply.client, EnvReplyMessage{reply});
  return static_cast<int>(replies.size());
}

void EnvWorkerService::serve(const std::function<bool()>& should_stop) {
  while (!should_stop()) serve_once();
}

EnvClient::EnvClient(runtime::Mailbox& mailbox, std::vector<int> worker_ranks)
    : mailbox_(mailbox), workers_(std::move(worker_ranks)) {
  MOERL_CHECK(!workers_.empty(), "EnvClient needs at least one env worker rank");
}

int EnvClient::worker_of(std::uint64_t session) const {
  const auto moved = placement_.find(session);
  if (moved != placement_.end()) return moved->second;
  return workers_[session % workers_.size()];
}

std::uint64_t EnvClient::send(EnvRequest request, int worker) {
  request.request_id = next_request_++;
  mailbox_.send(worker, EnvRequestMessage{request});
  return request.request_id;
}

std::uint64_t EnvClient::open(std::uint64_t session, const TaskSpec& task) {
  EnvRequest r;
  r.kind = RequestKind::Open;
  r.session = session;
  r.task = task;
  return send(std::move(r), worker_of(session));
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
    throw runtime::TimeoutError("no reply from env workers (ranks " + ranks + ") within " +
                                std::to_string(timeout_s) + " s");
  }
}

}  // namespace moerl::env
