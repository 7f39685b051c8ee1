#include "moerl/storage/checksum.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace moerl::storage {
namespace {

// crc32_iscsi takes an int length: longer buffers go in pieces of 1 GiB.
constexpr std::size_t kLargestCall = std::size_t{1} << 30;
// copy_with_crc32c's block: 16 KiB measured best (12.1 GB/s on a hot 4 MiB
// buffer against 11.1 at 64 KiB and 10.7 at 256 KiB; memcpy alone 13.5).
constexpr std::size_t kCopyBlock = std::size_t{16} << 10;

// ISA-L works on the CRC register without the standard's inversions.
std::uint32_t register_over(const unsigned char* p, std::size_t n, std::uint32_t reg) {
  while (n > 0) {
    const std::size_t piece = std::min(n, kLargestCall);
    reg = crc32_iscsi(const_cast<unsigned char*>(p), static_cast<int>(piece), reg);
    p += piece;
    n -= piece;
  }
  return reg;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t previous) {
  return ~register_over(static_cast<const unsigned char*>(data), bytes, ~previous);
}

std::uint32_t copy_with_crc32c(void* target, const void* source, std::size_t bytes, std::uint32_t previous) {
  auto* out = static_cast<unsigned char*>(target);
  const auto* in = static_cast<const unsigned char*>(source);
  std::uint32_t reg = ~previous;
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t block = std::min(kCopyBlock, bytes - done);
    std::memcpy(out + done, in + done, block);
    reg = register_over(out + done, block, reg);
    done += block;
  }
  return ~reg;
}

std::string checksum_hex(std::uint32_t crc) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", crc);
  return text;
}

}  // namespace moerl::storage
