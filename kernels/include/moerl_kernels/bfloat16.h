#pragma once
// bfloat16 storage for the MoE kernels, shared by the CPU twins and the CUDA
// kernels (no LibTorch, no cuda_bf16.h: the CPU twins must build without
// CUDA). Layout-compatible with c10::BFloat16 and __nv_bfloat16 (the upper 16
// bits of an IEEE float), so adapters pass tensor data by reinterpret_cast.
//
// The kernels keep bf16 only as storage: every load widens to float, sums and
// products run in float, and each result is rounded to bf16 once on store.
// bf16 has an 8-bit significand (unit roundoff 2^-8 ~ 0.4%): summing k expert
// outputs, or scattering gradients, in bf16 would add one such rounding per
// term. The conversions below are plain bit operations, identical on host and
// device, and round to nearest even exactly as c10::BFloat16 does, so a CPU
// twin and its kernel see the same bits and LibTorch's casts agree with ours.

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOERL_HOST_DEVICE __host__ __device__
#else
#define MOERL_HOST_DEVICE
#endif

namespace moerl::kernels {

struct bfloat16 {
  std::uint16_t bits;
};
static_assert(sizeof(bfloat16) == 2, "bfloat16 must be two bytes");

MOERL_HOST_DEVICE inline float bf16_to_float(bfloat16 v) {
  const std::uint32_t u = static_cast<std::uint32_t>(v.bits) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Round to nearest, ties to even; NaN becomes the quiet NaN 0x7FC0 (as
// c10::BFloat16's scalar conversion does; its vectorised one may keep other
// NaN bits).
MOERL_HOST_DEVICE inline bfloat16 float_to_bf16(float f) {
#if defined(__CUDA_ARCH__)
  const std::uint32_t u = __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
#endif
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bfloat16{0x7FC0};
  const std::uint32_t bias = 0x7FFFu + ((u >> 16) & 1u);
  return bfloat16{static_cast<std::uint16_t>((u + bias) >> 16)};
}

// The type a kernel accumulates (and takes gate weights and gate gradients)
// in for a storage type: float for bf16, the type itself otherwise.
template <typename Scalar>
struct AccumOf {
  using type = Scalar;
};
template <>
struct AccumOf<bfloat16> {
  using type = float;
};
template <typename Scalar>
using accum_t = typename AccumOf<Scalar>::type;

// Storage -> accumulation type, and back (rounding once for bf16).
MOERL_HOST_DEVICE inline float widen(float v) { return v; }
MOERL_HOST_DEVICE inline double widen(double v) { return v; }
MOERL_HOST_DEVICE inline float widen(bfloat16 v) { return bf16_to_float(v); }

template <typename Scalar>
MOERL_HOST_DEVICE inline Scalar narrow(accum_t<Scalar> v) {
  return v;
}
template <>
MOERL_HOST_DEVICE inline bfloat16 narrow<bfloat16>(float v) {
  return float_to_bf16(v);
}

}  // namespace moerl::kernels
