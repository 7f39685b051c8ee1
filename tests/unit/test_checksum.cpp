// The weight-sync CRC-32C (three interleaved streams joined by CRC
// shifts) against published CRC-32C vectors and the table-driven reference,
// at every length around the block and stream boundaries.

#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moerl/storage/checksum.h"

using namespace moerl;

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
}

TEST_CASE("CRC-32C equals the table-driven CRC-32C at every boundary", "[storage][checksum]") {
  // The fast path splits buffers of 12288 bytes or more into three streams
  // (multiples of 8 bytes) and a tail; lengths around that, with odd tails,
  // unaligned starts and a running CRC.
  std::mt19937 rng(11);
  std::vector<std::uint8_t> bytes(5 * 12288 + 64);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  const std::vector<size_t> lengths = {0,     1,     7,     8,     9,     4095,  4096,  12287, 12288,
                                       12289, 12295, 24576, 24583, 36864, 40000, 61440, 61447};
  for (const size_t offset : {size_t{0}, size_t{3}}) {
    for (const size_t n : lengths) {
      for (const std::uint32_t previous : {0u, 0xDEADBEEFu}) {
        INFO("offset " << offset << " length " << n << " previous " << previous);
        const std::uint32_t expected = storage::crc32c_portable(bytes.data() + offset, n, previous);
        CHECK(storage::crc32c(bytes.data() + offset, n, previous) == expected);
        CHECK(storage::crc32c_one_stream(bytes.data() + offset, n, previous) == expected);
        std::vector<std::uint8_t> target(n + 1, 0xAB);
        CHECK(storage::copy_with_crc32c(target.data(), bytes.data() + offset, n, previous) == expected);
        CHECK(std::memcmp(target.data(), bytes.data() + offset, n) == 0);
        CHECK(target[n] == 0xAB);  // nothing written past the end
      }
    }
  }
}

TEST_CASE("a CRC shift equals feeding zero bytes", "[storage][checksum]") {
  const std::vector<std::uint8_t> zeros(100000, 0);
  for (const std::uint32_t reg : {1u, 0x80000000u, 0x12345678u, 0xFFFFFFFFu})
    for (const size_t n : {size_t{0}, size_t{1}, size_t{8}, size_t{4095}, size_t{33333}, size_t{100000}}) {
      // storage::crc32c inverts before and after: undo both to get the register.
      const std::uint32_t fed = ~storage::crc32c_portable(zeros.data(), n, ~reg);
      CHECK(storage::crc32c_shift(reg, n) == fed);
    }
}

TEST_CASE("CRC-32C detects a single flipped bit anywhere in a block", "[storage][checksum]") {
  std::vector<std::uint8_t> bytes(3 * 12288, 0x11);
  const std::uint32_t clean = storage::crc32c(bytes.data(), bytes.size());
  // One position in each stream of the first block, and in the last block.
  for (const size_t at : {size_t{5}, size_t{4096 + 17}, size_t{8192 + 4095}, size_t{2 * 12288 + 9000}}) {
    bytes[at] ^= 0x04;
    CHECK(storage::crc32c(bytes.data(), bytes.size()) != clean);
    CHECK(storage::crc32c(bytes.data(), bytes.size()) == storage::crc32c_portable(bytes.data(), bytes.size()));
    bytes[at] ^= 0x04;
  }
}
