// `moerl bench moe`: MoE layer forward+backward tokens/s, our operators
// (route -> plan -> dispatch -> grouped SwiGLU -> combine) against the
// per-expert-loop reference on the same parameters, in the same process; and
// dispatch+combine alone in GB/s against a plain copy of the same bytes.

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "moe_layer_timing.h"
#include "moerl/bench/registry.h"
#include "moerl/bench/timing.h"
#include "moerl/moe/moe_layer.h"
#include "moerl/moe/moe_ops.h"
#include "moerl_kernels/moe.h"

namespace moerl::bench {
namespace {

// Restores the thread count when a case ends. Only a change is applied:
// at::set_num_threads also re-creates LibTorch's pthreadpool, whose new
// worker spins for tens of milliseconds, and on 2 cores that spin took a
// core from the case being timed (libpthreadpool was 12% of the samples of
// a 2-thread run that set the count twice per case, 2.5% once per process).
struct ThreadScope {
  explicit ThreadScope(int threads) : saved(at::get_num_threads()) {
    if (threads != saved) at::set_num_threads(threads);
  }
  ~ThreadScope() {
    if (at::get_num_threads() != saved) at::set_num_threads(saved);
  }
  int saved;
};

// The expert products alone, at the routing `layer` gives x: per expert the
// nine GEMMs (and the SwiGLU) of forward and backward on preallocated buffers,
// split across threads as the operators split them; no routing, permutation,
// autograd or allocation. Any implementation on this BLAS does at least this
// work, so reference_ms / expert_ms bounds the ratio the layer can reach.
double expert_compute_seconds(moe::MoeFeedForwardImpl& layer, const torch::Tensor& x, int warmup, int reps) {
  torch::NoGradGuard no_grad;
  const auto& cfg = layer.moe_config();
  auto r = moe::route(layer.gate(x), cfg);
  auto plan = moe::make_route_plan(r.expert_indices, cfg.num_experts, -1, 1);
  const std::int64_t rows = plan.rows, hidden = x.size(1), d = cfg.d_expert;
  const std::int64_t experts = cfg.num_experts, w_in = d * hidden;
  auto xs = torch::randn({rows, hidden}), dy = torch::randn({rows, hidden});
  auto gu = torch::empty({rows, 2 * d}), h = torch::empty({rows, d});
  auto y = torch::empty({rows, hidden}), dx = torch::empty({rows, hidden});
  auto dwg = torch::empty({experts, d, hidden}), dwu = torch::empty_like(dwg);
  auto dwd = torch::empty({experts, hidden, d});
  const std::int64_t* off = plan.offsets.data_ptr<std::int64_t>();
  const float* wg = layer.experts->gate_proj.data_ptr<float>();
  const float* wu = layer.experts->up_proj.data_ptr<float>();
  const float* wd = layer.experts->down_proj.data_ptr<float>();
  std::vector<float> scratch(static_cast<std::size_t>(rows * 2 * d));
  return median_seconds(
      [&] {
        at::parallel_for(0, experts, 1, [&](std::int64_t b, std::int64_t e) {
          for (std::int64_t ex = b; ex < e; ++ex) {
            const std::int64_t r0 = off[ex], n = off[ex + 1] - off[ex];
            kernels::moe_swiglu_forward_rows_cpu<float>(
                xs.data_ptr<float>() + r0 * hidden, wg + ex * w_in, wu + ex * w_in, wd + ex * w_in, n, hidden, d,
                gu.data_ptr<float>() + r0 * 2 * d, h.data_ptr<float>() + r0 * d, y.data_ptr<float>() + r0 * hidden);
            kernels::moe_swiglu_backward_rows_cpu<float>(
                xs.data_ptr<float>() + r0 * hidden, gu.data_ptr<float>() + r0 * 2 * d, h.data_ptr<float>() + r0 * d,
                dy.data_ptr<float>() + r0 * hidden, wg + ex * w_in, wu + ex * w_in, wd + ex * w_in, n, hidden, d,
                scratch.data() + r0 * 2 * d, dx.data_ptr<float>() + r0 * hidden, dwg.data_ptr<float>() + ex * w_in,
                dwu.data_ptr<float>() + ex * w_in, dwd.data_ptr<float>() + ex * w_in);
          }
        });
      },
      warmup, reps);
}

BenchCase layer_case(const MoeLayerShape& shape, std::int64_t hidden, std::int64_t tokens, int threads, int warmup,
                     int reps) {
  ThreadScope scope(threads);
  auto layer = make_bench_layer(shape, hidden);
  auto x = bench_input(tokens, hidden, torch::kCPU);
  const MoeLayerTiming t = time_moe_layer(*layer, x, warmup, reps);
  const double experts_only = expert_compute_seconds(*layer, x.detach(), warmup, reps);

  BenchCase c;
  c.name = "layer_fwd_bwd";
  c.params = {{"experts", shape.experts},
              {"top_k", shape.top_k},
              {"shared", shape.shared},
              {"hidden", hidden},
              {"d_expert", layer->moe_config().d_expert},
              {"tokens", tokens},
              {"threads", std::int64_t{threads}}};
  // expert_ms: the expert products alone (see expert_compute_seconds);
  // ratio_bound = reference ms / expert_ms, the most any implementation gets.
  c.metrics = {{"tokens_per_s", tokens / t.ours_s},
               {"ms", t.ours_s * 1e3},
               {"expert_ms", experts_only * 1e3},
               {"ratio_bound", t.reference_s / experts_only}};
  c.baseline = {{"tokens_per_s", tokens / t.reference_s}, {"ms", t.reference_s * 1e3}};
  c.ratio_metric = "tokens_per_s";
  return c;
}

BenchCase dispatch_combine_case(std::int64_t tokens, std::int64_t hidden, std::int64_t experts, std::int64_t top_k,
                                int threads, int warmup, int reps) {
  ThreadScope scope(threads);
  torch::NoGradGuard no_grad;
  torch::manual_seed(2);
  auto x = torch::randn({tokens, hidden});
  auto idx = std::get<1>(torch::topk(torch::rand({tokens, experts}), top_k, -1));
  auto gates = torch::rand({tokens, top_k});
  auto plan = moe::make_route_plan(idx, experts, -1, 1);
  // Through the operators: includes allocating the outputs (fresh pages from
  // the OS for buffers this large, which dominates on CPU).
  const double op = median_seconds(
      [&] {
        auto rows = moe::dispatch(x, plan);
        auto y = moe::combine(rows, gates, plan);
      },
      warmup, reps);
  // The kernels alone on preallocated buffers, split across threads exactly as
  // the adapter splits them.
  auto rows = torch::empty({plan.rows, hidden});
  auto y = torch::empty({tokens, hidden});
  const float* xp = x.data_ptr<float>();
  const float* gp = gates.data_ptr<float>();
  const std::int64_t* src = plan.row_source.data_ptr<std::int64_t>();
  const std::int64_t* dest = plan.dest_row.data_ptr<std::int64_t>();
  float* rp = rows.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const std::int64_t grain = std::max<std::int64_t>(1, 16384 / hidden);
  const double ours = median_seconds(
      [&] {
        at::parallel_for(0, plan.rows, grain, [&](std::int64_t b, std::int64_t e) {
          kernels::moe_dispatch_cpu<float>(xp, src + b, nullptr, tokens, top_k, hidden, e - b, rp + b * hidden);
        });
        at::parallel_for(0, tokens, std::max<std::int64_t>(1, grain / top_k), [&](std::int64_t b, std::int64_t e) {
          kernels::moe_combine_cpu<float>(rp, dest + b * top_k, gp + b * top_k, e - b, top_k, hidden, yp + b * hidden);
        });
      },
      warmup, reps);
  // Dispatch reads and writes `rows` rows; combine reads them and writes T rows.
  const double bytes = 4.0 * hidden * (3.0 * plan.rows + tokens);
  // The ceiling: a copy that reads and writes as many bytes in total.
  auto csrc = torch::empty({static_cast<std::int64_t>(bytes / 8)});
  auto cdst = torch::empty_like(csrc);
  const double copy = median_seconds([&] { cdst.copy_(csrc); }, warmup, reps);
  const double copy_bytes = 2.0 * 4.0 * static_cast<double>(csrc.numel());

  BenchCase c;
  c.name = "dispatch_combine";
  c.params = {{"experts", experts},
              {"top_k", top_k},
              {"hidden", hidden},
              {"tokens", tokens},
              {"threads", std::int64_t{threads}}};
  c.metrics = {{"GB_per_s", bytes / ours / 1e9}, {"ms", ours * 1e3}, {"op_GB_per_s", bytes / op / 1e9}};
  c.baseline = {{"GB_per_s", copy_bytes / copy / 1e9}, {"ms", copy * 1e3}};
  c.ratio_metric = "GB_per_s";
  return c;
}

BenchReport run_moe_bench(const BenchOptions& options) {
  BenchReport report;
  report.bench = "moe";
  std::vector<int> thread_counts = options.threads > 0 ? std::vector<int>{options.threads} : std::vector<int>{1, 2};
  const std::vector<MoeLayerShape> shapes = {{8, 2, 0}, {64, 8, 0}, {64, 6, 2}};
  const std::vector<std::int64_t> hiddens =
      options.quick ? std::vector<std::int64_t>{96} : std::vector<std::int64_t>{256, 512, 1024};
  // 1024 tokens: a learner micro-batch, where the expert GEMMs dominate; 128:
  // a small step (a decode batch's size), where per-expert overheads do.
  const std::vector<std::int64_t> token_counts =
      options.quick ? std::vector<std::int64_t>{64} : std::vector<std::int64_t>{128, 1024};
  const int warmup = 1, reps = options.quick ? 1 : 5;  // one warm-up even when quick: first calls allocate
  for (int threads : thread_counts) {
    const ThreadScope scope(threads);
    // Let the pthreadpool worker that the change re-created stop spinning
    // (see ThreadScope) before the first case is timed.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (std::int64_t tokens : token_counts) {
      for (const auto& shape : shapes) {
        for (std::int64_t hidden : hiddens) {
          report.cases.push_back(layer_case(shape, hidden, tokens, threads, warmup, reps));
        }
      }
    }
    report.cases.push_back(dispatch_combine_case(options.quick ? 256 : 4096, options.quick ? 96 : 1024, 64, 8, threads,
                                                 warmup, options.quick ? 3 : 5));
  }
  return report;
}

MOERL_BENCHMARK("moe",
                "MoE layer fwd+bwd tokens/s vs per-expert-loop reference; dispatch+combine GB/s "
                "vs copy",
                run_moe_bench);

}  // namespace
}  // namespace moerl::bench
