// CRC-32C (ISA-L's crc32_iscsi behind moerl's API) against published check
// values and against the definition (a bit at a time), at lengths around
// ISA-L's kernel and moerl's copy-block boundaries, unaligned, continuing a
// running CRC, and for buffers over ISA-L's int length; the copying variant
// writes exactly what it reads.

#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moerl/storage/checksum.h"

using namespace moerl;

namespace {

// CRC-32C by its definition: reflected polynomial 0x82F63B78, register
// preset to all ones, result inverted.
std::uint32_t crc32c_by_definition(const std::uint8_t* p, std::size_t n, std::uint32_t previous = 0) {
  std::uint32_t reg = ~previous;
  for (std::size_t i = 0; i < n; ++i) {
    reg ^= p[i];
    for (int bit = 0; bit < 8; ++bit) reg = (reg >> 1) ^ ((reg & 1u) ? 0x82F63B78u : 0u);
  }
  return ~reg;
}

}  // namespace

TEST_CASE("CRC-32C gives the published check values", "[storage][checksum]") {
  const std::string digits = "123456789";
  CHECK(storage::crc32c(digits.data(), digits.size()) == 0xE3069283u);
  // RFC 3720 appendix B.4 (iSCSI): 32 zero bytes, 32 0xFF bytes, 0..31.
  std::vector<std::uint8_t> zeros(32, 0), ones(32, 0xFF), ramp(32);
  std::iota(ramp.begin(), ramp.end(), std::uint8_t{0});
  CHECK(storage::crc32c(zeros.data(), 32) == 0x8A9136AAu);
  CHECK(storage::crc32c(ones.data(), 32) == 0x62A8AB43u);
  CHECK(storage::crc32c(ramp.data(), 32) == 0x46DD794Eu);
  std::vector<std::uint8_t> target(32, 0);
  CHECK(storage::copy_with_crc32c(target.data(), ramp.data(), 32) == 0x46DD794Eu);
  CHECK(target == ramp);
  CHECK(storage::crc32c(nullptr, 0) == 0u);
  CHECK(storage::checksum_hex(0xE3069283u) == "0xe3069283");
}

TEST_CASE("CRC-32C equals its definition at every boundary", "[storage][checksum]") {
  std::mt19937 rng(11);
  std::vector<std::uint8_t> bytes(5 * 16384 + 64);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  const std::vector<size_t> lengths = {0,     1,     7,     8,     9,     15,    16,    63,    64,
                                       255,   256,   1023,  1024,  4095,  4096,  12287, 12288, 16383,
                                       16384, 16385, 24583, 32768, 32775, 40000, 61447, 81920};
  for (const size_t offset : {size_t{0}, size_t{3}}) {
    for (const size_t n : lengths) {
      for (const std::uint32_t previous : {0u, 0xDEADBEEFu}) {
        INFO("offset " << offset << " length " << n << " previous " << previous);
        const std::uint32_t expected = crc32c_by_definition(bytes.data() + offset, n, previous);
        CHECK(storage::crc32c(bytes.data() + offset, n, previous) == expected);
        std::vector<std::uint8_t> target(n + 1, 0xAB);
        CHECK(storage::copy_with_crc32c(target.data(), bytes.data() + offset, n, previous) == expected);
        CHECK(std::memcmp(target.data(), bytes.data() + offset, n) == 0);
        CHECK(target[n] == 0xAB);  // nothing written past the end
        // A checksum continued over the rest equals the one of the whole.
        CHECK(storage::crc32c(bytes.data() + offset + n / 3, n - n / 3,
                              storage::crc32c(bytes.data() + offset, n / 3, previous)) == expected);
      }
    }
  }
}

TEST_CASE("CRC-32C of a buffer over 2 GiB continues across ISA-L's int-sized calls", "[storage][checksum]") {
  // 2^31 + 5 bytes: more than one crc32_iscsi call can take. The bytes are a
  // repeating 1 MiB pattern, so the expected value is the pattern's CRC
  // continued 2048 times and then over 5 bytes.
  const std::size_t pattern_bytes = std::size_t{1} << 20, repeats = 2048;
  std::vector<std::uint8_t> big(pattern_bytes * repeats + 5);
  std::mt19937 rng(3);
  for (std::size_t i = 0; i < pattern_bytes; ++i) big[i] = static_cast<std::uint8_t>(rng());
  for (std::size_t r = 1; r < repeats; ++r) std::memcpy(big.data() + r * pattern_bytes, big.data(), pattern_bytes);
  std::memcpy(big.data() + repeats * pattern_bytes, big.data(), 5);
  std::uint32_t expected = 0;
  for (std::size_t r = 0; r < repeats; ++r) expected = storage::crc32c(big.data(), pattern_bytes, expected);
  expected = storage::crc32c(big.data(), 5, expected);
  CHECK(storage::crc32c(big.data(), big.size()) == expected);
}

TEST_CASE("CRC-32C detects a single flipped bit anywhere in a buffer", "[storage][checksum]") {
  std::vector<std::uint8_t> bytes(3 * 16384, 0x11);
  const std::uint32_t clean = storage::crc32c(bytes.data(), bytes.size());
  for (const size_t at : {size_t{5}, size_t{4096 + 17}, size_t{16384 + 4095}, size_t{3 * 16384 - 1}}) {
    bytes[at] ^= 0x04;
    CHECK(storage::crc32c(bytes.data(), bytes.size()) != clean);
    CHECK(storage::crc32c(bytes.data(), bytes.size()) == crc32c_by_definition(bytes.data(), bytes.size()));
    bytes[at] ^= 0x04;
  }
}
