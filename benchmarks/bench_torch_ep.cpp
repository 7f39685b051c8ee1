// `scripts/launch.sh -n P moerl bench ep`: what expert parallelism costs and
// saves, one expert group of P ranks (MPI_COMM_WORLD; P must divide the
// experts). Weak scaling: every rank routes the same number of tokens whatever
// P, so a rank's expert compute stays the same on average (it runs E/P experts
// over the rows every member sends it) and what changes is the exchange.
//
// Per layer shape, every rank times the split layer (moe/expert_parallel.h)
// and, as the baseline, the whole layer (all E experts, no exchange) on the
// same tokens, interleaved step by step so that both see the same machine.
// Reported per layer forward+backward: the slowest rank's time, the bytes a
// rank sends and receives in the all-to-alls and the time it spends inside
// them (CommunicatorExpertExchange::totals(), averaged over ranks), the
// bytes the cost model predicts for uniform routing, and the expert weight
// bytes a rank holds (1/P of the whole layer's).
//
// Its own option: --tokens N overrides the tokens per rank of every shape.

#include <ATen/Parallel.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_mpi.h"
#include "moerl/bench/registry.h"
#include "moerl/bench/timing.h"
#include "moerl/comm/communicator_expert_exchange.h"
#include "moerl/comm/mpi_communicator.h"
#include "moerl/core/error.h"
#include "moerl/moe/moe_layer.h"
#include "moerl/runtime/mpi_session.h"

namespace moerl::bench {
namespace {

constexpr const char* kWho = "bench ep";

struct EpShape {
  std::string name;
  std::int64_t experts, top_k, d_model, d_expert, tokens;  // tokens routed per rank
};

// quickstart: configs/quickstart.toml's [model]/[moe]; large: a layer whose
// expert GEMMs and exchanged rows are big enough that neither is overhead.
std::vector<EpShape> ep_shapes(bool quick, std::int64_t tokens_override) {
  std::vector<EpShape> shapes =
      quick ? std::vector<EpShape>{{"tiny", 8, 2, 32, 32, 64}}
            : std::vector<EpShape>{{"quickstart", 8, 2, 128, 128, 512}, {"large", 16, 2, 1024, 512, 1024}};
  if (tokens_override > 0)
    for (EpShape& s : shapes) s.tokens = tokens_override;
  return shapes;
}

// Seeded alike on every rank and for both layers: the split layer holds the
// same slice of the same weights the whole layer holds.
moe::MoeFeedForward make_layer(const EpShape& shape, std::shared_ptr<moe::ExpertExchange> group) {
  config::ModelSection model;
  model.d_model = shape.d_model;
  config::MoeSection moe;
  moe.num_experts = shape.experts;
  moe.top_k = shape.top_k;
  moe.d_expert = shape.d_expert;
  torch::manual_seed(1);
  return moe::MoeFeedForward(model, moe, std::move(group));
}

double expert_bytes(moe::MoeFeedForwardImpl& layer) {
  double bytes = 0;
  for (const torch::Tensor* w : {&layer.experts->gate_proj, &layer.experts->up_proj, &layer.experts->down_proj})
    bytes += static_cast<double>(w->numel() * w->element_size());
  return bytes;
}

// One forward+backward from a common start (a barrier), in seconds; the
// slowest rank's time, since a step waits for it.
double timed_step(moe::MoeFeedForwardImpl& layer, const torch::Tensor& x, const torch::Tensor& probe) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  layer.zero_grad(/*set_to_none=*/true);
  auto out = layer.forward(x);
  ((out.hidden * probe).sum() + out.aux_loss).backward();
  return max_over_ranks(seconds_since(start));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Cost model (docs/scaling.md): dispatch and combine each move T*k rows of
// d_model elements, of which (P-1)/P leave the rank under uniform routing;
// backward moves the same again.
double model_bytes_sent(const EpShape& s, int ranks, double element_bytes) {
  return 4.0 * static_cast<double>(s.tokens * s.top_k * s.d_model) * element_bytes * (ranks - 1) / ranks;
}

BenchCase ep_case(const EpShape& shape, comm::Communicator& group, int threads, int warmup, int reps) {
  const int ranks = group.size();
  if (shape.experts % ranks != 0)
    throw Error(std::string(kWho) + ": " + std::to_string(ranks) + " ranks do not divide the " +
                std::to_string(shape.experts) + " experts of shape " + shape.name);
  auto exchange = std::make_shared<comm::CommunicatorExpertExchange>(group, 300);
  auto whole = make_layer(shape, nullptr);
  auto split = make_layer(shape, exchange);
  torch::manual_seed(100 + group.rank());  // each rank its own tokens
  const torch::Tensor x = torch::randn({shape.tokens, shape.d_model}).set_requires_grad(true);
  const torch::Tensor probe = torch::randn({shape.tokens, shape.d_model});

  for (int i = 0; i < warmup; ++i) {  // first calls allocate
    timed_step(*whole, x, probe);
    timed_step(*split, x, probe);
  }
  const moe::ExchangeTotals before = exchange->totals();
  std::vector<double> whole_s, split_s;
  for (int i = 0; i < reps; ++i) {  // interleaved: both see the same machine
    whole_s.push_back(timed_step(*whole, x, probe));
    split_s.push_back(timed_step(*split, x, probe));
  }
  const moe::ExchangeTotals after = exchange->totals();
  const double per_step = 1.0 / reps;

  BenchCase c;
  c.name = "layer_fwd_bwd";
  c.params = {{"shape", shape.name},
              {"experts", shape.experts},
              {"top_k", shape.top_k},
              {"d_model", shape.d_model},
              {"d_expert", shape.d_expert},
              {"tokens_per_rank", shape.tokens},
              {"ranks", std::int64_t{ranks}},
              {"experts_per_rank", split->expert_shard().count},
              {"threads", std::int64_t{threads}}};
  const double element_bytes = static_cast<double>(x.element_size());
  c.metrics = {{"ms", median(split_s) * 1e3},
               {"exchange_ms", mean_over_ranks((after.seconds - before.seconds) * per_step) * 1e3},
               {"sent_MB", mean_over_ranks(static_cast<double>(after.bytes_sent - before.bytes_sent) * per_step) / 1e6},
               {"received_MB",
                mean_over_ranks(static_cast<double>(after.bytes_received - before.bytes_received) * per_step) / 1e6},
               {"model_sent_MB", model_bytes_sent(shape, ranks, element_bytes) / 1e6},
               {"exchanges", static_cast<double>(after.exchanges - before.exchanges) * per_step},
               {"expert_MB", expert_bytes(*split) / 1e6}};
  c.baseline = {{"ms", median(whole_s) * 1e3}, {"expert_MB", expert_bytes(*whole) / 1e6}};
  c.ratio_metric = "ms";
  c.higher_is_better = false;  // ratio = whole ms / split ms: below 1 is what the exchange adds
  return c;
}

// The table the docs quote, one line per shape (rank 0 prints it).
void print_summary(const BenchReport& report) {
  std::printf("%-11s %5s %7s %9s %9s %11s %8s %8s %9s %8s %10s %9s\n", "shape", "ranks", "experts", "split_ms",
              "whole_ms", "whole/split", "xchg_ms", "sent_MB", "model_MB", "recv_MB", "expert_MB", "whole_MB");
  for (const BenchCase& c : report.cases) {
    const auto& m = c.metrics;
    std::printf("%-11s %5lld %7lld %9.2f %9.2f %11.2f %8.2f %8.3f %9.3f %8.3f %10.3f %9.3f\n",
                std::get<std::string>(c.params.at("shape")).c_str(),
                static_cast<long long>(std::get<std::int64_t>(c.params.at("ranks"))),
                static_cast<long long>(std::get<std::int64_t>(c.params.at("experts_per_rank"))), m.at("ms"),
                c.baseline.at("ms"), c.ratio().value_or(0), m.at("exchange_ms"), m.at("sent_MB"), m.at("model_sent_MB"),
                m.at("received_MB"), m.at("expert_MB"), c.baseline.at("expert_MB"));
  }
  std::fflush(stdout);  // before the report's table, which goes through std::cout
}

std::int64_t tokens_argument(const std::vector<std::string>& args) {
  std::int64_t tokens = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--tokens" && i + 1 < args.size()) {
      tokens = whole_number(args[++i], kWho, "--tokens");
    } else {
      throw Error(std::string(kWho) + ": unknown argument '" + args[i] +
                  "' (usage: moerl bench ep [--quick] [--tokens N])");
    }
  }
  return tokens;
}

BenchReport run_ep_bench(const BenchOptions& options) {
  const std::int64_t tokens = tokens_argument(options.args);
  const auto session = runtime::start_mpi_unless_running();
  const int threads = compute_threads(options.threads);
  at::set_num_threads(threads);
  comm::MpiCommunicator group(MPI_COMM_WORLD, "bench ep expert group");

  BenchReport report;
  report.quiet = group.rank() != 0;
  const int warmup = 1, reps = options.quick ? 2 : 5;
  for (const EpShape& shape : ep_shapes(options.quick, tokens))
    report.cases.push_back(ep_case(shape, group, threads, warmup, reps));
  if (!report.quiet) print_summary(report);
  return report;
}

MOERL_BENCHMARK("ep",
                "expert-parallel MoE layer fwd+bwd (split over the ranks) vs the whole layer on the same "
                "tokens; all-to-all bytes and time, expert bytes per rank; run under scripts/launch.sh -n P",
                run_ep_bench);

}  // namespace
}  // namespace moerl::bench
