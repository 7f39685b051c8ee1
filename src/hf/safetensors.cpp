// The safetensors reader (memory-mapped, every field checked before use),
// writer and sharded-directory support.

#include "moerl/hf/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "moerl/core/json_value.h"
#include "moerl/core/json_writer.h"
#include "moerl/storage/atomic_file.h"

namespace moerl::hf {
namespace {

namespace fs = std::filesystem;

// A header longer than this is not a weight file (real ones are < 10 MB).
constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{100} << 20;
// Integers in the header are JSON numbers (doubles): exact up to 2^53.
constexpr double kMaxExactInteger = 9007199254740992.0;

[[noreturn]] void fail(const std::string& path, const std::string& message) {
  throw SafetensorsError(path + ": " + message);
}

[[noreturn]] void fail_tensor(const std::string& path, const std::string& tensor, const std::string& message) {
  throw SafetensorsError(path + ": tensor '" + tensor + "': " + message);
}

bool parse_dtype(const std::string& name, DType& out) {
  if (name == "F32")
    out = DType::F32;
  else if (name == "F16")
    out = DType::F16;
  else if (name == "BF16")
    out = DType::BF16;
  else
    return false;
  return true;
}

std::uint64_t exact_integer(const JsonValue& value, const std::string& path, const std::string& tensor,
                            const char* what) {
  if (value.kind() != JsonValue::Kind::Number) fail_tensor(path, tensor, std::string(what) + " must be a number");
  const double v = value.as_number();
  if (!(v >= 0) || v > kMaxExactInteger || std::floor(v) != v) {
    fail_tensor(path, tensor, std::string(what) + " must be a non-negative integer, got " + std::to_string(v));
  }
  return static_cast<std::uint64_t>(v);
}

TensorInfo parse_entry(const std::string& path, const std::string& name, const JsonValue& entry,
                       std::uint64_t data_bytes) {
  if (!entry.is_object()) fail_tensor(path, name, "header entry is not an object");
  TensorInfo t;
  t.name = name;
  const std::optional<JsonValue> dtype = entry.find("dtype");
  const std::optional<JsonValue> shape = entry.find("shape");
  const std::optional<JsonValue> offsets = entry.find("data_offsets");
  if (!dtype || !shape || !offsets) {
    fail_tensor(path, name, "header entry needs dtype, shape and data_offsets");
  }
  if (dtype->kind() != JsonValue::Kind::String) fail_tensor(path, name, "dtype must be a string");
  if (!parse_dtype(dtype->as_string(), t.dtype)) {
    fail_tensor(path, name, "dtype " + dtype->as_string() + " is not supported (F32, F16, BF16 are)");
  }
  if (shape->kind() != JsonValue::Kind::Array) fail_tensor(path, name, "shape must be an array");
  std::uint64_t numel = 1;
  for (const JsonValue& d : shape->as_array()) {
    const std::uint64_t extent = exact_integer(d, path, name, "shape entry");
    if (extent != 0 && numel > (std::uint64_t{1} << 62) / extent) fail_tensor(path, name, "shape overflows");
    numel *= extent;
    t.shape.push_back(static_cast<std::int64_t>(extent));
  }
  if (offsets->kind() != JsonValue::Kind::Array || offsets->as_array().size() != 2) {
    fail_tensor(path, name, "data_offsets must be [begin, end]");
  }
  const JsonArray range = offsets->as_array();
  t.begin = exact_integer(range[0], path, name, "data_offsets begin");
  t.end = exact_integer(range[1], path, name, "data_offsets end");
  if (t.begin > t.end) fail_tensor(path, name, "data_offsets begin > end");
  if (t.end > data_bytes) {
    fail_tensor(path, name,
                "data_offsets end " + std::to_string(t.end) + " lies past the data section (" +
                    std::to_string(data_bytes) + " bytes): the file is truncated or corrupt");
  }
  const std::uint64_t expected = numel * dtype_size(t.dtype);
  if (t.bytes() != expected) {
    fail_tensor(
        path, name,
        "holds " + std::to_string(t.bytes()) + " bytes but its shape and dtype need " + std::to_string(expected));
  }
  return t;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
  }
  return "?";
}

std::size_t dtype_size(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

// ------------------------------------------------------------------ reading

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail(path, std::string("cannot stat: ") + std::strerror(e));
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    fail(path, "is " + std::to_string(size_) + " bytes, shorter than the 8-byte header length: truncated");
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(path, std::string("cannot mmap: ") + std::strerror(map_errno));
  }
  try {
    const auto* bytes = static_cast<const std::uint8_t*>(map_);
    std::uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
    if (header_len > kMaxHeaderBytes || header_len > size_ - 8) {
      fail(path, "header length " + std::to_string(header_len) + " does not fit in the file (" + std::to_string(size_) +
                     " bytes): truncated or not a safetensors file");
    }
    data_start_ = 8 + header_len;
    JsonValue header;
    try {
      header = JsonValue::parse(std::string(reinterpret_cast<const char*>(bytes + 8), header_len));
    } catch (const JsonError& e) {
      fail(path, std::string("header is not valid JSON: ") + e.what());
    }
    if (!header.is_object()) fail(path, "header is not a JSON object");
    const std::uint64_t data_bytes = size_ - data_start_;
    for (const auto& [name, entry] : header.as_object()) {
      if (name == "__metadata__") {
        if (!entry.is_object()) fail(path, "__metadata__ is not an object");
        for (const auto& [key, value] : entry.as_object()) {
          if (value.kind() != JsonValue::Kind::String) fail(path, "__metadata__ value '" + key + "' is not a string");
          metadata_[key] = value.as_string();
        }
        continue;
      }
      tensors_.push_back(parse_entry(path, name, entry, data_bytes));
    }
    // File order, and no two tensors share a byte.
    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    for (std::size_t i = 1; i < tensors_.size(); ++i) {
      if (tensors_[i].begin < tensors_[i - 1].end) {
        fail_tensor(path, tensors_[i].name, "overlaps tensor '" + tensors_[i - 1].name + "'");
      }
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  } catch (...) {
    ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) fail_tensor(path_, name, "not in this file");
  return *t;
}

const std::uint8_t* SafetensorsFile::data(const TensorInfo& tensor) const {
  return static_cast<const std::uint8_t*>(map_) + data_start_ + tensor.begin;
}

// ------------------------------------------------------------------ conversion

namespace {

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1f;
  std::uint32_t mantissa = h & 0x3ff;
  std::uint32_t bits = 0;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf / NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // rebias 15 -> 127
  } else if (mantissa != 0) {
    // Subnormal half: normalise into a float32 normal.
    std::uint32_t e = 113;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mantissa & 0x3ff) << 13);
  } else {
    bits = sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

void to_float32(DType dtype, const void* src, std::size_t count, float* dst) {
  if (dtype == DType::F32) {
    std::memcpy(dst, src, count * 4);
    return;
  }
  const auto* in = static_cast<const std::uint8_t*>(src);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint16_t v;
    std::memcpy(&v, in + 2 * i, 2);  // unaligned-safe
    if (dtype == DType::BF16) {
      const std::uint32_t bits = static_cast<std::uint32_t>(v) << 16;
      std::memcpy(dst + i, &bits, 4);
    } else {
      dst[i] = half_to_float(v);
    }
  }
}

// ------------------------------------------------------------------ writing

std::uint64_t write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                const std::map<std::string, std::string>& metadata) {
  JsonWriter header;
  header.begin_object();
  if (!metadata.empty()) {
    header.key("__metadata__").begin_object();
    for (const auto& [k, v] : metadata) header.key(k).value(v);
    header.end_object();
  }
  std::uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name == "__metadata__" || t.name.empty()) fail(path, "invalid tensor name '" + t.name + "'");
    std::uint64_t numel = 1;
    for (std::int64_t d : t.shape) {
      if (d < 0) fail_tensor(path, t.name, "negative extent in shape " + shape_text(t.shape));
      numel *= static_cast<std::uint64_t>(d);
    }
    if (numel * dtype_size(t.dtype) != t.bytes) {
      fail_tensor(path, t.name,
                  "shape " + shape_text(t.shape) + " of " + dtype_name(t.dtype) + " needs " +
                      std::to_string(numel * dtype_size(t.dtype)) + " bytes, given " + std::to_string(t.bytes));
    }
    header.key(t.name).begin_object().key("dtype").value(dtype_name(t.dtype)).key("shape").begin_array();
    for (std::int64_t d : t.shape) header.value(d);
    header.end_array().key("data_offsets").begin_array();
    header.value(static_cast<std::int64_t>(offset)).value(static_cast<std::int64_t>(offset + t.bytes));
    header.end_array().end_object();
    offset += t.bytes;
  }
  header.end_object();
  std::string text = header.str();
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::string temp = storage::temporary_path_for(path);
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, "cannot create " + temp);
    std::uint8_t length[8];
    std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i, n >>= 8) length[i] = static_cast<std::uint8_t>(n & 0xff);
    out.write(reinterpret_cast<const char*>(length), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const TensorToWrite& t : tensors)
      out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.bytes));
    out.flush();
    if (!out) fail(path, "write failed (disk full?)");
  }
  storage::rename_durably(temp, path);
  return 8 + text.size() + offset;
}

// ------------------------------------------------------------------ directories

SafetensorsDirectory::SafetensorsDirectory(const std::string& dir) : dir_(dir) {
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  if (!fs::exists(index_path)) {
    if (!fs::exists(single_path)) {
      fail(dir, "no model.safetensors.index.json and no model.safetensors: not a Hugging Face model directory");
    }
    files_.push_back(std::make_unique<SafetensorsFile>(single_path.string()));
    for (const TensorInfo& t : files_.back()->tensors()) where_[t.name] = 0;
    return;
  }
  JsonValue index;
  try {
    index = JsonValue::parse(storage::read_whole_file(index_path.string()));
  } catch (const JsonError& e) {
    fail(index_path.string(), std::string("not valid JSON: ") + e.what());
  }
  const std::optional<JsonValue> weight_map = index.find("weight_map");
  if (!weight_map || !weight_map->is_object()) fail(index_path.string(), "has no weight_map object");
  std::map<std::string, std::size_t> file_number;
  for (const auto& [tensor, file] : weight_map->as_object()) {
    if (file.kind() != JsonValue::Kind::String) fail_tensor(index_path.string(), tensor, "file name is not a string");
    const std::string& name = file.as_string();
    if (name.find('/') != std::string::npos || name == "." || name == "..") {
      fail_tensor(index_path.string(), tensor, "file '" + name + "' is not a plain file name");
    }
    auto it = file_number.find(name);
    if (it == file_number.end()) {
      const fs::path shard = fs::path(dir) / name;
      if (!fs::exists(shard))
        fail_tensor(index_path.string(), tensor, "its file " + shard.string() + " does not exist");
      files_.push_back(std::make_unique<SafetensorsFile>(shard.string()));
      it = file_number.emplace(name, files_.size() - 1).first;
    }
    if (files_[it->second]->find(tensor) == nullptr) {
      fail_tensor(files_[it->second]->path(), tensor, "listed in model.safetensors.index.json but not in the file");
    }
    where_[tensor] = it->second;
  }
}

std::vector<std::string> SafetensorsDirectory::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : where_) names.push_back(name);
  return names;
}

const SafetensorsFile& SafetensorsDirectory::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) fail_tensor(dir_, name, "missing from the model's safetensors files");
  return *files_[it->second];
}

const std::uint8_t* SafetensorsDirectory::data(const std::string& name) const {
  const SafetensorsFile& file = file_of(name);
  return file.data(file.info(name));
}

std::uint64_t SafetensorsDirectory::total_bytes() const {
  std::uint64_t total = 0;
  for (const auto& [name, file] : where_) total += files_[file]->info(name).bytes();
  return total;
}

std::vector<std::string> write_sharded_safetensors(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                                                   std::uint64_t max_shard_bytes,
                                                   const std::map<std::string, std::string>& metadata) {
  // Greedy packing in the given order.
  std::vector<std::vector<TensorToWrite>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (const TensorToWrite& t : tensors) {
    if (!shards.back().empty() && in_shard + t.bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += t.bytes;
    total += t.bytes;
  }
  fs::create_directories(dir);
  const std::size_t n = shards.size();
  std::vector<std::string> names;
  JsonWriter index;
  index.begin_object().key("metadata").begin_object().key("total_size").value(static_cast<std::int64_t>(total));
  index.end_object().key("weight_map").begin_object();
  for (std::size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    names.push_back(name);
    write_safetensors((fs::path(dir) / name).string(), shards[i], metadata);
    for (const TensorToWrite& t : shards[i]) index.key(t.name).value(std::string(name));
  }
  index.end_object().end_object();
  storage::write_file_atomically((fs::path(dir) / "model.safetensors.index.json").string(), index.str() + "\n");
  return names;
}

}  // namespace moerl::hf
