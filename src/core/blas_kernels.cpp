#include "moerl/core/blas_kernels.h"

#include "moerl_kernels/cpu_gemm.h"
#include "moerl_kernels/gemm_check.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

namespace moerl::blas {
namespace {

// The environment that carries the choice across execv and into child
// processes (env workers' environments, benchmark child jobs):
//   OPENBLAS_CORETYPE            what OpenBLAS loads (the user's or moerl's)
//   MOERL_BLAS_SELECTED          the core moerl set: OPENBLAS_CORETYPE equal to
//                                it means moerl's choice, not the user's
//   MOERL_BLAS_OPENBLAS_CHOICE   the core OpenBLAS had chosen by itself
//   MOERL_BLAS_FALLBACK          why moerl's choice was undone
// Two hooks let a test walk the paths this machine's CPU would not take:
//   MOERL_BLAS_TEST_PRETEND_CHOSEN=CORE  treat OpenBLAS's own choice as CORE
//   MOERL_BLAS_TEST_FAIL_CHECK=1         treat moerl's choice as failing the check
constexpr const char* kCoreType = "OPENBLAS_CORETYPE";
constexpr const char* kSelected = "MOERL_BLAS_SELECTED";
constexpr const char* kOpenBlasChoice = "MOERL_BLAS_OPENBLAS_CHOICE";
constexpr const char* kFallback = "MOERL_BLAS_FALLBACK";
constexpr const char* kPretendChosen = "MOERL_BLAS_TEST_PRETEND_CHOSEN";
constexpr const char* kFailCheck = "MOERL_BLAS_TEST_FAIL_CHECK";
// The same for oneDNN's sgemm in select_cpu_gemm.
constexpr const char* kGemmFailCheck = "MOERL_CPU_GEMM_TEST_FAIL_CHECK";

BlasInfo g_info;

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // cblas.h's enum values
using SgemmEntry = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                            int);

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

template <typename Fn>
Fn openblas_entry(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

std::string openblas_core() {
  auto corename = openblas_entry<char* (*)()>("openblas_get_corename");
  return corename ? corename() : "";
}

std::string openblas_library() {
  auto config = openblas_entry<char* (*)()>("openblas_get_config");
  if (!config) return "unknown (not OpenBLAS)";
  // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64": name and version.
  std::istringstream words(config());
  std::string name, version;
  words >> name >> version;
  return name + " " + version;
}

int openblas_threads() {
  // An OpenMP build (openblas_get_parallel() == 2, Debian's default
  // variant) runs each call on the calling thread's OpenMP team, which
  // at::set_num_threads sizes; its own count is only what it found at start-up.
  auto parallel = openblas_entry<int (*)()>("openblas_get_parallel");
  auto omp_threads = openblas_entry<int (*)()>("omp_get_max_threads");
  if (parallel && parallel() == 2 && omp_threads) return omp_threads();
  auto threads = openblas_entry<int (*)()>("openblas_get_num_threads");
  return threads ? threads() : 0;
}

// OpenBLAS's x86-64 cores by the widest vector instructions their kernels use.
std::optional<VectorLevel> core_level(const std::string& core) {
  static const std::vector<std::pair<const char*, VectorLevel>> kCores = {
      {"prescott", VectorLevel::Sse},      {"core2", VectorLevel::Sse},
      {"penryn", VectorLevel::Sse},        {"dunnington", VectorLevel::Sse},
      {"nehalem", VectorLevel::Sse},       {"atom", VectorLevel::Sse},
      {"nano", VectorLevel::Sse},          {"athlon", VectorLevel::Sse},
      {"opteron", VectorLevel::Sse},       {"opteron_sse3", VectorLevel::Sse},
      {"barcelona", VectorLevel::Sse},     {"bobcat", VectorLevel::Sse},
      {"sandybridge", VectorLevel::Avx},   {"bulldozer", VectorLevel::Avx},
      {"piledriver", VectorLevel::Avx},    {"steamroller", VectorLevel::Avx},
      {"excavator", VectorLevel::Avx},     {"haswell", VectorLevel::Avx2},
      {"zen", VectorLevel::Avx2},          {"skylakex", VectorLevel::Avx512},
      {"cooperlake", VectorLevel::Avx512}, {"sapphirerapids", VectorLevel::Avx512}};
  const std::string name = lower(core);
  for (const auto& [known, level] : kCores)
    if (name == known) return level;
  return std::nullopt;
}

const char* best_core_for(VectorLevel level) {
  switch (level) {
    case VectorLevel::Sse: return nullptr;  // nothing better to offer
    case VectorLevel::Avx: return "Sandybridge";
    case VectorLevel::Avx2: return "Haswell";
    // Not Cooperlake (SkylakeX's fp32 kernels plus bf16 ones): 0.3.21's
    // OPENBLAS_CORETYPE cannot force it ("Core not found: Cooperlake").
    case VectorLevel::Avx512: return "SkylakeX";
  }
  return nullptr;
}

// Replaces this process with a fresh start of the same binary and argv,
// under the environment set so far. Returns only when execv failed.
void restart_self(char** argv) { execv("/proc/self/exe", argv); }

// In a process started by moerl with its own core: does it hold?
std::string check_selected(const std::string& wanted) {
  const std::string loaded = openblas_core();
  if (lower(loaded) != lower(wanted))
    return "OpenBLAS loaded '" + loaded + "' when asked for '" + wanted + "' (a core this build lacks)";
  const std::optional<double> error = gemm_relative_error();
  if (!env_or_empty(kFailCheck).empty()) return "the GEMM check failed (" + std::string(kFailCheck) + " is set)";
  if (error && !(*error <= gemm_tolerance())) {
    std::ostringstream why;
    why << "its sgemm is off by " << *error << " (relative) from a double-precision product";
    return why.str();
  }
  return "";
}

void note(std::string choice, std::string warning = "") {
  g_info.choice = std::move(choice);
  g_info.warning = std::move(warning);
}

}  // namespace

const char* vector_level_name(VectorLevel level) {
  switch (level) {
    case VectorLevel::Sse: return "SSE";
    case VectorLevel::Avx: return "AVX";
    case VectorLevel::Avx2: return "AVX2";
    case VectorLevel::Avx512: return "AVX-512";
  }
  return "?";
}

VectorLevel detect_vector_level() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512cd");
  if (avx512) return VectorLevel::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VectorLevel::Avx2;
  if (__builtin_cpu_supports("avx")) return VectorLevel::Avx;
#endif
  return VectorLevel::Sse;
}

std::optional<std::string> better_core(const std::string& chosen_core, VectorLevel cpu) {
  const std::optional<VectorLevel> chosen = core_level(chosen_core);
  const char* best = best_core_for(cpu);
  if (!chosen || !best || *chosen >= cpu) return std::nullopt;
  // AVX2 kernels on an AVX-512 CPU are left alone: on Zen 4 they measured as
  // fast or faster (docs/performance.md). The loss worth a restart is a
  // fallback to SSE or AVX kernels, at a third to a half of the speed.
  if (*chosen >= VectorLevel::Avx2) return std::nullopt;
  return std::string(best);
}

std::vector<std::string> forcible_cores(VectorLevel cpu) {
  std::vector<std::string> cores = {"Prescott"};
  for (VectorLevel level : {VectorLevel::Avx, VectorLevel::Avx2, VectorLevel::Avx512})
    if (level <= cpu) cores.push_back(best_core_for(level));
  return cores;
}

bool sgemm(int m, int n, int k, const float* a, const float* b, float* c) {
  static const auto entry = openblas_entry<SgemmEntry>("cblas_sgemm");
  if (!entry) return false;
  entry(kRowMajor, kNoTrans, kNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  return true;
}

double gemm_tolerance() {
  // fp32 accumulation over k = 1000 terms is off by at most ~k * 6e-8 = 6e-5
  // of sum |a||b| in the worst case; a broken kernel is off by O(1).
  return 1e-3;
}

std::optional<double> gemm_relative_error() {
  auto sgemm = openblas_entry<SgemmEntry>("cblas_sgemm");
  if (!sgemm) return std::nullopt;
  // Odd sizes: edges of every register block, a row vector, k past one panel.
  const std::vector<moerl::kernels::GemmCheckCase> cases = {
      {67, 45, 129, false, false}, {1, 257, 33, false, true}, {255, 3, 511, true, false}, {130, 97, 1000, true, true}};
  const auto row_major = [sgemm](bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                                 float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                                 float beta, float* c, std::int64_t ldc) {
    sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, static_cast<int>(m), static_cast<int>(n),
          static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
          static_cast<int>(ldc));
  };
  return moerl::kernels::sgemm_relative_error(row_major, cases);
}

void select_kernels(char** argv) {
  g_info = BlasInfo{};
  const std::string core_type = env_or_empty(kCoreType);
  const std::string selected = env_or_empty(kSelected);
  const std::string openblas_choice = env_or_empty(kOpenBlasChoice);
  if (!core_type.empty() && core_type == selected) {
    const std::string failure = check_selected(selected);
    if (failure.empty()) {
      note(std::string("selected by moerl for ") + vector_level_name(detect_vector_level()) + ", OpenBLAS chose " +
           openblas_choice);
      return;
    }
    // Back to OpenBLAS's own choice, said in every process that inherits it.
    const std::string why = "moerl's choice " + selected + " was undone: " + failure;
    setenv(kCoreType, openblas_choice.c_str(), 1);
    setenv(kFallback, why.c_str(), 1);
    unsetenv(kSelected);
    restart_self(argv);
    note("OpenBLAS's choice", why + "; and restarting with OpenBLAS's choice failed: " + std::strerror(errno));
    return;
  }
  if (!core_type.empty()) {
    const std::string fallback = env_or_empty(kFallback);
    const std::string loaded = openblas_core();
    if (!fallback.empty()) {
      note("OpenBLAS's own choice", fallback);
    } else if (!loaded.empty() && lower(loaded) != lower(core_type)) {
      note("OpenBLAS's own choice", "OPENBLAS_CORETYPE=" + core_type +
                                        " is not a core this OpenBLAS can load; it chose " + loaded +
                                        " (see docs/performance.md)");
    } else {
      note("set by OPENBLAS_CORETYPE");
    }
    return;
  }
  std::string chosen = openblas_core();
  if (chosen.empty()) return;  // not OpenBLAS: nothing to choose
  if (const std::string pretend = env_or_empty(kPretendChosen); !pretend.empty()) chosen = pretend;
  const VectorLevel cpu = detect_vector_level();
  const std::optional<std::string> better = better_core(chosen, cpu);
  if (!better) {
    note(std::string("OpenBLAS's choice for ") + vector_level_name(cpu));
    return;
  }
  setenv(kCoreType, better->c_str(), 1);
  setenv(kSelected, better->c_str(), 1);
  setenv(kOpenBlasChoice, chosen.c_str(), 1);
  restart_self(argv);
  unsetenv(kCoreType);
  unsetenv(kSelected);
  unsetenv(kOpenBlasChoice);
  note("OpenBLAS's choice", "OpenBLAS chose " + chosen + " on an " + vector_level_name(cpu) + " CPU (" + *better +
                                " would be faster), and restarting with " + *better +
                                " failed: " + std::strerror(errno));
}

void select_cpu_gemm() {
  namespace k = moerl::kernels;
  k::CpuGemmBackend backend = k::cpu_gemm_float_backend();  // throws for a bad MOERL_CPU_GEMM
  const std::string how = env_or_empty("MOERL_CPU_GEMM").empty() ? "the default" : "MOERL_CPU_GEMM";
  g_info.cpu_gemm = k::cpu_gemm_backend_description(backend) + " (" + how;
  if (backend == k::CpuGemmBackend::OneDnn) {
    const double error = k::cpu_gemm_float_relative_error();
    const bool forced_to_fail = !env_or_empty(kGemmFailCheck).empty();
    if (forced_to_fail || !(error <= gemm_tolerance())) {
      std::ostringstream why;
      why << "oneDNN's sgemm failed the GEMM check (relative error " << error
          << (forced_to_fail ? std::string(", ") + kGemmFailCheck + " is set" : "")
          << "); moerl's kernels use BLAS instead";
      backend = k::cpu_gemm_has_blas() ? k::CpuGemmBackend::Blas : k::CpuGemmBackend::Loop;
      k::set_cpu_gemm_float_backend(backend);
      g_info.cpu_gemm = k::cpu_gemm_backend_description(backend) + " (oneDNN failed its check";
      g_info.cpu_gemm_warning = why.str();
    } else {
      g_info.cpu_gemm += "; checked";
    }
  }
  g_info.cpu_gemm += ")";
}

std::string cpu_gemm_summary() {
  if (g_info.cpu_gemm.empty())
    return moerl::kernels::cpu_gemm_backend_description(moerl::kernels::cpu_gemm_float_backend());
  return g_info.cpu_gemm;
}

BlasInfo blas_info() {
  BlasInfo info = g_info;
  info.library = openblas_library();
  info.core = openblas_core();
  info.threads = openblas_threads();
  return info;
}

std::string blas_summary() {
  const BlasInfo info = blas_info();
  if (info.core.empty()) return info.library;
  std::ostringstream text;
  text << info.library << " (core " << info.core << ", " << info.threads
       << (info.threads == 1 ? " thread" : " threads");
  if (!info.choice.empty()) text << "; " << info.choice;
  text << ")";
  return text.str();
}

}  // namespace moerl::blas
