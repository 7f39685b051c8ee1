// (in src/comm, next to weight_sync.cpp, so that it builds into moerl_core)
#include "moerl/sync/bucket_checksum.h"

#include <array>
#include <cstring>

#include "moerl/storage/checksum.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define MOERL_BUCKET_CRC_X86 1
#endif

namespace moerl::sync {
namespace {

constexpr std::uint32_t kPolynomial = 0x82F63B78u;  // CRC-32C, reflected

// Polynomials mod P in the reflected form of CRC registers: bit 31 is x^0.
std::uint32_t multiply_mod_p(std::uint32_t a, std::uint32_t b) {
  std::uint32_t product = 0;
  for (std::uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ kPolynomial : b >> 1;  // b *= x
  }
  return product;
}

// x^(2^k) mod P for k = 0..63 (enough for any buffer below 2^60 bytes).
struct PowersOfX {
  std::array<std::uint32_t, 64> x_2k{};
  PowersOfX() {
    x_2k[0] = 1u << 30;  // x^1
    for (std::size_t k = 1; k < x_2k.size(); ++k) x_2k[k] = multiply_mod_p(x_2k[k - 1], x_2k[k - 1]);
  }
};

const PowersOfX& powers() {
  static const PowersOfX table;
  return table;
}

}  // namespace

// The register `crc` carried over `bytes` zero bytes: crc * x^(8 bytes) mod P.
std::uint32_t crc32c_shift(std::uint32_t crc, std::size_t bytes) {
  const PowersOfX& p = powers();
  std::uint32_t x_n = 1u << 31;  // x^0
  for (std::size_t k = 3; bytes != 0; bytes >>= 1, ++k)
    if (bytes & 1) x_n = multiply_mod_p(p.x_2k[k], x_n);
  return multiply_mod_p(x_n, crc);
}

#ifdef MOERL_BUCKET_CRC_X86
namespace {

// Below this many bytes one stream is as fast (the joins would not pay).
constexpr std::size_t kThreeStreamMinimum = 3 * 4096;

std::uint64_t load64(const unsigned char* p) {
  std::uint64_t word;
  std::memcpy(&word, p, 8);
  return word;
}

// One implementation for both entry points: `target` is null when only
// checksumming. Works on the raw register.
template <bool kCopy>
__attribute__((target("sse4.2"))) std::uint32_t crc_raw(unsigned char* target, const unsigned char* p, std::size_t n,
                                                        std::uint32_t crc) {
  if (n >= kThreeStreamMinimum) {
    // Three long streams (thirds of the buffer) keep the prefetchers on
    // sequential runs; short streams jumping every few pages measured slower.
    const std::size_t third = n / 3 / 8 * 8;
    std::uint64_t a = crc, b = 0, c = 0;
    const unsigned char* p1 = p + third;
    const unsigned char* p2 = p + 2 * third;
    for (std::size_t i = 0; i < third; i += 8) {
      const std::uint64_t x = load64(p + i), y = load64(p1 + i), z = load64(p2 + i);
      if (kCopy) {
        std::memcpy(target + i, &x, 8);
        std::memcpy(target + third + i, &y, 8);
        std::memcpy(target + 2 * third + i, &z, 8);
      }
      a = _mm_crc32_u64(a, x);
      b = _mm_crc32_u64(b, y);
      c = _mm_crc32_u64(c, z);
    }
    // crc(D1 D2 D3) = shift(shift(crc(D1)) ^ crc0(D2)) ^ crc0(D3), each shift over one third.
    crc = crc32c_shift(crc32c_shift(static_cast<std::uint32_t>(a), third) ^ static_cast<std::uint32_t>(b), third) ^
          static_cast<std::uint32_t>(c);
    p += 3 * third;
    n -= 3 * third;
    if (kCopy) target += 3 * third;
  }
  std::uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint64_t x = load64(p);
    if (kCopy) {
      std::memcpy(target, &x, 8);
      target += 8;
    }
    c = _mm_crc32_u64(c, x);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; --n, ++p) {
    if (kCopy) *target++ = *p;
    c32 = _mm_crc32_u8(c32, *p);
  }
  return c32;
}

}  // namespace
#endif

bool bucket_crc32c_accelerated() {
#ifdef MOERL_BUCKET_CRC_X86
  return storage::crc32c_hardware_available();
#else
  return false;
#endif
}

std::uint32_t bucket_crc32c(const void* data, std::size_t bytes, std::uint32_t previous) {
#ifdef MOERL_BUCKET_CRC_X86
  if (bucket_crc32c_accelerated())
    return ~crc_raw<false>(nullptr, static_cast<const unsigned char*>(data), bytes, ~previous);
#endif
  return storage::crc32c(data, bytes, previous);
}

std::uint32_t copy_with_crc32c(void* target, const void* source, std::size_t bytes, std::uint32_t previous) {
#ifdef MOERL_BUCKET_CRC_X86
  if (bucket_crc32c_accelerated())
    return ~crc_raw<true>(static_cast<unsigned char*>(target), static_cast<const unsigned char*>(source), bytes,
                          ~previous);
#endif
  std::memcpy(target, source, bytes);
  return storage::crc32c(source, bytes, previous);
}

}  // namespace moerl::sync
