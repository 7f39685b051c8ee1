#include "moerl/runtime/wire.h"

#include <array>

namespace moerl::runtime {

void ByteWriter::put_string(const std::string& text) {
  put<std::uint64_t>(text.size());
  put_bytes(text.data(), text.size());
}

void ByteWriter::put_bytes(const void* data, size_t size) {
  const size_t at = bytes_.size();
  bytes_.resize(at + size);
  if (size) std::memcpy(bytes_.data() + at, data, size);
}

std::string ByteReader::get_string() {
  const auto length = get<std::uint64_t>();
  need(length, "a string of " + std::to_string(length) + " bytes");
  std::string text(reinterpret_cast<const char*>(data_ + offset_), length);
  offset_ += length;
  return text;
}

void ByteReader::get_bytes(void* out, size_t size) {
  need(size, std::to_string(size) + " raw bytes");
  if (size) std::memcpy(out, data_ + offset_, size);
  offset_ += size;
}

void ByteReader::expect_end() const {
  if (remaining() != 0)
    throw WireError("payload has " + std::to_string(remaining()) + " unexpected trailing bytes after offset " +
                    std::to_string(offset_));
}

void ByteReader::fail(const std::string& what) const {
  throw WireError("payload truncated: needed " + what + " at offset " + std::to_string(offset_) + " but only " +
                  std::to_string(remaining()) + " bytes remain");
}

namespace {

std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

}  // namespace

std::uint32_t crc32(const void* data, size_t size, std::uint32_t seed) {
  static const std::array<std::uint32_t, 256> table = make_crc_table();
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  std::uint32_t c = seed ^ 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ bytes[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

}  // namespace moerl::runtime
