// Every MoE CUDA kernel against its CPU twin at odd sizes (1, 19, 99, 989
// tokens; hidden sizes that are not powers of two), with explicit tolerances,
// in float32 and in bfloat16 storage (float accumulation on both sides).
// Exit codes: 0 pass, 1 failure, 77 no CUDA device (ctest: skipped).
//   moerl_gpu_tests           run the checks
//   moerl_gpu_tests --bench   also time dispatch+combine (GB/s vs a device-to-
//                             device cudaMemcpy of the same bytes) and the
//                             grouped GEMM (GFLOP/s)

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "moerl_kernels/moe.h"

namespace mk = moerl::kernels;

namespace {

int g_failures = 0;

#define GPU_CHECK(call)                                                                                  \
  do {                                                                                                   \
    cudaError_t e_ = (call);                                                                             \
    if (e_ != cudaSuccess) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                      \
    }                                                                                                    \
  } while (0)

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceBuffer(std::size_t count) : n(count) {
    GPU_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr), sizeof(T) * std::max<std::size_t>(n, 1)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    if (n) GPU_CHECK(cudaMemcpy(ptr, host.data(), sizeof(T) * n, cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> to_host() const {
    std::vector<T> h(n);
    GPU_CHECK(cudaDeviceSynchronize());
    if (n) GPU_CHECK(cudaMemcpy(h.data(), ptr, sizeof(T) * n, cudaMemcpyDeviceToHost));
    return h;
  }
};

void expect_equal_ints(const char* what, const std::string& where, const std::vector<std::int64_t>& gpu,
                       const std::vector<std::int64_t>& cpu) {
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (gpu[i] != cpu[i]) {
      std::fprintf(stderr, "FAIL %s [%s] index %zu: gpu %lld cpu %lld\n", what, where.c_str(), i,
                   static_cast<long long>(gpu[i]), static_cast<long long>(cpu[i]));
      ++g_failures;
      return;
    }
  }
}

void expect_close(const char* what, const std::string& where, const std::vector<float>& gpu,
                  const std::vector<float>& cpu, double atol, double rtol) {
  double worst = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double d = std::abs(double(gpu[i]) - double(cpu[i]));
    worst = std::max(worst, d);
    if (!(d <= atol + rtol * std::abs(double(cpu[i])))) {
      std::fprintf(stderr, "FAIL %s [%s] index %zu: gpu %.9g cpu %.9g (atol %g rtol %g)\n", what, where.c_str(), i,
                   gpu[i], cpu[i], atol, rtol);
      ++g_failures;
      return;
    }
  }
  std::printf("  ok %-22s %-34s max abs diff %.3g\n", what, where.c_str(), worst);
}

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<std::int64_t> random_experts(std::int64_t T, std::int64_t k, std::int64_t E, std::mt19937& rng) {
  std::vector<std::int64_t> idx(T * k), perm(E);
  for (std::int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::copy(perm.begin(), perm.begin() + k, idx.begin() + t * k);
  }
  return idx;
}

struct HostPlan {
  std::int64_t rows;
  std::vector<std::int64_t> routed, counts, offsets, dest_row, row_source, dropped;
};

HostPlan cpu_plan(const std::vector<std::int64_t>& idx, std::int64_t T, std::int64_t k, std::int64_t E,
                  std::int64_t cap, std::int64_t block) {
  HostPlan p;
  p.rows = mk::moe_permuted_rows(T, k, E, block);
  p.routed.resize(E), p.counts.resize(E), p.offsets.resize(E + 1);
  p.dest_row.resize(T * k), p.row_source.resize(p.rows), p.dropped.resize(1);
  mk::moe_plan_cpu(idx.data(), T, k, E, cap, block, p.routed.data(), p.counts.data(), p.offsets.data(),
                   p.dest_row.data(), p.row_source.data(), p.dropped.data());
  return p;
}

void check_case(std::int64_t T, std::int64_t H, std::int64_t E, std::int64_t k, std::int64_t block,
                double capacity_factor, std::int64_t D, std::mt19937& rng) {
  const std::int64_t cap =
      capacity_factor > 0 ? static_cast<std::int64_t>(std::ceil(capacity_factor * T * k / double(E))) : -1;
  char buf[128];
  std::snprintf(buf, sizeof buf, "T=%lld H=%lld E=%lld k=%lld blk=%lld cap=%lld", (long long)T, (long long)H,
                (long long)E, (long long)k, (long long)block, (long long)cap);
  const std::string where = buf;
  auto idx = random_experts(T, k, E, rng);
  HostPlan p = cpu_plan(idx, T, k, E, cap, block);
  const std::int64_t R = p.rows;

  // plan
  DeviceBuffer<std::int64_t> d_idx(idx), routed(E), counts(E), offsets(E + 1), dest(T * k), source(R), dropped(1);
  DeviceBuffer<unsigned char> ws(mk::moe_plan_workspace_bytes(T, k, E));
  GPU_CHECK(mk::moe_plan_cuda(d_idx.ptr, T, k, E, cap, block, routed.ptr, counts.ptr, offsets.ptr, dest.ptr, source.ptr,
                              dropped.ptr, ws.ptr, nullptr));
  expect_equal_ints("plan.routed", where, routed.to_host(), p.routed);
  expect_equal_ints("plan.counts", where, counts.to_host(), p.counts);
  expect_equal_ints("plan.offsets", where, offsets.to_host(), p.offsets);
  expect_equal_ints("plan.dest_row", where, dest.to_host(), p.dest_row);
  expect_equal_ints("plan.row_source", where, source.to_host(), p.row_source);
  expect_equal_ints("plan.dropped", where, dropped.to_host(), p.dropped);

  // dispatch (with and without weights)
  auto x = random_floats(T * H, rng), w = random_floats(T * k, rng);
  DeviceBuffer<float> d_x(x), d_w(w), d_rows(R * H);
  std::vector<float> rows_cpu(R * H);
  for (bool weighted : {false, true}) {
    const float* wc = weighted ? w.data() : nullptr;
    mk::moe_dispatch_cpu<float>(x.data(), p.row_source.data(), wc, T, k, H, R, rows_cpu.data());
    GPU_CHECK(
        mk::moe_dispatch_cuda(d_x.ptr, source.ptr, weighted ? d_w.ptr : nullptr, T, k, H, R, d_rows.ptr, nullptr));
    expect_close(weighted ? "dispatch(weighted)" : "dispatch", where, d_rows.to_host(), rows_cpu, 0.0, 1e-6);
  }

  // combine and gate gradient
  auto src = random_floats(R * H, rng), gy = random_floats(T * H, rng);
  DeviceBuffer<float> d_src(src), d_gy(gy), d_y(T * H), d_gw(T * k);
  std::vector<float> y_cpu(T * H), gw_cpu(T * k);
  mk::moe_combine_cpu<float>(src.data(), p.dest_row.data(), w.data(), T, k, H, y_cpu.data());
  GPU_CHECK(mk::moe_combine_cuda(d_src.ptr, dest.ptr, d_w.ptr, T, k, H, d_y.ptr, nullptr));
  expect_close("combine", where, d_y.to_host(), y_cpu, 1e-5, 1e-5);
  mk::moe_combine_gate_grad_cpu<float>(gy.data(), src.data(), p.dest_row.data(), T, k, H, gw_cpu.data());
  GPU_CHECK(mk::moe_combine_gate_grad_cuda(d_gy.ptr, d_src.ptr, dest.ptr, T, k, H, d_gw.ptr, nullptr));
  expect_close("combine_gate_grad", where, d_gw.to_host(), gw_cpu, 1e-4 * std::sqrt(double(H)), 1e-4);

  // grouped GEMMs: nt [R,H]x[E,D,H]^T, nn [R,D]x[E,D,H], tn -> [E,D,H]
  auto A = random_floats(R * H, rng), B = random_floats(E * D * H, rng), G = random_floats(R * D, rng);
  DeviceBuffer<float> d_A(A), d_B(B), d_G(G), d_C(R * D), d_dA(R * H), d_dB(E * D * H);
  std::vector<float> C(R * D), dA(R * H), dB(E * D * H);
  const double tol_h = 2e-5 * std::sqrt(double(H)), tol_d = 2e-5 * std::sqrt(double(D));
  mk::moe_grouped_gemm_nt_cpu<float>(A.data(), B.data(), p.offsets.data(), R, E, D, H, C.data());
  GPU_CHECK(mk::moe_grouped_gemm_nt_cuda(d_A.ptr, d_B.ptr, offsets.ptr, R, E, D, H, d_C.ptr, nullptr));
  expect_close("grouped_gemm_nt", where, d_C.to_host(), C, tol_h, 1e-4);
  mk::moe_grouped_gemm_nn_cpu<float>(G.data(), B.data(), p.offsets.data(), R, E, D, H, dA.data());
  GPU_CHECK(mk::moe_grouped_gemm_nn_cuda(d_G.ptr, d_B.ptr, offsets.ptr, R, E, D, H, d_dA.ptr, nullptr));
  expect_close("grouped_gemm_nn", where, d_dA.to_host(), dA, tol_d, 1e-4);
  mk::moe_grouped_gemm_tn_cpu<float>(G.data(), A.data(), p.offsets.data(), R, E, D, H, dB.data());
  GPU_CHECK(mk::moe_grouped_gemm_tn_cuda(d_G.ptr, d_A.ptr, offsets.ptr, R, E, D, H, d_dB.ptr, nullptr));
  expect_close("grouped_gemm_tn", where, d_dB.to_host(), dB, 2e-5 * std::sqrt(double(T * k)), 1e-4);
}

// ---- bfloat16 ----------------------------------------------------------------
// Inputs are bf16 values on both sides (the CPU twin and the kernel read the
// same bits), and both accumulate in float and round once on store. So:
//   - an unweighted dispatch copies bits: exact;
//   - a weighted dispatch is one float product per element, rounded once
//     (IEEE multiplication is exactly rounded, nothing to contract): exact;
//   - combine and the GEMMs sum in float in possibly different orders or with
//     FMA contraction on the GPU; the float sums agree to float tolerance, and
//     rounding two such sums to bf16 can land one bf16 ulp apart. bf16 keeps 8
//     significant bits, so one ulp is at most 2^-7 of the value: tolerance
//     atol (the float test's) + rtol 2^-7;
//   - the gate gradient is a float output of a float sum: the float tolerance.
constexpr double kBf16Ulp = 1.0 / 128;  // 2^-7: one bf16 ulp relative to the value, at worst

std::vector<mk::bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<mk::bfloat16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = mk::float_to_bf16(v[i]);
  return out;
}

std::vector<float> to_float(const std::vector<mk::bfloat16>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = mk::bf16_to_float(v[i]);
  return out;
}

void check_case_bf16(std::int64_t T, std::int64_t H, std::int64_t E, std::int64_t k, std::int64_t block,
                     double capacity_factor, std::int64_t D, std::mt19937& rng) {
  using bf = mk::bfloat16;
  const std::int64_t cap =
      capacity_factor > 0 ? static_cast<std::int64_t>(std::ceil(capacity_factor * T * k / double(E))) : -1;
  char buf[128];
  std::snprintf(buf, sizeof buf, "bf16 T=%lld H=%lld E=%lld k=%lld blk=%lld cap=%lld", (long long)T, (long long)H,
                (long long)E, (long long)k, (long long)block, (long long)cap);
  const std::string where = buf;
  auto idx = random_experts(T, k, E, rng);
  HostPlan p = cpu_plan(idx, T, k, E, cap, block);
  const std::int64_t R = p.rows;
  // The plan is dtype-free (checked above in float): copy the CPU one over.
  DeviceBuffer<std::int64_t> offsets(p.offsets), dest(p.dest_row), source(p.row_source);

  auto x = to_bf16(random_floats(T * H, rng));
  auto w = random_floats(T * k, rng);  // gates stay float
  DeviceBuffer<bf> d_x(x), d_rows(R * H);
  DeviceBuffer<float> d_w(w);
  std::vector<bf> rows_cpu(R * H);
  for (bool weighted : {false, true}) {
    const float* wc = weighted ? w.data() : nullptr;
    mk::moe_dispatch_cpu<bf>(x.data(), p.row_source.data(), wc, T, k, H, R, rows_cpu.data());
    GPU_CHECK(
        mk::moe_dispatch_cuda(d_x.ptr, source.ptr, weighted ? d_w.ptr : nullptr, T, k, H, R, d_rows.ptr, nullptr));
    expect_close(weighted ? "dispatch(weighted)" : "dispatch", where, to_float(d_rows.to_host()), to_float(rows_cpu),
                 0.0, 0.0);
  }

  auto src = to_bf16(random_floats(R * H, rng)), gy = to_bf16(random_floats(T * H, rng));
  DeviceBuffer<bf> d_src(src), d_gy(gy), d_y(T * H);
  DeviceBuffer<float> d_gw(T * k);
  std::vector<bf> y_cpu(T * H);
  std::vector<float> gw_cpu(T * k);
  mk::moe_combine_cpu<bf>(src.data(), p.dest_row.data(), w.data(), T, k, H, y_cpu.data());
  GPU_CHECK(mk::moe_combine_cuda(d_src.ptr, dest.ptr, d_w.ptr, T, k, H, d_y.ptr, nullptr));
  expect_close("combine", where, to_float(d_y.to_host()), to_float(y_cpu), 1e-5, kBf16Ulp);
  mk::moe_combine_gate_grad_cpu<bf>(gy.data(), src.data(), p.dest_row.data(), T, k, H, gw_cpu.data());
  GPU_CHECK(mk::moe_combine_gate_grad_cuda(d_gy.ptr, d_src.ptr, dest.ptr, T, k, H, d_gw.ptr, nullptr));
  expect_close("combine_gate_grad", where, d_gw.to_host(), gw_cpu, 1e-4 * std::sqrt(double(H)), 1e-4);

  auto A = to_bf16(random_floats(R * H, rng)), B = to_bf16(random_floats(E * D * H, rng));
  auto G = to_bf16(random_floats(R * D, rng));
  DeviceBuffer<bf> d_A(A), d_B(B), d_G(G), d_C(R * D), d_dA(R * H), d_dB(E * D * H);
  std::vector<bf> C(R * D), dA(R * H), dB(E * D * H);
  const double tol_h = 2e-5 * std::sqrt(double(H)), tol_d = 2e-5 * std::sqrt(double(D));
  mk::moe_grouped_gemm_nt_cpu<bf>(A.data(), B.data(), p.offsets.data(), R, E, D, H, C.data());
  GPU_CHECK(mk::moe_grouped_gemm_nt_cuda(d_A.ptr, d_B.ptr, offsets.ptr, R, E, D, H, d_C.ptr, nullptr));
  expect_close("grouped_gemm_nt", where, to_float(d_C.to_host()), to_float(C), tol_h, kBf16Ulp);
  mk::moe_grouped_gemm_nn_cpu<bf>(G.data(), B.data(), p.offsets.data(), R, E, D, H, dA.data());
  GPU_CHECK(mk::moe_grouped_gemm_nn_cuda(d_G.ptr, d_B.ptr, offsets.ptr, R, E, D, H, d_dA.ptr, nullptr));
  expect_close("grouped_gemm_nn", where, to_float(d_dA.to_host()), to_float(dA), tol_d, kBf16Ulp);
  mk::moe_grouped_gemm_tn_cpu<bf>(G.data(), A.data(), p.offsets.data(), R, E, D, H, dB.data());
  GPU_CHECK(mk::moe_grouped_gemm_tn_cuda(d_G.ptr, d_A.ptr, offsets.ptr, R, E, D, H, d_dB.ptr, nullptr));
  expect_close("grouped_gemm_tn", where, to_float(d_dB.to_host()), to_float(dB), 2e-5 * std::sqrt(double(T * k)),
               kBf16Ulp);
}

// Median time in ms of `reps` runs of fn, on the default stream.
template <typename Fn>
double time_ms(Fn fn, int reps = 20) {
  cudaEvent_t a, b;
  GPU_CHECK(cudaEventCreate(&a));
  GPU_CHECK(cudaEventCreate(&b));
  fn();  // warm-up
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    GPU_CHECK(cudaEventRecord(a));
    fn();
    GPU_CHECK(cudaEventRecord(b));
    GPU_CHECK(cudaEventSynchronize(b));
    float t = 0;
    GPU_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void bench(std::mt19937& rng) {
  std::printf("\n%-8s %-5s %-4s %-3s | %-12s %-12s %-6s | %-14s %-14s\n", "tokens", "H", "E", "k", "disp+comb",
              "memcpy D2D", "ratio", "plan us", "gemm_nt GFLOP/s");
  for (auto [T, H, E, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>{4096, 1024, 8, 2},
                            {16384, 2048, 64, 8},
                            {32768, 4096, 64, 6}}) {
    auto idx = random_experts(T, k, E, rng);
    const std::int64_t R = mk::moe_permuted_rows(T, k, E, 1);
    DeviceBuffer<std::int64_t> d_idx(idx), routed(E), counts(E), offsets(E + 1), dest(T * k), source(R), dropped(1);
    DeviceBuffer<unsigned char> ws(mk::moe_plan_workspace_bytes(T, k, E));
    auto plan = [&] {
      GPU_CHECK(mk::moe_plan_cuda(d_idx.ptr, T, k, E, -1, 1, routed.ptr, counts.ptr, offsets.ptr, dest.ptr, source.ptr,
                                  dropped.ptr, ws.ptr, nullptr));
    };
    const double plan_ms = time_ms(plan);
    DeviceBuffer<float> x(T * H), rows(R * H), y(T * H), w(T * k);
    GPU_CHECK(cudaMemset(x.ptr, 0, sizeof(float) * T * H));
    GPU_CHECK(cudaMemset(w.ptr, 0, sizeof(float) * T * k));
    const double dc_ms = time_ms([&] {
      GPU_CHECK(mk::moe_dispatch_cuda(x.ptr, source.ptr, nullptr, T, k, H, R, rows.ptr, nullptr));
      GPU_CHECK(mk::moe_combine_cuda(rows.ptr, dest.ptr, w.ptr, T, k, H, y.ptr, nullptr));
    });
    // Bytes moved: dispatch reads and writes R rows; combine reads R rows and
    // writes T rows. The ceiling is a memcpy moving as many bytes (read+write).
    const double bytes = 4.0 * H * (3.0 * R + T);
    const std::size_t copy_bytes = static_cast<std::size_t>(bytes / 2);
    DeviceBuffer<unsigned char> c0(copy_bytes), c1(copy_bytes);
    const double cp_ms =
        time_ms([&] { GPU_CHECK(cudaMemcpyAsync(c1.ptr, c0.ptr, copy_bytes, cudaMemcpyDeviceToDevice, nullptr)); });
    const std::int64_t D = H / 2;
    DeviceBuffer<float> Bw(E * D * H), C(R * D);
    GPU_CHECK(cudaMemset(Bw.ptr, 0, sizeof(float) * E * D * H));
    const double gemm_ms = time_ms(
        [&] { GPU_CHECK(mk::moe_grouped_gemm_nt_cuda(rows.ptr, Bw.ptr, offsets.ptr, R, E, D, H, C.ptr, nullptr)); }, 5);
    const double gbs = bytes / (dc_ms * 1e-3) / 1e9;
    const double cp_gbs = 2.0 * copy_bytes / (cp_ms * 1e-3) / 1e9;
    std::printf("%-8lld %-5lld %-4lld %-3lld | %8.1f GB/s %7.1f GB/s %6.2f | %10.1f %14.1f\n", (long long)T,
                (long long)H, (long long)E, (long long)k, gbs, cp_gbs, gbs / cp_gbs, plan_ms * 1e3,
                2.0 * R * D * H / (gemm_ms * 1e-3) / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("moerl_gpu_tests: no CUDA device, skipping\n");
    return 77;
  }
  cudaDeviceProp prop{};
  GPU_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("moerl_gpu_tests on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  std::mt19937 rng(1234);
  for (std::int64_t T : {1, 19, 99, 989}) {
    for (std::int64_t H : {7, 33, 130}) {
      check_case(T, H, 8, 2, 1, 0.0, 45, rng);
      check_case(T, H, 13, 3, 4, 1.0, 19, rng);
    }
  }
  check_case(989, 200, 64, 8, 1, 0.0, 96, rng);
  check_case(989, 200, 64, 6, 8, 1.25, 72, rng);
  // > 256 tiles of 256 assignments: the plan's per-expert scan runs several chunks.
  check_case(20011, 24, 64, 8, 1, 0.0, 40, rng);
  check_case(9001, 20, 16, 8, 4, 1.1, 12, rng);
  for (std::int64_t T : {1, 19, 99, 989}) {
    for (std::int64_t H : {7, 33, 130}) {
      check_case_bf16(T, H, 8, 2, 1, 0.0, 45, rng);
      check_case_bf16(T, H, 13, 3, 4, 1.0, 19, rng);
    }
  }
  check_case_bf16(989, 200, 64, 8, 1, 0.0, 96, rng);
  check_case_bf16(989, 200, 64, 6, 8, 1.25, 72, rng);
  if (g_failures) {
    std::fprintf(stderr, "moerl_gpu_tests: %d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("moerl_gpu_tests: all checks passed\n");
  if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) bench(rng);
  return 0;
}
