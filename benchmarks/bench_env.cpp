// `moerl bench env` (also `moerl env bench`): environment steps per second
// for each built-in family with many sessions on one SessionHost (the env
// worker's engine: thread pool, per-step deadlines, retry bookkeeping),
// against stepping the same sessions directly in one loop (no host) in the
// same run. The actions are the scripted expert's, recorded beforehand, so
// both sides do the same environment work.

#include <algorithm>
#include <chrono>

#include "moerl/bench/registry.h"
#include "moerl/env/session_host.h"
#include "moerl/env/task_family.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Episode {
  moerl::env::TaskSpec task;
  std::vector<std::string> actions;
};

std::vector<Episode> record_episodes(const std::string& family, int sessions, int difficulty) {
  std::vector<Episode> episodes;
  for (int s = 0; s < sessions; ++s) {
    Episode e;
    e.task.family = family;
    e.task.difficulty = difficulty;
    e.task.seed = 1000 + static_cast<std::uint64_t>(s);
    auto env = moerl::env::make_builtin_environment(family);
    env->open(e.task);
    for (std::uint64_t k = 0; !env->done(); ++k) {
      e.actions.push_back(env->expert_action(0.1, e.task.seed * 7919 + k));
      env->step(e.actions.back());
    }
    episodes.push_back(std::move(e));
  }
  return episodes;
}

double direct_seconds(const std::vector<Episode>& episodes) {
  const auto start = Clock::now();
  for (const Episode& e : episodes) {
    auto env = moerl::env::make_builtin_environment(e.task.family);
    env->open(e.task);
    for (const std::string& a : e.actions) env->step(a);
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double host_seconds(const std::vector<Episode>& episodes, int threads) {
  moerl::env::SessionHostOptions options;
  options.threads = threads;
  options.env.sessions_per_worker = static_cast<std::int64_t>(episodes.size());
  moerl::env::SessionHost host(options);
  std::vector<size_t> next(episodes.size(), 0);
  size_t open_sessions = episodes.size();
  const auto start = Clock::now();
  std::uint64_t request = 0;
  for (size_t s = 0; s < episodes.size(); ++s) {
    moerl::env::EnvRequest r;
    r.kind = moerl::env::RequestKind::Open;
    r.session = s;
    r.request_id = ++request;
    r.task = episodes[s].task;
    host.submit(r);
  }
  while (open_sessions > 0) {
    for (const moerl::env::EnvReply& reply : host.wait(1.0)) {
      const size_t s = reply.session;
      if (reply.kind == moerl::env::RequestKind::Close) {
        --open_sessions;
        continue;
      }
      moerl::env::EnvRequest r;
      r.session = s;
      r.request_id = ++request;
      if (next[s] < episodes[s].actions.size()) {
        r.kind = moerl::env::RequestKind::Step;
        r.action = episodes[s].actions[next[s]++];
      } else {
        r.kind = moerl::env::RequestKind::Close;
      }
      host.submit(r);
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

moerl::bench::BenchReport run(const moerl::bench::BenchOptions& options) {
  moerl::bench::BenchReport report;
  const int sessions = options.quick ? 16 : 256;
  const std::vector<int> thread_counts = options.quick ? std::vector<int>{2} : std::vector<int>{1, 4};
  for (const moerl::env::TaskFamily& family : moerl::env::builtin_families()) {
    const int difficulty = std::min(3, family.max_difficulty);
    const auto episodes = record_episodes(family.name, sessions, difficulty);
    double steps = 0;
    for (const Episode& e : episodes) steps += static_cast<double>(e.actions.size());
    // Best of several runs: these are sub-second timings on a shared machine.
    const int repetitions = options.quick ? 1 : 5;
    double direct = 1e30;
    for (int r = 0; r < repetitions; ++r) direct = std::min(direct, direct_seconds(episodes));
    for (const int threads : thread_counts) {
      double hosted = 1e30;
      for (int r = 0; r < repetitions; ++r) hosted = std::min(hosted, host_seconds(episodes, threads));
      moerl::bench::BenchCase c;
      c.name = family.name;
      c.params = {{"sessions", std::int64_t{sessions}},
                  {"difficulty", std::int64_t{difficulty}},
                  {"host_threads", std::int64_t{threads}},
                  {"steps", steps}};
      c.metrics = {{"steps_per_s", steps / hosted}};
      c.baseline = {{"steps_per_s", steps / direct}};
      c.ratio_metric = "steps_per_s";
      report.cases.push_back(c);
    }
  }
  return report;
}

}  // namespace

MOERL_BENCHMARK("env", "env steps/s per family, many sessions on one env-worker host vs direct stepping", run);
