#pragma once
// CRC-32C of weight-sync buckets, fast enough to hide behind the broadcast.
//
// The single-stream crc32 instruction (storage::crc32c) is bound by its
// latency: measured 3.7 GB/s on this machine's EPYC cores, about the speed of
// a shared-memory MPI_Bcast, so checksumming every bucket on both sides cost
// as much as sending it. Three independent streams over the three thirds of
// a bucket keep the instruction's pipeline full (measured 9-13 GB/s); the
// three partial CRCs are joined by "shifting" a CRC over the bytes that
// follow it, a multiplication by a power of x mod the polynomial. The value
// is exactly storage::crc32c's.
//
// copy_with_crc32c() checksums while it copies (the publisher's snapshot):
// the bytes are read once instead of twice.

#include <cstddef>
#include <cstdint>

namespace moerl::sync {

// CRC-32C of `bytes` bytes, continuing from `previous` (as storage::crc32c).
std::uint32_t bucket_crc32c(const void* data, std::size_t bytes, std::uint32_t previous = 0);

// Copies `bytes` bytes from `source` to `target` (not overlapping) and returns
// the CRC-32C of them, continuing from `previous`.
std::uint32_t copy_with_crc32c(void* target, const void* source, std::size_t bytes, std::uint32_t previous = 0);

// The CRC register (no pre/post inversion) `crc` carried over `bytes` zero
// bytes, i.e. crc * x^(8 bytes) mod P: how partial CRCs are joined.
std::uint32_t crc32c_shift(std::uint32_t crc, std::size_t bytes);

// True when the three-stream SSE4.2 path is in use (otherwise the portable
// table code of storage::crc32c, and memcpy followed by it).
bool bucket_crc32c_accelerated();

}  // namespace moerl::sync
