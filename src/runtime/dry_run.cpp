#include "moerl/runtime/dry_run.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <set>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "moerl/runtime/metrics_report.h"
#include "moerl/telemetry/metrics_aggregator.h"
#include "moerl/telemetry/metrics_file.h"

namespace moerl::runtime {
namespace {

constexpr int kCoordinator = RankLayout::kCoordinatorRank;

// [faults] hooks: a rank that fails or stops answering, for the tests that
// prove neither hangs the job.
void inject_faults(const config::Config& config, const World& world) {
  if (config.faults.fail_rank == world.rank())
    throw Error("injected failure ([faults] fail_rank = " + std::to_string(world.rank()) + ")");
  if (config.faults.hang_rank == world.rank()) {
    spdlog::warn("injected hang ([faults] hang_rank = {}): this rank stops answering", world.rank());
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

// "3 (env_worker 0), 5 (actor 2)": the ranks a stall report names.
std::string describe_ranks(const std::set<int>& ranks, const RankLayout& layout) {
  std::string text;
  for (int rank : ranks) {
    const RankAssignment a = layout.assignment(rank);
    if (!text.empty()) text += ", ";
    text += std::to_string(rank) + " (" + role_name(a.role) + " " + std::to_string(a.index) + ")";
  }
  return text;
}

void check_in(const config::Config& config, const World& world, Mailbox& mailbox, DryRunResult& result) {
  const std::uint64_t fingerprint = config::config_fingerprint(config);
  if (world.is_coordinator()) {
    for (int rank = 1; rank < world.size(); ++rank) mailbox.send(rank, Hello{config.run.name, fingerprint});
    result.ranks.push_back({world.rank(), role_name(world.role()), world.role_index(), world.placement_host(),
                            static_cast<std::int64_t>(getpid()), world.compute_threads()});
    std::set<int> missing;
    for (int rank = 1; rank < world.size(); ++rank) missing.insert(rank);
    while (!missing.empty()) {
      std::pair<int, HelloReply> received;
      try {
        received = mailbox.receive<HelloReply>(MPI_ANY_SOURCE);
      } catch (const TimeoutError&) {
        std::ostringstream out;
        out << (missing.size() == 1 ? "rank " : "ranks ") << describe_ranks(missing, world.layout())
            << " did not check in with learner 0 within " << mailbox.timeout_s() << " s ([cluster] message_timeout_s)";
        throw TimeoutError(out.str());
      }
      auto& [source, reply] = received;
      if (reply.config_hash != fingerprint)
        throw Error("rank " + std::to_string(source) +
                    " resolved a different configuration than learner 0 (mismatched file or "
                    "--set options across ranks)");
      if (reply.rank != source)
        throw MessageError("HelloReply from rank " + std::to_string(source) + " claims rank " +
                           std::to_string(reply.rank));
      missing.erase(source);
      result.ranks.push_back({reply.rank, reply.role, reply.role_index, reply.hostname, reply.pid, reply.threads});
    }
    std::sort(result.ranks.begin(), result.ranks.end(),
              [](const RankReport& a, const RankReport& b) { return a.rank < b.rank; });
  } else {
    auto [source, hello] = mailbox.receive<Hello>(kCoordinator);
    if (hello.config_hash != fingerprint) throw Error("learner 0 resolved a different configuration than this rank");
    mailbox.send(kCoordinator,
                 HelloReply{world.rank(), role_name(world.role()), world.role_index(), world.placement_host(),
                            static_cast<std::int64_t>(getpid()), world.compute_threads(), fingerprint});
  }
  telemetry::metrics().add("runtime.messages_sent", world.is_coordinator() ? world.size() - 1 : 1);
}

// Ranks other than learner 0 wait twice the message timeout for their peers:
// when a rank stalls, learner 0 notices first and its report names the
// ranks that did not arrive, instead of a bystander's "no Ping from rank 0".
double peer_wait_s(const Mailbox& mailbox) { return 2 * mailbox.timeout_s(); }

// Every ordered pair of ranks exchanges a Ping and a Pong. Pings are small,
// so MPI delivers them eagerly and sending all before receiving cannot block.
void ping_everyone(const World& world, Mailbox& mailbox) {
  for (int peer = 0; peer < world.size(); ++peer)
    if (peer != world.rank()) mailbox.send(peer, Ping{static_cast<std::uint64_t>(peer), monotonic_seconds()});
  for (int peer = 0; peer < world.size(); ++peer) {
    if (peer == world.rank()) continue;
    auto [source, ping] = mailbox.receive<Ping>(peer, peer_wait_s(mailbox));
    mailbox.send(source, Pong{ping.sequence, ping.sent_at_s});
  }
  for (int peer = 0; peer < world.size(); ++peer) {
    if (peer == world.rank()) continue;
    auto [source, pong] = mailbox.receive<Pong>(peer, peer_wait_s(mailbox));
    if (pong.sequence != static_cast<std::uint64_t>(source))
      throw MessageError("Pong from rank " + std::to_string(source) + " echoes sequence " +
                         std::to_string(pong.sequence));
    telemetry::metrics().record("runtime.ping_round_trip_s", monotonic_seconds() - pong.ping_sent_at_s);
  }
  telemetry::metrics().add("runtime.messages_sent", 2.0 * (world.size() - 1));
}

void collect_metrics(const config::Config& config, const World& world, Mailbox& mailbox, DryRunResult& result) {
  if (!world.is_coordinator()) {
    mailbox.send(kCoordinator, MetricsReport{telemetry::metrics().snapshot()});
    return;
  }
  telemetry::MetricsAggregator aggregator;
  aggregator.update(telemetry::metrics().snapshot());
  for (int i = 1; i < world.size(); ++i) {
    auto [source, report] = mailbox.receive<MetricsReport>(MPI_ANY_SOURCE);
    if (report.snapshot.rank != source)
      throw MessageError("MetricsReport from rank " + std::to_string(source) + " claims rank " +
                         std::to_string(report.snapshot.rank));
    aggregator.update(report.snapshot);
  }
  for (const auto& [role, aggregate] : aggregator.by_role()) {
    if (auto it = aggregate.histograms.find("runtime.ping_round_trip_s"); it != aggregate.histograms.end())
      result.ping_round_trip_s.merge(it->second);
    if (auto it = aggregate.counters.find("runtime.messages_sent"); it != aggregate.counters.end())
      result.messages_sent += static_cast<std::int64_t>(it->second);
  }
  result.metrics_path = config.metrics_path();
  telemetry::JsonLinesFile(result.metrics_path).append(aggregator.json_line(0));
}

}  // namespace

DryRunResult run_dry_run(const config::Config& config, const World& world, Mailbox& mailbox) {
  const double started = monotonic_seconds();
  DryRunResult result;
  spdlog::info("{} on {} (pid {}), {} compute threads", world.role_label(), world.hostname(),
               static_cast<long>(getpid()), world.compute_threads());
  inject_faults(config, world);
  check_in(config, world, mailbox, result);
  spdlog::debug("checked in with learner 0");
  ping_everyone(world, mailbox);
  spdlog::debug("pinged {} peers", world.size() - 1);
  collect_metrics(config, world, mailbox, result);
  // Everyone stays until learner 0 has written its results, then all leave together.
  if (world.is_coordinator()) {
    for (int rank = 1; rank < world.size(); ++rank) mailbox.send(rank, Stop{"dry run complete", {}});
  } else {
    mailbox.receive<Stop>(kCoordinator, peer_wait_s(mailbox));
  }
  result.wall_s = monotonic_seconds() - started;
  return result;
}

std::string format_plan(const config::Config& config, const RankLayout& layout, const DryRunResult& result) {
  std::set<std::string> hosts;
  for (const RankReport& r : result.ranks) hosts.insert(r.hostname);
  std::ostringstream out;
  out << "moerl dry run: run '" << config.run.name << "', " << layout.world_size() << " ranks on " << hosts.size()
      << (hosts.size() == 1 ? " host" : " hosts") << "\n\n";
  out << std::left << std::setw(6) << "rank" << std::setw(18) << "role" << std::setw(24) << "host" << std::setw(10)
      << "pid"
      << "threads\n";
  for (const RankReport& r : result.ranks) {
    out << std::left << std::setw(6) << r.rank << std::setw(18) << (r.role + " " + std::to_string(r.role_index))
        << std::setw(24) << r.hostname << std::setw(10) << r.pid << r.threads << "\n";
  }
  auto list = [&layout](Role role) {
    std::ostringstream s;
    const auto ranks = layout.ranks_of(role);
    if (ranks.empty()) return std::string("none");
    s << (ranks.size() > 1 ? "ranks " : "rank ") << ranks.front();
    if (ranks.size() > 1) s << "-" << ranks.back();
    return s.str();
  };
  out << "\nroles: learners " << list(Role::Learner) << "; actors " << list(Role::Actor) << "; env workers "
      << list(Role::EnvWorker) << "; standby actors " << list(Role::StandbyActor) << "\n";
  out << "weight sync group: learner 0 + " << layout.count(Role::Actor) << " actors + "
      << layout.count(Role::StandbyActor) << " standby\n";
  const auto& m = config.model;
  const auto& e = config.moe;
  out << "model: d_model " << m.d_model << ", " << m.num_layers << " layers, " << m.num_heads << " heads ("
      << m.num_kv_heads << " kv), vocab " << m.vocab_size;
  if (e.enabled) {
    out << "; MoE " << e.num_experts << " experts, top-" << e.top_k;
    if (config.rollout.moe_top_k != 0 && config.rollout.moe_top_k != e.top_k)
      out << " (rollouts top-" << config.rollout.moe_top_k << ")";
    out << ", d_expert " << e.d_expert;
    if (e.shared_experts) out << ", " << e.shared_experts << " shared";
  }
  out << "\n";
  std::ostringstream latency;
  latency << std::fixed << std::setprecision(3) << "p50 " << result.ping_round_trip_s.quantile(0.5) * 1e3 << " ms, p99 "
          << result.ping_round_trip_s.quantile(0.99) * 1e3 << " ms";
  out << "messages: " << result.messages_sent << " exchanged, every pair of ranks pinged ("
      << result.ping_round_trip_s.count() << " round trips: " << latency.str() << ")\n";
  out << "metrics: " << result.metrics_path << "\n";
  out << "dry run complete in " << std::fixed << std::setprecision(2) << result.wall_s << " s\n";
  return out.str();
}

}  // namespace moerl::runtime
