#pragma once
// Small non-cryptographic hashes used across modules: the splitmix64
// finaliser (turns counters and seeds into well-mixed 64-bit values) and
// FNV-1a (fingerprints of configurations and weight layouts).

#include <cstddef>
#include <cstdint>

namespace moerl {

inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr std::uint64_t kFnv1aOffset = 1469598103934665603ull;

// Continues an FNV-1a hash over `size` bytes.
inline std::uint64_t fnv1a(const void* data, std::size_t size, std::uint64_t hash = kFnv1aOffset) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace moerl
