#pragma once
// CRC-32C (Castagnoli), the checksum stored with every checkpoint dataset.
// Uses the SSE4.2 crc32 instruction where the CPU has it (about 8 GB/s per
// core, so verifying a checkpoint costs little next to reading it) and a
// slicing-by-8 table otherwise; both give the same value.

#include <cstddef>
#include <cstdint>
#include <string>

namespace moerl::storage {

// CRC-32C of `bytes` bytes, continuing from `previous` (0 for a fresh checksum):
// crc32c(ab) == crc32c(b, crc32c(a)).
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t previous = 0);
// The table-driven implementation (exposed so tests compare it with the hardware one).
std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t previous = 0);
bool crc32c_hardware_available();

// "0x1a2b3c4d"
std::string checksum_hex(std::uint32_t crc);

}  // namespace moerl::storage
