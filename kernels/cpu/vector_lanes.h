#pragma once
// GCC vectors of 16 floats for the CPU kernels' reductions: one AVX-512
// register, two AVX2 ones or four SSE ones, whichever target_clones clone
// the helpers are inlined into. A sum kept in 16 lanes and folded in halves
// at the end vectorises without reassociation; a plain serial sum costs one
// add's latency per element, and plain lane arrays left their final fold to
// scalar code through the stack. Internal to kernels/cpu.

#include <cstdint>
#include <cstring>

// GCC notes, at every use in a baseline (non-AVX-512) clone, that passing a
// 64-byte vector by value changes the ABI. These helpers are always inlined,
// so no call crosses that boundary: the note is off for the kernel files
// that include this header.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace moerl::kernels::lanes {

using Float16 = float __attribute__((vector_size(64)));
using Float8 = float __attribute__((vector_size(32)));
using Float4 = float __attribute__((vector_size(16)));

[[gnu::always_inline]] inline Float16 load16(const float* at) {
  Float16 lanes;
  std::memcpy(&lanes, at, sizeof lanes);
  return lanes;
}

[[gnu::always_inline]] inline float fold_sum(Float16 lanes) {
  const Float8 half = __builtin_shufflevector(lanes, lanes, 0, 1, 2, 3, 4, 5, 6, 7) +
                      __builtin_shufflevector(lanes, lanes, 8, 9, 10, 11, 12, 13, 14, 15);
  const Float4 quarter =
      __builtin_shufflevector(half, half, 0, 1, 2, 3) + __builtin_shufflevector(half, half, 4, 5, 6, 7);
  return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}

}  // namespace moerl::kernels::lanes
