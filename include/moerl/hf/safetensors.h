#pragma once
// Reading and writing the safetensors format (Hugging Face's weight files):
//
//   [8 bytes: little-endian u64 N][N bytes: JSON header][data]
//   header = { "<tensor>": {"dtype": "F32"|"F16"|"BF16"|..., "shape": [...],
//                           "data_offsets": [begin, end]}, ...,
//              "__metadata__": {"<key>": "<string>", ...} }   (optional)
//   offsets are relative to the start of the data section.
//
// The reader memory-maps the file and checks everything before handing out
// a byte: header length and JSON, every dtype, shape and offset pair, that
// each tensor's byte count is numel * element size, that the tensors lie in
// the data section and do not overlap. Errors name the file and the tensor.
// No LibTorch here: this is part of moerl_core.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moerl/core/error.h"

namespace moerl::hf {

class SafetensorsError : public Error {
 public:
  using Error::Error;
};

// The dtypes moerl reads and writes. Others (I64, F64, ...) are recognised
// by name so that the error can say which one a file holds.
enum class DType { F32, F16, BF16 };

const char* dtype_name(DType dtype);  // "F32", "F16", "BF16"
std::size_t dtype_size(DType dtype);  // bytes per element

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets into the data section
  std::uint64_t end = 0;

  std::int64_t numel() const;
  std::uint64_t bytes() const { return end - begin; }
};

// One .safetensors file, memory-mapped read-only for the object's lifetime.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::uint64_t file_bytes() const { return size_; }

  const TensorInfo* find(const std::string& name) const;  // nullptr when absent
  const TensorInfo& info(const std::string& name) const;  // throws, naming file and tensor
  // The tensor's bytes inside the mapping (valid while this object lives).
  const std::uint8_t* data(const TensorInfo& tensor) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t data_start_ = 0;  // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: its bytes are borrowed until write_safetensors returns.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  std::size_t bytes = 0;  // must equal numel * element size
};

// Writes one file (through a temporary name and rename, so a crash leaves no
// half-written file under `path`). Tensors keep the given order; the header
// is padded with spaces to a multiple of 8 bytes so the data is aligned.
// Returns the file size.
std::uint64_t write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                                const std::map<std::string, std::string>& metadata = {});

// A model directory's weights: model.safetensors.index.json (its weight_map
// names the file of every tensor) or, without an index, one model.safetensors.
// Opening checks that every file of the index exists and holds the tensors
// the index assigns to it.
class SafetensorsDirectory {
 public:
  explicit SafetensorsDirectory(const std::string& dir);

  const std::string& directory() const { return dir_; }
  std::vector<std::string> tensor_names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  // The file that holds `name` and its entry; throws naming the directory.
  const SafetensorsFile& file_of(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const { return file_of(name).info(name); }
  const std::uint8_t* data(const std::string& name) const;
  std::uint64_t total_bytes() const;  // tensor bytes over all files
  std::size_t num_files() const { return files_.size(); }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::size_t> where_;  // tensor -> files_ index
};

// Writes tensors as model-0000i-of-0000n.safetensors shards of at most
// `max_shard_bytes` of tensor data each (a larger tensor gets a shard of its
// own) plus model.safetensors.index.json. Returns the shard file names.
std::vector<std::string> write_sharded_safetensors(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                                                   std::uint64_t max_shard_bytes,
                                                   const std::map<std::string, std::string>& metadata = {});

// Converts `count` elements of `dtype` at `src` to float32 (F16: IEEE half
// with subnormals, infinities and NaN; BF16: the upper half of a float32).
void to_float32(DType dtype, const void* src, std::size_t count, float* dst);

}  // namespace moerl::hf
