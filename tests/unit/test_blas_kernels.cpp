// The BLAS core choice (include/moerl/core/blas_kernels.h): which OpenBLAS
// core moerl forces for a CPU, and when it leaves OpenBLAS's choice alone.
#include <catch2/catch.hpp>

#include "moerl/core/blas_kernels.h"

using moerl::blas::better_core;
using moerl::blas::VectorLevel;

TEST_CASE("an SSE3 fallback on an AVX-512 CPU gets the AVX-512 kernels", "[blas]") {
  // Debian's OpenBLAS 0.3.21 on Intel Sapphire Rapids: "Prescott".
  CHECK(better_core("Prescott", VectorLevel::Avx512) == std::optional<std::string>("SkylakeX"));
  CHECK(better_core("prescott", VectorLevel::Avx2) == std::optional<std::string>("Haswell"));
  CHECK(better_core("Nehalem", VectorLevel::Avx) == std::optional<std::string>("Sandybridge"));
  CHECK(better_core("Sandybridge", VectorLevel::Avx512) == std::optional<std::string>("SkylakeX"));
  CHECK(better_core("Bulldozer", VectorLevel::Avx2) == std::optional<std::string>("Haswell"));
}

TEST_CASE("a core as good as the CPU allows is left alone", "[blas]") {
  // Cooperlake's fp32 kernels are SkylakeX's (it adds bf16 ones).
  CHECK_FALSE(better_core("Cooperlake", VectorLevel::Avx512));
  CHECK_FALSE(better_core("SkylakeX", VectorLevel::Avx512));
  CHECK_FALSE(better_core("SapphireRapids", VectorLevel::Avx512));
  CHECK_FALSE(better_core("Zen", VectorLevel::Avx2));
  CHECK_FALSE(better_core("Haswell", VectorLevel::Avx2));
  // AVX2 kernels on an AVX-512 CPU: as fast on Zen 4, so not worth a restart.
  CHECK_FALSE(better_core("Haswell", VectorLevel::Avx512));
  CHECK_FALSE(better_core("Zen", VectorLevel::Avx512));
  // A CPU without AVX has nothing better than SSE kernels.
  CHECK_FALSE(better_core("Prescott", VectorLevel::Sse));
  // A core newer than the CPU claims (the user's choice, or a table gap) is not downgraded.
  CHECK_FALSE(better_core("SkylakeX", VectorLevel::Avx2));
}

TEST_CASE("a core this table does not know is left alone", "[blas]") {
  CHECK_FALSE(better_core("NeoverseN1", VectorLevel::Sse));
  CHECK_FALSE(better_core("SomeFutureLake", VectorLevel::Avx512));
  CHECK_FALSE(better_core("", VectorLevel::Avx512));
}

TEST_CASE("the CPU's vector level has a name", "[blas]") {
  const VectorLevel level = moerl::blas::detect_vector_level();
  CHECK(std::string(moerl::blas::vector_level_name(level)).size() >= 3);
}
