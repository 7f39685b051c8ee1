// `mpirun -np N moerl bench e2e --config F [--set k=v ...] [--init base.pt] [--steps K] [--repeat R]`:
// the real training loop (every rank in its [cluster] role, as `moerl train`)
// for K steps in asynchronous mode, then K steps in synchronous mode, same
// config and ranks, in one job; then the weight publication of this model on
// the sync communicator against a plain MPI_Bcast of the same bytes there.
//
// Throughput is read from learner 0's metrics file (one JSON line per step):
// the window runs from the end of step 1 to the end of step K, so start-up and
// the first (warm-up) step are left out. Each phase writes to its own run
// directory (<run.name>-e2e-async, -e2e-sync; emptied first), has no
// evaluation and no periodic checkpoints, and never resumes the other.
//
// Where a step's time goes on learner 0: the update (forward, backward,
// optimizer), the publication call, and the rest, which is waiting for a
// batch of trajectories (plus step bookkeeping). On the actors: the fraction
// of the window spent in decode steps (the rest is waiting for work, for the
// env workers or for weights), from their rollout.step_latency_s; actor
// metrics arrive every 0.25 s, so short windows read them coarsely.
//
// What the ratio can be: synchronous mode takes generate + update per step,
// asynchronous mode max(generate, update) when the two have a core each, so
// the ratio is at most (G + U) / max(G, U) (2x when balanced), and it needs
// spare cores: on 2 cores, 1 learner + 1 actor + 1 env worker
// (--set cluster.actors=1) can overlap; with 2 actors the three compute ranks
// already share the cores in synchronous mode's generation, which leaves
// asynchronous mode little to gain. Asynchronous mode stays one step ahead at
// most with max_staleness = 1, so a step's generation must fit in the
// previous step's update to hide it completely.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <thread>

#include "bench_args.h"
#include "moerl/bench/registry.h"
#include "moerl/comm/mpi_communicator.h"
#include "moerl/config/config.h"
#include "moerl/core/json_value.h"
#include "moerl/app/rank_device.h"
#include "moerl/app/roles.h"
#include "moerl/model/policy.h"
#include "moerl/runtime/job_control.h"
#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/mpi_session.h"
#include "moerl/runtime/world.h"
#include "moerl/setup/config_loading.h"
#include "moerl/sync/module_weights.h"
#include "moerl/sync/weight_sync.h"
#include "moerl/telemetry/metrics.h"

namespace {

using moerl::JsonValue;

struct E2eArgs {
  moerl::bench::PolicyBenchArgs run;  // --config, --set, --init
  std::int64_t steps = 10;
  int repeat = 1;  // phases alternate async, sync, async, ...; the best of each mode counts
};

E2eArgs parse_args(const std::vector<std::string>& args, bool quick) {
  E2eArgs out;
  if (quick) out.steps = 3;
  const std::string who = "bench e2e";
  out.run = moerl::bench::parse_policy_bench_args(
      args, who, "--config F, --set section.key=value, --init FILE, --steps K, --repeat R",
      [&](const std::string& option, const auto& value) {
        if (option == "--steps") {
          out.steps = moerl::bench::whole_number(value(), who, option);
        } else if (option == "--repeat") {
          out.repeat = static_cast<int>(moerl::bench::whole_number(value(), who, option));
        } else {
          return false;
        }
        return true;
      },
      /*default_config=*/"");
  if (out.run.config_path.empty())
    throw moerl::Error("bench e2e needs --config F: mpirun -np 4 moerl bench e2e --config configs/quickstart.toml");
  if (out.repeat < 1) throw moerl::Error("bench e2e: --repeat must be at least 1");
  if (out.steps < 2) throw moerl::Error("bench e2e: --steps must be at least 2 (the first step is warm-up)");
  return out;
}

double now_s() { return moerl::runtime::monotonic_seconds(); }

// One counter, gauge or histogram of a metrics line (0 when absent).
double counter(const JsonValue& body, const std::string& name) {
  const std::optional<JsonValue> counters = body.find("counters");
  const std::optional<JsonValue> v = counters ? counters->find(name) : std::nullopt;
  return v ? v->as_number() : 0.0;
}

// Sum and count of a histogram, so that a window's mean is a difference.
std::pair<double, double> histogram_sum_count(const JsonValue& body, const std::string& name) {
  const std::optional<JsonValue> histograms = body.find("histograms");
  const std::optional<JsonValue> h = histograms ? histograms->find(name) : std::nullopt;
  if (!h) return {0.0, 0.0};
  const double count = h->at("count").as_number();
  return {h->at("mean").as_number() * count, count};
}

std::optional<JsonValue> role_body(const JsonValue& line, const std::string& role) {
  return line.at("roles").find(role);
}

JsonValue rank0_body(const JsonValue& line) {
  for (JsonValue r : line.at("ranks").as_array())
    if (r.at("rank").as_number() == 0) return r;
  throw moerl::Error("bench e2e: a metrics line without learner 0");
}

struct PhaseResult {
  double steps_per_s = 0, trained_tokens_per_s = 0, generated_tokens_per_s = 0;
  double step_s = 0, update_s = 0, publish_call_s = 0, wait_s = 0, receive_s = 0;
  double actor_busy = 0;  // fraction of the window an actor spent in decode steps
  double dropped_groups = 0, staleness = 0, wall_s = 0;
};

// Mean of a histogram over the window between two metrics lines.
double window_mean(const std::optional<JsonValue>& first, const std::optional<JsonValue>& last,
                   const std::string& name) {
  if (!first || !last) return 0.0;
  const auto [s1, c1] = histogram_sum_count(*first, name);
  const auto [s2, c2] = histogram_sum_count(*last, name);
  return c2 > c1 ? (s2 - s1) / (c2 - c1) : 0.0;
}

PhaseResult read_phase(const std::string& metrics_path, std::int64_t steps, double wall_s) {
  std::ifstream file(metrics_path);
  if (!file) throw moerl::Error("bench e2e: no metrics file '" + metrics_path + "' after the run");
  std::vector<JsonValue> lines;
  for (std::string text; std::getline(file, text);)
    if (!text.empty()) lines.push_back(JsonValue::parse(text));
  if (static_cast<std::int64_t>(lines.size()) < steps)
    throw moerl::Error("bench e2e: " + metrics_path + " holds " + std::to_string(lines.size()) + " steps of " +
                       std::to_string(steps) + " (the run stopped early?)");
  const JsonValue& first = lines.front();
  const JsonValue& last = lines[static_cast<size_t>(steps - 1)];
  const double window = (last.at("time_ms").as_number() - first.at("time_ms").as_number()) / 1e3;
  const double intervals = static_cast<double>(steps - 1);
  PhaseResult r;
  r.wall_s = wall_s;
  r.step_s = window / intervals;
  r.steps_per_s = intervals / window;
  const JsonValue l1 = rank0_body(first);
  const JsonValue l2 = rank0_body(last);
  r.trained_tokens_per_s = (counter(l2, "learner.generated_tokens") - counter(l1, "learner.generated_tokens")) / window;
  r.update_s = window_mean(l1, l2, "learner.update_s");
  r.publish_call_s = window_mean(l1, l2, "sync.publish_s");
  r.wait_s = std::max(0.0, r.step_s - r.update_s - r.publish_call_s);
  r.dropped_groups = counter(l2, "learner.dropped_groups") - counter(l1, "learner.dropped_groups");
  const std::optional<JsonValue> gauges = l2.find("gauges");
  const std::optional<JsonValue> staleness = gauges ? gauges->find("learner.staleness_mean") : std::nullopt;
  r.staleness = staleness ? staleness->as_number() : 0.0;
  const std::optional<JsonValue> a1 = role_body(first, "actor");
  const std::optional<JsonValue> a2 = role_body(last, "actor");
  if (a1 && a2) {
    r.generated_tokens_per_s =
        (counter(*a2, "rollout.generated_tokens") - counter(*a1, "rollout.generated_tokens")) / window;
    r.receive_s = window_mean(a1, a2, "sync.receive_s");
    const double actors = std::max(1.0, a2->at("ranks").as_number());
    const double decoding = histogram_sum_count(*a2, "rollout.step_latency_s").first -
                            histogram_sum_count(*a1, "rollout.step_latency_s").first;
    r.actor_busy = decoding / actors / window;
  }
  return r;
}

moerl::config::Config phase_config(const moerl::config::Config& base, bool asynchronous, std::int64_t steps) {
  moerl::config::Config c = base;
  c.run.name = base.run.name + (asynchronous ? "-e2e-async" : "-e2e-sync");
  c.sync.asynchronous = asynchronous;
  c.optim.total_steps = steps;
  c.rollout.eval_episodes = 0;
  c.checkpoint.every_steps = 0;
  c.telemetry.metrics_interval_s = std::min(c.telemetry.metrics_interval_s, 0.25);
  return c;
}

// Every rank runs its role for one phase; learner 0 returns the result.
PhaseResult run_phase(const moerl::config::Config& config, const std::string& init_path, std::int64_t steps) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::filesystem::remove_all(config.run_directory());
  MPI_Barrier(MPI_COMM_WORLD);
  double wall = 0;
  {
    moerl::runtime::World world(config, MPI_COMM_WORLD);
    moerl::telemetry::metrics().set_identity(world.rank(), moerl::runtime::role_name(world.role()));
    torch::set_num_threads(world.compute_threads());  // as `moerl train` does
    moerl::runtime::Mailbox mailbox(world.message_comm(), config.cluster.message_timeout_s);
    moerl::runtime::StopCoordinator stop(mailbox);
    MPI_Barrier(MPI_COMM_WORLD);
    const double started = now_s();
    const moerl::app::RankDevice device = moerl::app::resolve_rank_device(config, world);
    if (!device.error.empty()) throw moerl::Error("bench e2e: " + device.error);
    const int status = moerl::app::run_role(config, world, mailbox, stop, device.device, init_path, "");
    if (status != 0)
      throw moerl::Error("bench e2e: rank " + std::to_string(rank) + " ended its role with " + std::to_string(status));
    wall = now_s() - started;
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (rank != 0) return {};
  return read_phase(config.run_directory() + "/" + config.telemetry.metrics_file, steps, wall);
}

// A world barrier that sleeps between tests: ranks outside the sync group
// must not spin on a core the measured ranks need (2 cores, 4 ranks here).
void polite_world_barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

struct SyncResult {
  double bytes = 0, publish_s = 0, bcast_s = 0;
};

// Learner 0 publishes the model's weights to the actors as in training
// (snapshot, buckets, checksums, fence) and, on the same communicator, a
// plain MPI_Bcast sends the same number of bytes; best of `repetitions`,
// slowest rank. Ranks outside the sync group wait at the world barrier.
SyncResult measure_sync(const moerl::config::Config& config, int repetitions) {
  SyncResult result;
  moerl::runtime::World world(config, MPI_COMM_WORLD);
  const MPI_Comm sync_comm = world.sync_comm();
  if (sync_comm != MPI_COMM_NULL) {
    moerl::model::Policy policy(config.model, config.moe);
    const auto views = moerl::sync::module_weight_views(*policy);
    size_t total = 0;
    for (const auto& v : views) total += v.bytes;
    result.bytes = static_cast<double>(total);
    moerl::comm::MpiCommunicator comm(sync_comm, "weight-sync group");
    const auto options = moerl::sync::sync_options(config.sync, config.cluster.message_timeout_s);
    std::unique_ptr<moerl::sync::WeightPublisher> publisher;
    std::unique_ptr<moerl::sync::WeightReceiver> receiver;
    if (comm.rank() == 0) {
      publisher = std::make_unique<moerl::sync::WeightPublisher>(comm, views, options);
    } else {
      receiver = std::make_unique<moerl::sync::WeightReceiver>(comm, views, options);
    }
    std::vector<std::uint8_t> plain(total);
    auto slowest = [&](double s) {
      double max = 0;
      MPI_Allreduce(&s, &max, 1, MPI_DOUBLE, MPI_MAX, sync_comm);
      return max;
    };
    result.publish_s = result.bcast_s = 1e30;
    for (int r = 0; r < repetitions; ++r) {
      MPI_Barrier(sync_comm);
      double t = now_s();
      if (publisher) {
        publisher->publish(r + 1);
        publisher->finish();
      } else {
        receiver->wait_ready(config.cluster.message_timeout_s);
        receiver->apply();
      }
      result.publish_s = std::min(result.publish_s, slowest(now_s() - t));
      MPI_Barrier(sync_comm);
      t = now_s();
      for (size_t at = 0; at < total; at += INT_MAX / 2)
        MPI_Bcast(plain.data() + at, static_cast<int>(std::min<size_t>(INT_MAX / 2, total - at)), MPI_BYTE, 0,
                  sync_comm);
      result.bcast_s = std::min(result.bcast_s, slowest(now_s() - t));
    }
    if (publisher) publisher->close();
    while (receiver && !receiver->closed()) receiver->poll();
  }
  polite_world_barrier();
  return result;
}

moerl::bench::BenchCase phase_case(const std::string& name, const PhaseResult& r, bool asynchronous,
                                   const PhaseResult& baseline, int repeat) {
  moerl::bench::BenchCase c;
  c.name = name;
  c.params = {{"asynchronous", asynchronous}, {"repeat", std::int64_t{repeat}}};
  auto metrics = [](const PhaseResult& p) {
    return std::map<std::string, double>{{"steps_per_s", p.steps_per_s},
                                         {"trained_tokens_per_s", p.trained_tokens_per_s},
                                         {"generated_tokens_per_s", p.generated_tokens_per_s},
                                         {"step_s", p.step_s},
                                         {"update_s", p.update_s},
                                         {"publish_call_s", p.publish_call_s},
                                         {"learner_wait_s", p.wait_s},
                                         {"actor_receive_s", p.receive_s},
                                         {"actor_busy_fraction", p.actor_busy},
                                         {"dropped_groups", p.dropped_groups},
                                         {"staleness_mean", p.staleness}};
  };
  c.metrics = metrics(r);
  c.baseline = metrics(baseline);
  c.ratio_metric = "steps_per_s";
  return c;
}

moerl::bench::BenchReport run(const moerl::bench::BenchOptions& options) {
  const auto session = moerl::runtime::start_mpi_unless_running();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const E2eArgs args = parse_args(options.args, options.quick);
  const moerl::config::Config base = moerl::setup::load_config_file(args.run.config_path, args.run.overrides);
  moerl::config::check_world_size(base, size);

  moerl::bench::BenchReport report;
  report.quiet = rank != 0;
  // A rank that fails ends the whole job with its reason, as `moerl train` does.
  PhaseResult async_result, sync_result;
  SyncResult sync;
  try {
    // Alternating the modes spreads a shared machine's changing load over both.
    for (int r = 0; r < args.repeat; ++r) {
      const PhaseResult a = run_phase(phase_config(base, true, args.steps), args.run.init_path, args.steps);
      const PhaseResult b = run_phase(phase_config(base, false, args.steps), args.run.init_path, args.steps);
      if (a.steps_per_s > async_result.steps_per_s) async_result = a;
      if (b.steps_per_s > sync_result.steps_per_s) sync_result = b;
    }
    sync = measure_sync(base, options.quick ? 2 : 10);
  } catch (const std::exception& error) {
    moerl::runtime::abort_job("bench e2e rank " + std::to_string(rank), error.what());
  }
  if (rank != 0) return report;
  report.cases.push_back(phase_case("async_vs_sync", async_result, true, sync_result, args.repeat));
  moerl::bench::BenchCase tokens;
  tokens.name = "trained_tokens";
  tokens.params = {{"steps", args.steps}, {"ranks", std::int64_t{size}}};
  tokens.metrics = {{"tokens_per_s", async_result.trained_tokens_per_s}};
  tokens.baseline = {{"tokens_per_s", sync_result.trained_tokens_per_s}};
  tokens.ratio_metric = "tokens_per_s";
  report.cases.push_back(tokens);
  moerl::bench::BenchCase s;
  s.name = "weight_sync";
  s.params = {{"bytes", static_cast<std::int64_t>(sync.bytes)},
              {"bucket_bytes", static_cast<std::int64_t>(base.sync.bucket_mb) << 20}};
  s.metrics = {{"GB_per_s", sync.bytes / sync.publish_s / 1e9}, {"seconds", sync.publish_s}};
  s.baseline = {{"GB_per_s", sync.bytes / sync.bcast_s / 1e9}, {"seconds", sync.bcast_s}};
  s.ratio_metric = "GB_per_s";
  report.cases.push_back(s);
  return report;
}

}  // namespace

MOERL_BENCHMARK(
    "e2e",
    "RL loop steps/s and tokens/s, asynchronous vs synchronous, plus weight-sync GB/s vs plain "
    "MPI_Bcast; mpirun -np N moerl bench e2e --config F [--set k=v] [--init base.pt] [--steps K] [--repeat R]",
    run);
