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

#ifdef MOERL_CRC32C_X86
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(const unsigned char* p, std::size_t n,
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
  if (crc32c_hardware_available()) {
    return ~crc32c_sse42(static_cast<const unsigned char*>(data), bytes, ~previous);
  }
#endif
  return crc32c_portable(data, bytes, previous);
}

std::string checksum_hex(std::uint32_t crc) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", crc);
  return text;
}

}  // namespace moerl::storage
