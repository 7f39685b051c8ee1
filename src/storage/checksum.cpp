#include "moerl/storage/checksum.h"

#include <array>
#include <cstdio>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define MOERL_CRC32C_X86 1
#endif

namespace moerl::storage {

namespace {

constexpr std::uint32_t kPolynomial = 0x82F63B78u;  // CRC-32C, reflected

using Tables = std::array<std::array<std::uint32_t, 256>, 8>;

Tables make_tables() {
  Tables tables{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    tables[0][i] = crc;
  }
  for (std::uint32_t i = 0; i < 256; ++i) {
    for (int t = 1; t < 8; ++t) tables[t][i] = (tables[t - 1][i] >> 8) ^ tables[0][tables[t - 1][i] & 0xFFu];
  }
  return tables;
}

const Tables& tables() {
  static const Tables instance = make_tables();
  return instance;
}

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

namespace {

#ifdef MOERL_CRC32C_X86
__attribute__((target("sse4.2"))) std::uint32_t crc32c_one_stream_sse42(const unsigned char* p, std::size_t n,
                                                             std::uint32_t crc) {
  std::uint64_t c = crc;
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  std::uint32_t c32 = static_cast<std::uint32_t>(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
#endif

#ifdef MOERL_CRC32C_X86
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

#endif

}  // namespace

std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t previous) {
  const Tables& t = tables();
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t crc = ~previous;
  while (bytes >= 8) {
    std::uint32_t low, high;
    std::memcpy(&low, p, 4);
    std::memcpy(&high, p + 4, 4);
    low ^= crc;  // little-endian hosts only (as is every target of moerl)
    crc = t[7][low & 0xFF] ^ t[6][(low >> 8) & 0xFF] ^ t[5][(low >> 16) & 0xFF] ^ t[4][low >> 24] ^
          t[3][high & 0xFF] ^ t[2][(high >> 8) & 0xFF] ^ t[1][(high >> 16) & 0xFF] ^ t[0][high >> 24];
    p += 8;
    bytes -= 8;
  }
  while (bytes-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFF];
  return ~crc;
}

bool crc32c_hardware_available() {
#ifdef MOERL_CRC32C_X86
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
#else
  return false;
#endif
}

std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t previous) {
#ifdef MOERL_CRC32C_X86
  if (crc32c_hardware_available())
    return ~crc_raw<false>(nullptr, static_cast<const unsigned char*>(data), bytes, ~previous);
#endif
  return crc32c_portable(data, bytes, previous);
}

std::uint32_t copy_with_crc32c(void* target, const void* source, std::size_t bytes, std::uint32_t previous) {
#ifdef MOERL_CRC32C_X86
  if (crc32c_hardware_available())
    return ~crc_raw<true>(static_cast<unsigned char*>(target), static_cast<const unsigned char*>(source), bytes,
                          ~previous);
#endif
  std::memcpy(target, source, bytes);
  return crc32c_portable(source, bytes, previous);
}

std::uint32_t crc32c_one_stream(const void* data, std::size_t bytes, std::uint32_t previous) {
#ifdef MOERL_CRC32C_X86
  if (crc32c_hardware_available())
    return ~crc32c_one_stream_sse42(static_cast<const unsigned char*>(data), bytes, ~previous);
#endif
  return crc32c_portable(data, bytes, previous);
}

std::string checksum_hex(std::uint32_t crc) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", crc);
  return text;
}

}  // namespace moerl::storage
