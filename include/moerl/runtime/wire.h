#pragma once
// Little-endian binary encoding of message payloads. The reader checks every
// length against the bytes that remain, so a truncated or hostile payload
// becomes a WireError, never an out-of-bounds read or a huge allocation.

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "moerl/core/error.h"

namespace moerl::runtime {

class WireError : public Error {
 public:
  using Error::Error;
};

class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>, "put() takes plain numbers");
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &value, sizeof(T));  // x86/ARM hosts are little-endian
  }
  void put_string(const std::string& text);
  template <typename T>
  void put_vector(const std::vector<T>& values) {
    static_assert(std::is_arithmetic_v<T>, "put_vector() takes vectors of plain numbers");
    put<std::uint64_t>(values.size());
    const size_t at = bytes_.size();
    bytes_.resize(at + values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(bytes_.data() + at, values.data(), values.size() * sizeof(T));
  }
  void put_bytes(const void* data, size_t size);

  std::vector<std::uint8_t>& bytes() { return bytes_; }
  std::vector<std::uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<std::uint8_t> bytes_;
};

class ByteReader {
 public:
  ByteReader(const std::uint8_t* data, size_t size) : data_(data), size_(size) {}
  explicit ByteReader(const std::vector<std::uint8_t>& bytes) : ByteReader(bytes.data(), bytes.size()) {}

  template <typename T>
  T get() {
    static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>, "get() reads plain numbers");
    need(sizeof(T), "a number");
    T value;
    std::memcpy(&value, data_ + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  std::string get_string();
  template <typename T>
  std::vector<T> get_vector() {
    static_assert(std::is_arithmetic_v<T>, "get_vector() reads vectors of plain numbers");
    const auto count = get<std::uint64_t>();
    if (count > remaining() / sizeof(T)) fail("a vector of " + std::to_string(count) + " elements");
    std::vector<T> values(count);
    if (count) std::memcpy(values.data(), data_ + offset_, count * sizeof(T));
    offset_ += count * sizeof(T);
    return values;
  }
  void get_bytes(void* out, size_t size);

  size_t remaining() const { return size_ - offset_; }
  // Payloads must be consumed exactly: trailing bytes mean a format mismatch.
  void expect_end() const;

 private:
  void need(size_t bytes, const std::string& what) const {
    if (bytes > remaining()) fail(what);
  }
  [[noreturn]] void fail(const std::string& what) const;

  const std::uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

// CRC-32 (IEEE 802.3 polynomial), used to detect corrupted payloads.
std::uint32_t crc32(const void* data, size_t size, std::uint32_t seed = 0);

}  // namespace moerl::runtime
