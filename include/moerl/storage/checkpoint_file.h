#pragma once
// One checkpoint shard file: named arrays plus attributes, in HDF5.
//
// The format knows nothing about tensors or models: a caller (the learner)
// hands over raw bytes with a dtype and a shape under names it chooses
// ("model/layers.0.attn.wq", "optimizer/adam_m/...", "rng/rank3", "state/cursor"),
// and scalar or string attributes (learner step, policy version, the resolved
// config TOML, metrics at save).
//
// File layout:
//   /<array name>                  one contiguous dataset per array;
//                                  attributes "dtype" (name) and "crc32c"
//   / attributes "_format", "_version", "_rank", "_num_shards",
//                "_arrays" (names, one a line), "_array_table" (name, dtype,
//                shape and checksum, one array a line; absent in files
//                written before 7 Dec 2026), "_header_crc32c"
//   / attributes not starting with '_': the caller's attributes
// The header checksum covers the identity, every array's name, dtype, shape and
// checksum, and every caller attribute; each dataset's checksum covers its bytes.
// HDF5 itself checksums its metadata (newest file format).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "moerl/core/check.h"
#include "moerl/storage/hdf5_file.h"

namespace moerl::storage {

// A checkpoint that is missing, incomplete, corrupt, or does not match what the caller expects.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

enum class DType { Float32, Float64, Int64, UInt8, BFloat16 };  // BFloat16: raw uint16 bits

const char* dtype_name(DType dtype);  // "float32", ..., "bfloat16"
std::optional<DType> dtype_from_name(const std::string& name);
std::size_t dtype_size(DType dtype);

using Shape = std::vector<std::int64_t>;     // {} = scalar (one element)
std::string shape_text(const Shape& shape);  // "[2, 3]"
std::int64_t element_count(const Shape& shape);

// What a caller expects to find (for a config-vs-checkpoint compatibility check).
struct ArraySpec {
  std::string name;
  DType dtype = DType::Float32;
  Shape shape;
};

// What a checkpoint holds.
struct ArrayInfo {
  std::string name;
  DType dtype = DType::Float32;
  Shape shape;
  std::uint32_t checksum = 0;  // CRC-32C of the bytes
  std::uint64_t bytes = 0;
  // Where the bytes start in the file, stored exactly as in memory (from the
  // "_array_offsets" header attribute); empty where HDF5 must read them.
  std::optional<std::uint64_t> file_offset;
};

using AttributeValue = std::variant<std::string, std::int64_t, double>;
using Attributes = std::map<std::string, AttributeValue>;

// Names of the attributes moerl's learner writes (others are free-form).
namespace attribute_key {
constexpr const char* kLearnerStep = "learner_step";
constexpr const char* kPolicyVersion = "policy_version";
constexpr const char* kProgramVersion = "program_version";  // set by the writer
constexpr const char* kCreatedUnix = "created_unix";        // set by the writer
constexpr const char* kConfigToml = "config_toml";
constexpr const char* kMetricPrefix = "metric.";  // "metric.reward_mean" -> listed as metrics
}  // namespace attribute_key

// "moerl X.Y.Z": what writers store under attribute_key::kProgramVersion.
std::string program_version();

// Which shard of which version a file is.
struct ShardIdentity {
  std::int64_t version = 0;
  int rank = 0;
  int num_shards = 1;
};

// The identity in a shard file's header, without the array checks of a
// CheckpointReader: what completing a version needs to know of each shard.
ShardIdentity read_shard_identity(const std::string& path);

// ---------------------------------------------------------------------------
// Fault injection: make a save stop at a named point, as a killed process
// would, to test that a crash never leaves a half checkpoint that looks whole.
enum class FaultPoint {
  None,
  AfterData,     // shard arrays written, attributes not, temporary file not flushed
  BeforeRename,  // shard complete and fsynced under its temporary name
  BeforeIndex,   // every shard renamed into place, the version index not written
  BeforeLatest,  // version complete (index written), `latest` not moved
};
enum class FaultAction { Throw, Exit };  // Exit: _exit(kFaultExitStatus), no cleanup at all

constexpr int kFaultExitStatus = 86;

class InjectedFault : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

struct FaultInjection {
  FaultPoint point = FaultPoint::None;
  FaultAction action = FaultAction::Throw;

  // "after-data", "before-rename", "before-index", "before-latest", optionally ":exit"
  // (default ":throw"); "" or "none" = no fault. Throws CheckpointError on other text.
  static FaultInjection parse(const std::string& text);
  // From the environment variable MOERL_CHECKPOINT_FAULT (unset = none).
  static FaultInjection from_environment();
  // Stops here when `reached` is the configured point.
  void at(FaultPoint reached, const std::string& where) const;
};

const char* fault_point_name(FaultPoint point);

// ---------------------------------------------------------------------------
// Writes one shard file. Nothing appears under final_path until commit():
// the data goes to a hidden temporary file beside it, which commit() flushes,
// fsyncs and renames into place (then fsyncs the directory). A writer
// destroyed without commit() removes its temporary file.
class CheckpointWriter {
 public:
  CheckpointWriter(std::string final_path, ShardIdentity identity = {}, FaultInjection faults = {});
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Names: [A-Za-z0-9_.:-] components separated by '/', not starting with '_'.
  // `bytes` must equal element_count(shape) * dtype_size(dtype).
  void add_array(const std::string& name, DType dtype, const Shape& shape, const void* data, std::size_t bytes);
  // Attribute names: [A-Za-z0-9_.:-], not starting with '_'. Setting one again replaces it.
  void set_attribute(const std::string& name, AttributeValue value);
  void set_attributes(const Attributes& attributes);

  // Finishes the file and moves it into place; returns its size in bytes.
  std::uint64_t commit();

  const std::string& final_path() const { return final_path_; }
  const std::string& temporary_path() const { return temporary_path_; }

 private:
  std::string final_path_;
  std::string temporary_path_;
  ShardIdentity identity_;
  FaultInjection faults_;
  std::optional<h5::File> file_;
  std::vector<ArrayInfo> arrays_;
  Attributes attributes_;
  bool committed_ = false;
};

// ---------------------------------------------------------------------------
// Reads one shard file. The constructor checks the header (format, identity,
// the list of arrays against the datasets present, the header checksum);
// every read checks the dataset's stored type and shape against the header
// and its bytes against their checksum. Every error names the file and the
// dataset.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path);

  const std::string& path() const { return path_; }
  const ShardIdentity& identity() const { return identity_; }
  const std::vector<ArrayInfo>& arrays() const { return arrays_; }
  const Attributes& attributes() const { return attributes_; }

  const ArrayInfo* find(const std::string& name) const;  // nullptr when absent
  const ArrayInfo& info(const std::string& name) const;  // throws when absent

  bool has_attribute(const std::string& name) const { return attributes_.count(name) > 0; }
  std::string string_attribute(const std::string& name) const;  // throw when absent or of another type
  std::int64_t int_attribute(const std::string& name) const;
  double double_attribute(const std::string& name) const;

  // The array's bytes, checksum verified.
  std::vector<std::uint8_t> read(const std::string& name) const;
  void read_into(const std::string& name, void* out, std::size_t bytes) const;
  // As read(name), after checking dtype and shape against `expected`.
  std::vector<std::uint8_t> read(const ArraySpec& expected) const;

  // Every array of `expected` must be present with that dtype and shape; one
  // error lists every difference.
  void check_arrays(const std::vector<ArraySpec>& expected) const;
  // Reads every array and verifies its checksum; returns the bytes read.
  std::uint64_t verify_all() const;

 private:
  void read_array_table(const std::vector<std::string>& listed);
  void read_array_offsets();
  ArrayInfo read_array_attributes(const std::string& name) const;
  void check_layout(const ArrayInfo& info, const h5::DatasetLayout& layout, bool shape_too) const;
  bool read_at_offset_matches(const ArrayInfo& a, void* out, const std::string& where) const;
  std::uint32_t read_through_hdf5(const ArrayInfo& a, void* out, const std::string& where) const;
  std::uint32_t read_raw_with_crc32c(int fd, std::uint64_t offset, void* out, std::size_t bytes,
                                     const std::string& where) const;

  std::string path_;
  h5::File file_;
  std::optional<int> descriptor_;  // file_'s own, for reads past HDF5 (h5::File::posix_descriptor)
  ShardIdentity identity_;
  std::vector<ArrayInfo> arrays_;
  Attributes attributes_;
};

}  // namespace moerl::storage
