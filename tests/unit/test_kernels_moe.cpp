// CPU twins of the MoE kernels at odd sizes: plan invariants, and each
// operator against an independent formulation (adjoint identities, dense
// per-row products). No LibTorch here.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "moerl_kernels/cpu_gemm.h"
#include "moerl_kernels/gemm_check.h"
#include "moerl_kernels/moe.h"

namespace mk = moerl::kernels;

namespace {

struct Plan {
  std::int64_t rows = 0;
  std::vector<std::int64_t> routed, counts, offsets, dest_row, row_source, dropped;
};

Plan make_plan(const std::vector<std::int64_t>& idx, std::int64_t T, std::int64_t k, std::int64_t E,
               std::int64_t capacity, std::int64_t block) {
  Plan p;
  p.rows = mk::moe_permuted_rows(T, k, E, block);
  p.routed.resize(E);
  p.counts.resize(E);
  p.offsets.resize(E + 1);
  p.dest_row.resize(T * k);
  p.row_source.resize(p.rows);
  p.dropped.resize(1);
  mk::moe_plan_cpu(idx.data(), T, k, E, capacity, block, p.routed.data(), p.counts.data(), p.offsets.data(),
                   p.dest_row.data(), p.row_source.data(), p.dropped.data());
  return p;
}

std::vector<std::int64_t> random_experts(std::int64_t T, std::int64_t k, std::int64_t E, std::mt19937& rng) {
  // Distinct experts per token (as top-k gives), skewed towards low ids.
  std::vector<std::int64_t> idx(T * k);
  std::vector<std::int64_t> perm(E);
  for (std::int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    for (std::int64_t j = 0; j < k; ++j) {
      std::uniform_int_distribution<std::int64_t> pick(j, std::min<std::int64_t>(E - 1, j + E / 2));
      std::swap(perm[j], perm[pick(rng)]);
      idx[t * k + j] = perm[j];
    }
  }
  return idx;
}

std::vector<double> random_vec(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

TEST_CASE("moe_plan_cpu: counts, offsets and permutation are consistent", "[kernels][moe]") {
  std::mt19937 rng(7);
  for (std::int64_t T : {1, 19, 99, 989}) {
    for (std::int64_t E : {1, 3, 8, 13}) {
      for (std::int64_t k : {1, 2, 3}) {
        if (k > E) continue;
        for (std::int64_t block : {1, 4}) {
          for (double cf : {0.0, 1.0}) {
            const std::int64_t cap = cf > 0 ? static_cast<std::int64_t>(std::ceil(cf * T * k / double(E))) : -1;
            auto idx = random_experts(T, k, E, rng);
            Plan p = make_plan(idx, T, k, E, cap, block);
            INFO("T=" << T << " E=" << E << " k=" << k << " block=" << block << " cap=" << cap);
            std::int64_t kept_total = 0, routed_total = 0;
            for (std::int64_t e = 0; e < E; ++e) {
              routed_total += p.routed[e];
              kept_total += p.counts[e];
              REQUIRE(p.counts[e] == (cap < 0 ? p.routed[e] : std::min(cap, p.routed[e])));
              REQUIRE(p.offsets[e] % block == 0);
              REQUIRE(p.offsets[e + 1] - p.offsets[e] >= p.counts[e]);
              REQUIRE(p.offsets[e + 1] - p.offsets[e] < p.counts[e] + block);
            }
            REQUIRE(routed_total == T * k);
            REQUIRE(p.dropped[0] == T * k - kept_total);
            REQUIRE(p.offsets[E] <= p.rows);
            std::vector<std::int64_t> seen(E, 0);
            for (std::int64_t a = 0; a < T * k; ++a) {
              const std::int64_t r = p.dest_row[a];
              if (r < 0) continue;
              REQUIRE(p.row_source[r] == a);
              REQUIRE(r >= p.offsets[idx[a]]);
              REQUIRE(r < p.offsets[idx[a]] + p.counts[idx[a]]);
              REQUIRE(r - p.offsets[idx[a]] == seen[idx[a]]);  // stable order
              ++seen[idx[a]];
            }
            std::int64_t sources = 0;
            for (std::int64_t r = 0; r < p.rows; ++r) sources += p.row_source[r] >= 0;
            REQUIRE(sources == kept_total);
          }
        }
      }
    }
  }
}

TEST_CASE("moe dispatch/combine CPU twins: values and adjointness", "[kernels][moe]") {
  std::mt19937 rng(11);
  for (std::int64_t T : {1, 19, 99, 989}) {
    for (std::int64_t H : {1, 7, 33, 130}) {
      const std::int64_t E = 6, k = 2, block = 3;
      const std::int64_t cap = static_cast<std::int64_t>(std::ceil(0.9 * T * k / double(E)));
      auto idx = random_experts(T, k, E, rng);
      Plan p = make_plan(idx, T, k, E, cap, block);
      auto x = random_vec(T * H, rng);
      auto w = random_vec(T * k, rng);
      auto g = random_vec(p.rows * H, rng);
      INFO("T=" << T << " H=" << H);

      std::vector<double> rows(p.rows * H);
      mk::moe_dispatch_cpu<double>(x.data(), p.row_source.data(), w.data(), T, k, H, p.rows, rows.data());
      for (std::int64_t r = 0; r < p.rows; ++r) {
        const std::int64_t a = p.row_source[r];
        for (std::int64_t h = 0; h < H; ++h) {
          const double want = a < 0 ? 0.0 : w[a] * x[(a / k) * H + h];
          REQUIRE(rows[r * H + h] == want);
        }
      }
      // <dispatch_w(x), g> == <x, combine_w(g)>: the two are each other's adjoint.
      std::vector<double> back(T * H);
      mk::moe_combine_cpu<double>(g.data(), p.dest_row.data(), w.data(), T, k, H, back.data());
      const double lhs = dot(rows, g), rhs = dot(x, back);
      REQUIRE(lhs == Approx(rhs).epsilon(1e-10).margin(1e-10));

      // gate gradient: d/dw <combine_w(g), y> = <y[t], g[dest]>, checked against combine.
      auto y = random_vec(T * H, rng);
      std::vector<double> gw(T * k);
      mk::moe_combine_gate_grad_cpu<double>(y.data(), g.data(), p.dest_row.data(), T, k, H, gw.data());
      std::vector<double> unit(T * k, 0.0), single(T * H);
      for (std::int64_t a : {std::int64_t{0}, T * k - 1, (T * k) / 2}) {
        std::fill(unit.begin(), unit.end(), 0.0);
        unit[a] = 1.0;
        mk::moe_combine_cpu<double>(g.data(), p.dest_row.data(), unit.data(), T, k, H, single.data());
        REQUIRE(gw[a] == Approx(dot(single, y)).epsilon(1e-10).margin(1e-12));
      }
      // float twin agrees with double.
      std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), rf(p.rows * H);
      mk::moe_dispatch_cpu<float>(xf.data(), p.row_source.data(), wf.data(), T, k, H, p.rows, rf.data());
      for (std::size_t i = 0; i < rf.size(); ++i) REQUIRE(rf[i] == Approx(rows[i]).margin(1e-5));
    }
  }
}

TEST_CASE("moe grouped GEMM CPU twins: per-row products and adjoints", "[kernels][moe]") {
  std::mt19937 rng(5);
  for (std::int64_t T : {1, 19, 99}) {
    for (auto [N, K] : {std::pair<std::int64_t, std::int64_t>{5, 7}, {33, 17}, {1, 130}}) {
      const std::int64_t E = 5, k = 2, block = 4;
      auto idx = random_experts(T, k, E, rng);
      Plan p = make_plan(idx, T, k, E, -1, block);
      const std::int64_t R = p.rows;
      INFO("T=" << T << " N=" << N << " K=" << K);
      auto A = random_vec(R * K, rng);
      auto B = random_vec(E * N * K, rng);
      std::vector<double> C(R * N);
      mk::moe_grouped_gemm_nt_cpu<double>(A.data(), B.data(), p.offsets.data(), R, E, N, K, C.data());
      for (std::int64_t r = 0; r < R; ++r) {
        std::int64_t e = -1;
        for (std::int64_t q = 0; q < E; ++q)
          if (r >= p.offsets[q] && r < p.offsets[q + 1]) e = q;
        for (std::int64_t n = 0; n < N; ++n) {
          double want = 0;
          if (e >= 0)
            for (std::int64_t q = 0; q < K; ++q) want += A[r * K + q] * B[(e * N + n) * K + q];
          REQUIRE(C[r * N + n] == Approx(want).epsilon(1e-12).margin(1e-12));
        }
      }
      // <nt(A,B), G> == <A, nn(G,B)> == <B, tn(G,A)>
      auto G = random_vec(R * N, rng);
      std::vector<double> dA(R * K), dB(E * N * K);
      mk::moe_grouped_gemm_nn_cpu<double>(G.data(), B.data(), p.offsets.data(), R, E, N, K, dA.data());
      mk::moe_grouped_gemm_tn_cpu<double>(G.data(), A.data(), p.offsets.data(), R, E, N, K, dB.data());
      const double base = dot(C, G);
      REQUIRE(dot(A, dA) == Approx(base).epsilon(1e-10).margin(1e-10));
      REQUIRE(dot(B, dB) == Approx(base).epsilon(1e-10).margin(1e-10));
    }
  }
}

TEST_CASE("moe_combine_cpu: many choices per token (k > 32) and drops", "[kernels][moe]") {
  std::mt19937 rng(3);
  const std::int64_t T = 19, E = 48, k = 40, H = 37;
  auto idx = random_experts(T, k, E, rng);
  const std::int64_t cap = 12;  // drops some assignments
  Plan p = make_plan(idx, T, k, E, cap, 1);
  REQUIRE(p.dropped[0] > 0);
  auto src = random_vec(p.rows * H, rng);
  auto w = random_vec(T * k, rng);
  std::vector<double> y(T * H);
  mk::moe_combine_cpu<double>(src.data(), p.dest_row.data(), w.data(), T, k, H, y.data());
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t h = 0; h < H; ++h) {
      double want = 0;
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int64_t r = p.dest_row[t * k + j];
        if (r >= 0) want += w[t * k + j] * src[r * H + h];
      }
      INFO("t=" << t << " h=" << h);
      REQUIRE(y[t * H + h] == Approx(want).epsilon(1e-12).margin(1e-12));
    }
  }
}

TEST_CASE("cpu_gemm: all transpose forms, wide leading dimensions, beta", "[kernels][moe]") {
  std::mt19937 rng(11);
  const std::int64_t m = 7, n = 5, k = 9, pad = 3;  // leading dimensions exceed the rows
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (double beta : {0.0, 1.0}) {
        INFO("trans_a=" << ta << " trans_b=" << tb << " beta=" << beta);
        const std::int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
        auto A = random_vec((ta ? k : m) * lda, rng);
        auto B = random_vec((tb ? n : k) * ldb, rng);
        auto C = random_vec(m * ldc, rng);
        const auto C0 = C;
        mk::cpu_gemm<double>(ta, tb, m, n, k, 0.5, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        for (std::int64_t i = 0; i < m; ++i) {
          for (std::int64_t j = 0; j < n; ++j) {
            double want = 0;
            for (std::int64_t p = 0; p < k; ++p)
              want += (ta ? A[p * lda + i] : A[i * lda + p]) * (tb ? B[j * ldb + p] : B[p * ldb + j]);
            want = 0.5 * want + beta * C0[i * ldc + j];
            REQUIRE(C[i * ldc + j] == Approx(want).epsilon(1e-12).margin(1e-12));
          }
          for (std::int64_t j = n; j < ldc; ++j) REQUIRE(C[i * ldc + j] == C0[i * ldc + j]);
        }
      }
    }
  }
}

TEST_CASE("cpu_gemm in float: every backend this build has agrees with a double product", "[kernels][moe]") {
  const mk::CpuGemmBackend chosen = mk::cpu_gemm_float_backend();
  std::vector<mk::CpuGemmBackend> backends{mk::CpuGemmBackend::Loop};
  if (mk::cpu_gemm_has_blas()) backends.push_back(mk::CpuGemmBackend::Blas);
  if (mk::cpu_gemm_has_onednn()) backends.push_back(mk::CpuGemmBackend::OneDnn);
  for (mk::CpuGemmBackend backend : backends) {
    INFO(mk::cpu_gemm_backend_name(backend));
    mk::set_cpu_gemm_float_backend(backend);
    REQUIRE(mk::cpu_gemm_float_backend() == backend);
    // Every transpose form, wide leading dimensions, beta 0 and 1, at odd sizes.
    CHECK(mk::cpu_gemm_float_relative_error() < 1e-5);
    // k == 0 only scales C by beta (oneDNN itself refuses k == 0).
    std::vector<float> C{1.0f, 2.0f, 3.0f, 4.0f};
    mk::cpu_gemm<float>(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, C.data(), 2);
    CHECK(C == std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f});
    mk::cpu_gemm<float>(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, C.data(), 2);
    CHECK(C == std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f});
  }
  if (!mk::cpu_gemm_has_onednn()) CHECK_THROWS(mk::set_cpu_gemm_float_backend(mk::CpuGemmBackend::OneDnn));
  mk::set_cpu_gemm_float_backend(chosen);
}

TEST_CASE("moe SwiGLU rows CPU kernels: forward formula, backward by finite differences", "[kernels][moe]") {
  std::mt19937 rng(13);
  for (std::int64_t n : {0, 1, 19}) {
    const std::int64_t H = 6, D = 5;
    INFO("n=" << n);
    auto x = random_vec(n * H, rng), wg = random_vec(D * H, rng), wu = random_vec(D * H, rng);
    auto wd = random_vec(H * D, rng), dy = random_vec(n * H, rng);
    auto forward = [&](std::vector<double>& gu, std::vector<double>& h, std::vector<double>& y) {
      gu.assign(n * 2 * D, 0), h.assign(n * D, 0), y.assign(n * H, 0);
      mk::moe_swiglu_forward_rows_cpu<double>(x.data(), wg.data(), wu.data(), wd.data(), n, H, D, gu.data(), h.data(),
                                              y.data());
    };
    std::vector<double> gu, h, y;
    forward(gu, h, y);
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t c = 0; c < H; ++c) {
        double want = 0;
        for (std::int64_t i = 0; i < D; ++i) {
          double g = 0, u = 0;
          for (std::int64_t q = 0; q < H; ++q) {
            g += x[r * H + q] * wg[i * H + q];
            u += x[r * H + q] * wu[i * H + q];
          }
          want += wd[c * D + i] * g / (1 + std::exp(-g)) * u;
        }
        REQUIRE(y[r * H + c] == Approx(want).epsilon(1e-12).margin(1e-12));
      }
    }
    std::vector<double> scratch(n * 2 * D), dx(n * H), dwg(D * H, 7), dwu(D * H, 7), dwd(H * D, 7);
    mk::moe_swiglu_backward_rows_cpu<double>(x.data(), gu.data(), h.data(), dy.data(), wg.data(), wu.data(), wd.data(),
                                             n, H, D, scratch.data(), dx.data(), dwg.data(), dwu.data(), dwd.data());
    // L = <dy, y>: central differences of L in every input against the gradients.
    auto loss = [&] {
      std::vector<double> g2, h2, y2;
      forward(g2, h2, y2);
      return dot(dy, y2);
    };
    auto check = [&](std::vector<double>& v, const std::vector<double>& grad, const char* name) {
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double keep = v[i], eps = 1e-6;
        v[i] = keep + eps;
        const double up = loss();
        v[i] = keep - eps;
        const double down = loss();
        v[i] = keep;
        INFO(name << "[" << i << "]");
        REQUIRE(grad[i] == Approx((up - down) / (2 * eps)).epsilon(1e-6).margin(1e-7));
      }
    };
    check(x, dx, "dx");
    check(wg, dwg, "dw_gate");
    check(wu, dwu, "dw_up");
    check(wd, dwd, "dw_down");
  }
}
