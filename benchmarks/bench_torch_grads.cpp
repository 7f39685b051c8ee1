// `scripts/launch.sh -n P moerl bench grads [--config F] [--set k=v] [--init FILE]
//  [--shapes tiny,config,large] [--bucket-mb M] [--reps R]`: what overlapping
// the gradient all-reduce with the backward pass saves (#23 point 5). Every
// rank is a learner (MPI_COMM_WORLD; P=1 is allowed) with the same policy
// and its own fixed synthetic batch. One training step's forward + backward
// + gradient averaging is timed three ways, taking turns rep by rep so that
// all three see the same machine:
//   compute     no averaging: the step's compute alone, the baseline;
//   flat        learner::average_gradients after the backward (one all-reduce);
//   overlapped  learner::OverlappedGradients armed before the backward (its
//               buckets' all-reduces start from gradient hooks) and finished
//               after it.
// Reported per mode: the median step time of the slowest rank, the gradient
// bytes, buckets and buckets started during the backward, and the time spent
// in the averaging call after the backward; and the share of the flat
// all-reduce's cost that overlapping hides,
//   hidden = (flat - overlapped) / (flat - compute).
//
// Shapes: config (--config's [model]/[moe], configs/quickstart.toml by
// default; --set and --init apply to it), large (a built-in policy with tens
// of MB of gradients) and tiny (--quick's default).

#include <ATen/Parallel.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_mpi.h"
#include "bench_policy.h"
#include "moerl/bench/registry.h"
#include "moerl/bench/timing.h"
#include "moerl/comm/mpi_communicator.h"
#include "moerl/core/error.h"
#include "moerl/learner/gradient_averaging.h"
#include "moerl/learner/overlapped_gradients.h"
#include "moerl/model/policy.h"
#include "moerl/runtime/mpi_session.h"
#include "moerl/setup/config_loading.h"

namespace moerl::bench {
namespace {

constexpr const char* kWho = "bench grads";
constexpr const char* kUsage =
    "--config F, --set section.key=value, --init FILE, --shapes tiny,config,large, --bucket-mb M, --reps R";
constexpr double kCollectiveTimeoutS = 300;

struct GradsArgs {
  PolicyBenchArgs policy;
  double bucket_mb = 1;
  std::int64_t reps = 0;            // 0: 5 (2 with --quick)
  std::vector<std::string> shapes;  // empty: config and large (tiny with --quick)
};

double positive_number(const std::string& text, const std::string& option) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(v) || v <= 0)
    throw Error(std::string(kWho) + ": " + option + ": '" + text + "' is not a positive number");
  return v;
}

std::vector<std::string> shape_list(const std::string& text) {
  std::vector<std::string> shapes;
  std::stringstream in(text);
  for (std::string name; std::getline(in, name, ',');) {
    if (name != "tiny" && name != "config" && name != "large")
      throw Error(std::string(kWho) + ": --shapes: unknown shape '" + name + "' (tiny, config, large)");
    shapes.push_back(name);
  }
  if (shapes.empty()) throw Error(std::string(kWho) + ": --shapes needs at least one shape");
  return shapes;
}

GradsArgs parse_grads_args(const BenchOptions& options) {
  GradsArgs out;
  const auto own = [&](const std::string& option, const std::function<const std::string&()>& value) {
    if (option == "--bucket-mb") {
      out.bucket_mb = positive_number(value(), option);
    } else if (option == "--reps") {
      out.reps = whole_number(value(), kWho, option);
      if (out.reps < 1) throw Error(std::string(kWho) + ": --reps must be at least 1");
    } else if (option == "--shapes") {
      out.shapes = shape_list(value());
    } else {
      return false;
    }
    return true;
  };
  out.policy = parse_policy_bench_args(options.args, kWho, kUsage, own);
  if (out.shapes.empty()) out.shapes = options.quick ? std::vector<std::string>{"tiny"} : shape_list("config,large");
  if (out.reps == 0) out.reps = options.quick ? 2 : 5;
  return out;
}

struct Shape {
  std::string name;
  config::ModelSection model;
  config::MoeSection moe;
  std::int64_t sequences = 4, seq_len = 64;  // the batch of each rank
};

// A built-in MoE policy: every layer MoE, top-2 of 8 experts.
Shape built_in_shape(const std::string& name, std::int64_t d_model, std::int64_t layers, std::int64_t heads,
                     std::int64_t d_expert) {
  Shape s;
  s.name = name;
  s.model.d_model = d_model;
  s.model.num_layers = layers;
  s.model.num_heads = heads;
  s.model.num_kv_heads = heads / 2;
  s.model.d_ff = 2 * d_model;
  s.model.max_seq_len = 256;
  s.moe.num_experts = 8;
  s.moe.top_k = 2;
  s.moe.d_expert = d_expert;
  return s;
}

// tiny: seconds on two ranks (the CLI test); large: about 16 M parameters,
// 64 MB of float32 gradients, so the all-reduce moves tens of MB per step.
Shape make_shape(const std::string& name, const config::Config& config) {
  if (name == "tiny") {
    Shape s = built_in_shape(name, 32, 2, 4, 32);
    s.sequences = 2;
    s.seq_len = 32;
    return s;
  }
  if (name == "large") return built_in_shape(name, 512, 4, 8, 256);
  Shape s;
  s.name = "config";
  s.model = config.model;
  s.moe = config.moe;
  s.seq_len = std::min<std::int64_t>(s.seq_len, config.model.max_seq_len);
  return s;
}

model::Policy make_policy(const Shape& shape, const config::Config& config, const std::string& init_path) {
  if (shape.name == "config") {
    model::Policy policy = make_bench_policy(config, init_path, kWho);
    policy->train();
    return policy;
  }
  torch::manual_seed(1);  // the same weights on every rank, as a job's learners start
  return model::Policy(shape.model, shape.moe);
}

enum class Mode { Compute, Flat, Overlapped };
constexpr std::array<Mode, 3> kModes = {Mode::Compute, Mode::Flat, Mode::Overlapped};

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::Compute: return "compute";
    case Mode::Flat: return "flat";
    case Mode::Overlapped: return "overlapped";
  }
  return "?";
}

// What the reps of one mode add up to.
struct ModeRecord {
  std::vector<double> step_s;  // per rep, the slowest rank's
  double average_s = 0;        // this rank's time in the averaging call after the backward, summed
  double wait_s = 0;           // OverlapStats::finish_wait_s, summed
  double started_in_backward = 0;
  int buckets = 0;
  double grad_bytes = 0;
};

// One learner's step: its policy, its batch and both averagers.
struct Learner {
  Learner(model::Policy p, const Shape& shape, comm::Communicator& flat_group, comm::Communicator& bucket_group,
          std::size_t bucket_bytes)
      : policy(std::move(p)),
        parameters(policy->parameters()),
        flat_group(flat_group),
        overlapped(parameters, bucket_group, bucket_group.size(), kCollectiveTimeoutS, bucket_bytes) {
    torch::manual_seed(1000 + flat_group.rank());  // each rank its own batch
    const std::int64_t vocab = shape.model.vocab_size;
    tokens = torch::randint(0, vocab, {shape.sequences, shape.seq_len}, torch::kInt64);
    targets = torch::randint(0, vocab, {shape.sequences * shape.seq_len}, torch::kInt64);
  }

  torch::Tensor loss() {
    const model::PolicyOutput out = policy->forward(tokens);
    return torch::nn::functional::cross_entropy(out.logits, targets) + out.aux_loss;
  }

  model::Policy policy;
  std::vector<torch::Tensor> parameters;
  comm::Communicator& flat_group;
  learner::OverlappedGradients overlapped;  // hooks on `parameters`, inert unless armed
  torch::Tensor tokens, targets;
};

double gradient_bytes(const std::vector<torch::Tensor>& parameters) {
  double bytes = 0;
  for (const torch::Tensor& p : parameters)
    if (p.grad().defined()) bytes += static_cast<double>(p.grad().numel() * p.grad().element_size());
  return bytes;
}

// Runs the mode's averaging after the backward, recording what it reports.
void average(Mode mode, Learner& learner, ModeRecord& record) {
  if (mode == Mode::Flat) {
    learner::average_gradients(learner.parameters, {}, {&learner.flat_group, nullptr, kCollectiveTimeoutS});
    record.buckets = learner.flat_group.size() > 1 ? 1 : 0;  // one flat buffer; none alone
  } else if (mode == Mode::Overlapped) {
    const learner::OverlapStats stats = learner.overlapped.finish();
    record.wait_s += stats.finish_wait_s;
    record.started_in_backward += stats.started_in_backward;
    record.buckets = stats.buckets;
  }
}

// One step from a common start (a barrier): forward, backward, averaging.
void timed_step(Mode mode, Learner& learner, ModeRecord& record) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  learner.policy->zero_grad(/*set_to_none=*/true);
  const torch::Tensor loss = learner.loss();
  if (mode == Mode::Overlapped) learner.overlapped.arm();
  loss.backward();
  const auto averaging = std::chrono::steady_clock::now();
  average(mode, learner, record);
  record.average_s += seconds_since(averaging);
  const double step_s = seconds_since(start);
  record.step_s.push_back(max_over_ranks(step_s));
  record.grad_bytes = gradient_bytes(learner.parameters);
}

std::int64_t parameter_count(const std::vector<torch::Tensor>& parameters) {
  std::int64_t n = 0;
  for (const torch::Tensor& p : parameters) n += p.numel();
  return n;
}

BenchCase mode_case(Mode mode, const ModeRecord& r, const std::map<std::string, ParamValue>& params, std::int64_t reps,
                    double compute_ms) {
  BenchCase c;
  c.name = "step";
  c.params = params;
  c.params["mode"] = std::string(mode_name(mode));
  const double per_step = 1.0 / static_cast<double>(reps);
  c.metrics = {{"ms", percentile(r.step_s, 0.5) * 1e3}, {"grad_MB", r.grad_bytes / 1e6}};
  if (mode == Mode::Compute) return c;
  c.metrics["buckets"] = r.buckets;
  c.metrics["average_ms"] = mean_over_ranks(r.average_s * per_step) * 1e3;
  if (mode == Mode::Overlapped) {
    c.metrics["started_in_backward"] = mean_over_ranks(r.started_in_backward * per_step);
    c.metrics["wait_ms"] = mean_over_ranks(r.wait_s * per_step) * 1e3;
  }
  c.baseline = {{"ms", compute_ms}};
  c.ratio_metric = "ms";
  c.higher_is_better = false;  // ratio = compute ms / this mode's ms: what averaging leaves of the speed
  return c;
}

// hidden = (flat - overlapped) / (flat - compute), where a learner has
// something to hide: alone, average_gradients returns at once.
void add_hidden_share(std::vector<BenchCase>& cases, int ranks) {
  const double compute = cases[0].metrics.at("ms"), flat = cases[1].metrics.at("ms");
  BenchCase& overlapped = cases[2];
  overlapped.metrics["flat_exposed_ms"] = flat - compute;
  if (ranks > 1 && flat > compute)
    overlapped.metrics["hidden_share"] = (flat - overlapped.metrics.at("ms")) / (flat - compute);
}

std::vector<BenchCase> shape_cases(const Shape& shape, model::Policy policy, const GradsArgs& args,
                                   comm::Communicator& flat_group, comm::Communicator& bucket_group, int threads) {
  const auto bucket_bytes = static_cast<std::size_t>(args.bucket_mb * 1e6);
  Learner learner(std::move(policy), shape, flat_group, bucket_group, bucket_bytes);
  std::array<ModeRecord, 3> records, warmup;
  for (std::size_t m = 0; m < kModes.size(); ++m) timed_step(kModes[m], learner, warmup[m]);  // first calls allocate
  for (std::int64_t rep = 0; rep < args.reps; ++rep)
    for (std::size_t i = 0; i < kModes.size(); ++i) {  // each rep starts with the next mode: no mode always first
      const std::size_t m = (static_cast<std::size_t>(rep) + i) % kModes.size();
      timed_step(kModes[m], learner, records[m]);
    }
  const std::map<std::string, ParamValue> params = {{"shape", shape.name},
                                                    {"ranks", std::int64_t{flat_group.size()}},
                                                    {"threads", std::int64_t{threads}},
                                                    {"d_model", shape.model.d_model},
                                                    {"layers", shape.model.num_layers},
                                                    {"experts", shape.moe.num_experts},
                                                    {"top_k", shape.moe.top_k},
                                                    {"d_expert", shape.moe.d_expert},
                                                    {"tokens_per_rank", shape.sequences * shape.seq_len},
                                                    {"parameters", parameter_count(learner.parameters)},
                                                    {"bucket_mb", args.bucket_mb},
                                                    {"reps", args.reps}};
  const double compute_ms = percentile(records[0].step_s, 0.5) * 1e3;
  std::vector<BenchCase> cases;
  for (std::size_t m = 0; m < kModes.size(); ++m)
    cases.push_back(mode_case(kModes[m], records[m], params, args.reps, compute_ms));
  add_hidden_share(cases, flat_group.size());
  return cases;
}

// The table the docs quote, one line per shape (rank 0 prints it).
void print_summary(const BenchReport& report) {
  std::printf("%-7s %5s %8s %10s %8s %8s %8s %6s %7s %6s %10s %10s %8s\n", "shape", "ranks", "grad_MB", "compute_ms",
              "flat_ms", "ovl_ms", "exposed", "hidden", "buckets", "in_bwd", "flat_avg_ms", "ovl_fin_ms", "wait_ms");
  for (std::size_t i = 0; i + 2 < report.cases.size(); i += 3) {
    const auto& compute = report.cases[i].metrics;
    const auto& flat = report.cases[i + 1].metrics;
    const auto& ovl = report.cases[i + 2].metrics;
    const auto hidden = ovl.find("hidden_share");
    char hidden_text[16] = "n/a";
    if (hidden != ovl.end()) std::snprintf(hidden_text, sizeof hidden_text, "%.2f", hidden->second);
    std::printf("%-7s %5lld %8.2f %10.2f %8.2f %8.2f %8.2f %6s %7.0f %6.1f %10.2f %10.2f %8.2f\n",
                std::get<std::string>(report.cases[i].params.at("shape")).c_str(),
                static_cast<long long>(std::get<std::int64_t>(report.cases[i].params.at("ranks"))), ovl.at("grad_MB"),
                compute.at("ms"), flat.at("ms"), ovl.at("ms"), ovl.at("flat_exposed_ms"), hidden_text,
                ovl.at("buckets"), ovl.at("started_in_backward"), flat.at("average_ms"), ovl.at("average_ms"),
                ovl.at("wait_ms"));
  }
  std::printf(
      "ms: median step (forward+backward+averaging) of the slowest rank; exposed = flat - compute;\n"
      "hidden = (flat - overlapped) / exposed: noisy when exposed is small against the steps' spread;\n"
      "n/a on one rank (nothing to average); avg/fin_ms: this rank's time in average_gradients / finish().\n");
  std::fflush(stdout);  // before the report's table, which goes through std::cout
}

BenchReport run_grads_bench(const BenchOptions& options) {
  const GradsArgs args = parse_grads_args(options);
  const config::Config config = setup::load_config_file(args.policy.config_path, args.policy.overrides);
  const auto session = runtime::start_mpi_unless_running();
  const int threads = compute_threads(options.threads);
  at::set_num_threads(threads);
  // Each averager its own communicator (MpiCommunicator duplicates the
  // world): the overlapped buckets start at different times on different
  // ranks, so no other collective may share theirs.
  comm::MpiCommunicator flat_group(MPI_COMM_WORLD, "bench grads flat all-reduce");
  comm::MpiCommunicator bucket_group(MPI_COMM_WORLD, "bench grads buckets");

  BenchReport report;
  report.quiet = flat_group.rank() != 0;
  for (const std::string& name : args.shapes) {
    const Shape shape = make_shape(name, config);
    model::Policy policy = make_policy(shape, config, args.policy.init_path);
    for (BenchCase& c : shape_cases(shape, std::move(policy), args, flat_group, bucket_group, threads))
      report.cases.push_back(std::move(c));
  }
  if (!report.quiet) print_summary(report);
  return report;
}

MOERL_BENCHMARK("grads",
                "one training step with gradient averaging: compute only, the flat all-reduce after the "
                "backward, and bucketed all-reduces overlapped with it; run under scripts/launch.sh -n P",
                run_grads_bench);

}  // namespace
}  // namespace moerl::bench
