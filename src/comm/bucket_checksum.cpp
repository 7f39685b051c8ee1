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

#ifdef MOERL_BUCKET_CRC_X86
namespace {

// Each of the three streams covers this many bytes of a block. Large enough
// that the two shifts per block cost nothing; small enough that a 40 kB
// bucket still takes the fast path.
constexpr std::size_t kStream = 4096;
constexpr std::size_t kBlock = 3 * kStream;

// The CRC register (no pre/post inversion) after `zeros` zero bytes.
__attribute__((target("sse4.2"))) std::uint32_t feed_zeros(std::uint32_t crc, std::size_t zeros) {
  std::uint64_t c = crc;
  for (std::size_t i = 0; i < zeros; i += 8) c = _mm_crc32_u64(c, 0);
  return static_cast<std::uint32_t>(c);
}

// shift(v) = v * x^(8 kStream) mod P: the register v carried over kStream
// zero bytes. Linear in v, so one table per byte of v.
struct ShiftTables {
  std::array<std::array<std::uint32_t, 256>, 4> byte{};
  ShiftTables() {
    for (int j = 0; j < 4; ++j)
      for (std::uint32_t x = 0; x < 256; ++x) byte[j][x] = feed_zeros(x << (8 * j), kStream);
  }
  std::uint32_t shift(std::uint32_t v) const {
    return byte[0][v & 0xFF] ^ byte[1][(v >> 8) & 0xFF] ^ byte[2][(v >> 16) & 0xFF] ^ byte[3][v >> 24];
  }
};

const ShiftTables& shift_tables() {
  static const ShiftTables tables;
  return tables;
}

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
  const ShiftTables& tables = shift_tables();
  while (n >= kBlock) {
    std::uint64_t a = crc, b = 0, c = 0;
    for (std::size_t i = 0; i < kStream; i += 8) {
      const std::uint64_t x = load64(p + i), y = load64(p + kStream + i), z = load64(p + 2 * kStream + i);
      if (kCopy) {
        std::memcpy(target + i, &x, 8);
        std::memcpy(target + kStream + i, &y, 8);
        std::memcpy(target + 2 * kStream + i, &z, 8);
      }
      a = _mm_crc32_u64(a, x);
      b = _mm_crc32_u64(b, y);
      c = _mm_crc32_u64(c, z);
    }
    // crc(D1 D2 D3) = shift(shift(crc(D1)) ^ crc0(D2)) ^ crc0(D3)
    crc = tables.shift(tables.shift(static_cast<std::uint32_t>(a)) ^ static_cast<std::uint32_t>(b)) ^
          static_cast<std::uint32_t>(c);
    p += kBlock;
    n -= kBlock;
    if (kCopy) target += kBlock;
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
