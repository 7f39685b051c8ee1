#pragma once
// A small RAII layer over the HDF5 C API (serial, 1.10+): files, groups,
// datasets and attributes. Every H5 call is checked; a failure throws
// moerl::BackendError ("HDF5") whose text names the file, the object and the
// operation, followed by HDF5's own error stack. HDF5's automatic printing of
// that stack to stderr is switched off, so nothing is printed twice.
//
// Object paths are relative to the root ("model/layer0.w"); "/" is the root.

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moerl/core/error.h"

namespace moerl::storage::h5 {

// Owns one HDF5 identifier and closes it with the matching H5*close call.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& other) noexcept;
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; returns false when HDF5 reported an error while closing.
  bool reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Turns HDF5's automatic error printing off for this process (idempotent).
void silence_error_printing();
// The current HDF5 error stack of this thread as one line ("" when empty); clears it.
std::string take_error_stack();
[[noreturn]] void throw_failure(const std::string& file, const std::string& object, const char* operation,
                                const char* source_file, int source_line);

enum class AttributeKind { String, Int64, Float64, Other };

// The layout of one dataset as stored.
struct DatasetLayout {
  std::vector<hsize_t> dims;  // empty for a scalar dataspace
  H5T_class_t type_class = H5T_NO_CLASS;
  std::size_t type_size = 0;
  bool type_signed = false;
};

// Where a dataset's element bytes lie (HDF5 address), when a reader may copy
// them as they are: stored contiguously (so unfiltered), allocated, in the
// same type and byte order as the memory type asked for. Otherwise
// `raw_offset` is empty and the data goes through H5Dread.
struct DatasetExtent {
  DatasetLayout layout;
  std::optional<std::uint64_t> raw_offset;
};

class File {
 public:
  // Creates (truncating) a file with the newest format, so that HDF5 checksums its own metadata.
  static File create(const std::string& path);
  static File open(const std::string& path, bool writable = false);

  File(File&&) = default;
  File& operator=(File&&) = default;

  const std::string& path() const { return path_; }
  hid_t id() const { return handle_.get(); }
  void flush();
  // Closes the file (every object handle of this wrapper is already closed).
  void close();

  // True when every component of `object` exists ("a/b/c").
  bool exists(const std::string& object) const;
  void create_groups(const std::string& group);  // with the intermediate groups
  void delete_link(const std::string& object);

  // Writes a whole contiguous dataset; its parent groups are created as
  // needed. Returns where its bytes start in the file when they are stored
  // exactly as `data` holds them (file type = memory type, space allocated):
  // what a reader may pread (see posix_descriptor).
  std::optional<std::uint64_t> write_dataset(const std::string& name, hid_t file_type, hid_t memory_type,
                                             const std::vector<hsize_t>& dims, bool scalar, const void* data);
  DatasetLayout dataset_layout(const std::string& name) const;
  // The layout of `name` and, for a reader of `memory_type`, where its raw bytes are (see DatasetExtent).
  DatasetExtent dataset_extent(const std::string& name, hid_t memory_type) const;
  // The POSIX descriptor HDF5 reads this file through (the default sec2
  // driver), for pread at a DatasetExtent's offset; empty for other drivers
  // and for a file with a user block, where HDF5 addresses are not file
  // positions. It stays HDF5's: valid until close(), never closed or seeked.
  std::optional<int> posix_descriptor() const;
  // Reads a whole dataset into `out` (`bytes` must equal elements * size of memory_type).
  void read_dataset(const std::string& name, hid_t memory_type, void* out, std::size_t bytes) const;
  // Every object without children, as paths without the leading '/', sorted:
  // each dataset, and any group left empty (which a well-formed moerl file
  // never has, so a caller that expects datasets sees it as a stray name).
  std::vector<std::string> leaf_object_names() const;

  void set_attribute(const std::string& object, const std::string& name, const std::string& value);
  void set_attribute(const std::string& object, const std::string& name, std::int64_t value);
  void set_attribute(const std::string& object, const std::string& name, double value);
  bool has_attribute(const std::string& object, const std::string& name) const;
  AttributeKind attribute_kind(const std::string& object, const std::string& name) const;
  std::string string_attribute(const std::string& object, const std::string& name) const;
  std::int64_t int_attribute(const std::string& object, const std::string& name) const;
  double double_attribute(const std::string& object, const std::string& name) const;
  std::vector<std::string> attribute_names(const std::string& object) const;  // sorted

 private:
  File(std::string path, Handle handle) : path_(std::move(path)), handle_(std::move(handle)) {}
  [[noreturn]] void fail(const std::string& object, const char* operation, int line) const;
  Handle open_attribute(const std::string& object, const std::string& name) const;
  DatasetLayout layout_of(hid_t dataset, hid_t type, const std::string& name) const;
  void replace_attribute(const std::string& object, const std::string& name, hid_t type, hid_t space, const void* data,
                         hid_t memory_type);

  std::string path_;
  Handle handle_;
};

}  // namespace moerl::storage::h5
