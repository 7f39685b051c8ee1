// moerl_moe_gpu_bench: the MoE layer's forward+backward on CUDA, our operators
// against the per-expert-loop reference (one mask, one gather and one
// index_add per expert, as common model code writes it), on the same weights
// and input, at the shapes of `moerl bench moe` and at GPU-sized batches.
// Prints one table row per case with the ratio; exits 77 without a GPU. Rows
// marked bf16 run bf16 activations on the same float32 weights (a learner's
// mixed precision: the layer casts its weights to bf16), for both paths.
// scripts/gpu_check.sh runs it. Usage: moerl_moe_gpu_bench [--quick]

#include <cstdio>
#include <cstring>
#include <vector>

#include "moe_layer_timing.h"

namespace {

using moerl::bench::MoeLayerShape;

void print_header() {
  std::printf("%-22s %6s %6s %8s %10s %10s %8s %14s\n", "layer", "hidden", "d_exp", "tokens", "ours_ms", "ref_ms",
              "ratio", "tokens_per_s");
}

void run_case(const MoeLayerShape& shape, std::int64_t hidden, std::int64_t tokens, int reps, bool bf16 = false) {
  const torch::Device cuda(torch::kCUDA);
  auto layer = moerl::bench::make_bench_layer(shape, hidden);
  layer->to(cuda);
  auto x = moerl::bench::bench_input(tokens, hidden, cuda);
  if (bf16) x = x.detach().to(torch::kBFloat16).set_requires_grad(true);
  const auto t = moerl::bench::time_moe_layer(*layer, x, /*warmup=*/3, reps);
  char name[64];
  std::snprintf(name, sizeof name, "E=%lld k=%lld shared=%lld%s", static_cast<long long>(shape.experts),
                static_cast<long long>(shape.top_k), static_cast<long long>(shape.shared), bf16 ? " bf16" : "");
  std::printf("%-22s %6lld %6lld %8lld %10.3f %10.3f %7.2fx %14.4g\n", name, static_cast<long long>(hidden),
              static_cast<long long>(layer->moe_config().d_expert), static_cast<long long>(tokens), t.ours_s * 1e3,
              t.reference_s * 1e3, t.reference_s / t.ours_s, static_cast<double>(tokens) / t.ours_s);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (!torch::cuda::is_available()) {
    std::puts("moerl_moe_gpu_bench: no CUDA device visible to LibTorch, skipping");
    return 77;
  }
  const std::vector<MoeLayerShape> shapes = {{8, 2, 0}, {64, 8, 0}, {64, 6, 2}};
  const std::vector<std::int64_t> hiddens =
      quick ? std::vector<std::int64_t>{256} : std::vector<std::int64_t>{256, 512, 1024};
  const std::vector<std::int64_t> token_counts =
      quick ? std::vector<std::int64_t>{1024} : std::vector<std::int64_t>{1024, 8192};
  std::puts(
      "MoE layer forward+backward on CUDA: ours vs per-expert-loop reference (median of "
      "timed steps, each ending in a device synchronise)");
  print_header();
  for (const auto& shape : shapes) {
    for (std::int64_t hidden : hiddens) {
      for (std::int64_t tokens : token_counts) run_case(shape, hidden, tokens, quick ? 3 : 10);
    }
  }
  // One bf16 row per shape, at the widest layer and largest batch only: the
  // GPU check caps this program's time.
  for (const auto& shape : shapes) run_case(shape, hiddens.back(), token_counts.back(), quick ? 3 : 10, true);
  return 0;
}
