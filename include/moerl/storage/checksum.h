#pragma once
// CRC-32C (Castagnoli), the checksum stored with every checkpoint dataset and
// sent with every weight-sync bucket.
//
// With SSE4.2 the crc32 instruction runs, on buffers of 12 KiB and more, as
// three independent streams over the three thirds of the buffer: one stream
// is bound by the instruction's latency (measured 7.3 GB/s on this project's
// EPYC cores, about as fast as reading a checkpoint from the page cache or a
// shared-memory MPI_Bcast), three keep its pipeline full (13-25 GB/s). The
// partial CRCs are joined by "shifting" a CRC over the bytes that follow it,
// a multiplication by a power of x mod the polynomial. Without SSE4.2, a
// slicing-by-8 table. Every path gives the same value.

#include <cstddef>
#include <cstdint>
#include <string>

namespace moerl::storage {

// CRC-32C of `bytes` bytes, continuing from `previous` (0 for a fresh checksum):
// crc32c(ab) == crc32c(b, crc32c(a)).
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t previous = 0);
// Copies `bytes` bytes from `source` to `target` (not overlapping) and returns
// their CRC-32C, continuing from `previous`: the bytes are read once, not twice.
std::uint32_t copy_with_crc32c(void* target, const void* source, std::size_t bytes, std::uint32_t previous = 0);
// The table-driven implementation (exposed so tests compare it with the hardware one).
std::uint32_t crc32c_portable(const void* data, std::size_t bytes, std::uint32_t previous = 0);
// One stream of the crc32 instruction (the baseline `moerl bench sync` compares with).
std::uint32_t crc32c_one_stream(const void* data, std::size_t bytes, std::uint32_t previous = 0);
bool crc32c_hardware_available();

// The CRC register (no pre/post inversion) `crc` carried over `bytes` zero
// bytes, i.e. crc * x^(8 bytes) mod P: how partial CRCs are joined.
std::uint32_t crc32c_shift(std::uint32_t crc, std::size_t bytes);

// "0x1a2b3c4d"
std::string checksum_hex(std::uint32_t crc);

}  // namespace moerl::storage
