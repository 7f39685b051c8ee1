#include "moerl/storage/hdf5_file.h"

#include <algorithm>
#include <mutex>
#include <sstream>

namespace moerl::storage::h5 {

namespace {

std::string object_label(const std::string& object) { return object.empty() || object == "/" ? "/" : "/" + object; }

std::string absolute(const std::string& object) {
  if (object.empty() || object == "/") return "/";
  return object.front() == '/' ? object : "/" + object;
}

herr_t collect_error(unsigned /*index*/, const H5E_error2_t* error, void* data) {
  auto* lines = static_cast<std::vector<std::string>*>(data);
  std::string text = error->desc ? error->desc : "";
  if (text.empty() && error->func_name) text = error->func_name;
  if (!text.empty() && std::find(lines->begin(), lines->end(), text) == lines->end()) {
    lines->push_back(text);
  }
  return 0;
}

herr_t collect_attribute_name(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}

herr_t collect_link(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}

}  // namespace

// ---------------------------------------------------------------------------
Handle::Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = H5I_INVALID_HID; }

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    closer_ = other.closer_;
    other.id_ = H5I_INVALID_HID;
  }
  return *this;
}

bool Handle::reset() {
  bool ok = true;
  if (id_ >= 0 && closer_ != nullptr) ok = closer_(id_) >= 0;
  id_ = H5I_INVALID_HID;
  return ok;
}

void silence_error_printing() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

std::string take_error_stack() {
  std::vector<std::string> lines;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &lines);
  H5Eclear2(H5E_DEFAULT);
  std::string text;
  for (const auto& line : lines) text += (text.empty() ? "" : "; ") + line;
  return text;
}

void throw_failure(const std::string& file, const std::string& object, const char* operation, const char* source_file,
                   int source_line) {
  std::string detail = "file '" + file + "', object '" + object_label(object) + "'";
  const std::string stack = take_error_stack();
  if (!stack.empty()) detail += ": " + stack;
  throw BackendError("HDF5", operation, detail, source_file, source_line);
}

// Checks one HDF5 call (negative = failure) against this file and object.
#define MOERL_H5_CALL(call, object)                            \
  ([&]() {                                                     \
    auto moerl_h5_result_ = (call);                            \
    if (moerl_h5_result_ < 0) fail((object), #call, __LINE__); \
    return moerl_h5_result_;                                   \
  }())

void File::fail(const std::string& object, const char* operation, int line) const {
  throw_failure(path_, object, operation, __FILE__, line);
}

// ---------------------------------------------------------------------------
namespace {

// Arrays of at least kAlignedBytes start at a multiple of kAlignment in the
// file. The kernel copies between the page cache and a buffer at about half
// speed when the file offset and the buffer are not aligned alike (measured
// here: 194 MB read into a 64-byte-aligned buffer at 11.7 GB/s from a
// page-aligned offset, 8.3 GB/s from offset 16 mod 64), and tensors are
// 64-byte aligned. The padding is at most 4 KiB per large array.
constexpr hsize_t kAlignedBytes = hsize_t{64} << 10;
constexpr hsize_t kAlignment = 4096;

// Property lists shared by create and open: the newest file format (HDF5
// checksums its own metadata there, so a flipped byte in a header is caught
// too), strong close (closing the file closes everything in it) and the
// alignment of large arrays (for files created or written).
Handle file_access_list(const std::string& path) {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.valid() || H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST) < 0 ||
      H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG) < 0 ||
      H5Pset_alignment(fapl.get(), kAlignedBytes, kAlignment) < 0) {
    throw_failure(path, "/", "H5Pcreate(H5P_FILE_ACCESS)", __FILE__, __LINE__);
  }
  return fapl;
}

}  // namespace

File File::create(const std::string& path) {
  silence_error_printing();
  Handle fapl = file_access_list(path);
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (id < 0) throw_failure(path, "/", "H5Fcreate", __FILE__, __LINE__);
  return File(path, Handle(id, H5Fclose));
}

File File::open(const std::string& path, bool writable) {
  silence_error_printing();
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.valid() || H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG) < 0) {
    throw_failure(path, "/", "H5Pcreate(H5P_FILE_ACCESS)", __FILE__, __LINE__);
  }
  const hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.get());
  if (id < 0) throw_failure(path, "/", "H5Fopen", __FILE__, __LINE__);
  return File(path, Handle(id, H5Fclose));
}

void File::flush() { MOERL_H5_CALL(H5Fflush(id(), H5F_SCOPE_GLOBAL), "/"); }

void File::close() {
  if (!handle_.valid()) return;
  if (!handle_.reset()) fail("/", "H5Fclose", __LINE__);
}

bool File::exists(const std::string& object) const {
  const std::string full = absolute(object);
  if (full == "/") return true;
  // H5Lexists fails (instead of answering false) when an intermediate group is
  // missing, so walk the path one component at a time.
  std::size_t pos = 1;
  while (true) {
    const std::size_t slash = full.find('/', pos);
    const std::string prefix = full.substr(0, slash);
    if (MOERL_H5_CALL(H5Lexists(id(), prefix.c_str(), H5P_DEFAULT), object) <= 0) return false;
    if (slash == std::string::npos) return true;
    if (MOERL_H5_CALL(H5Oexists_by_name(id(), prefix.c_str(), H5P_DEFAULT), object) <= 0) return false;
    pos = slash + 1;
  }
}

void File::create_groups(const std::string& group) {
  if (group.empty() || group == "/" || exists(group)) return;
  Handle lcpl(MOERL_H5_CALL(H5Pcreate(H5P_LINK_CREATE), group), H5Pclose);
  MOERL_H5_CALL(H5Pset_create_intermediate_group(lcpl.get(), 1), group);
  Handle created(MOERL_H5_CALL(H5Gcreate2(id(), absolute(group).c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), group),
                 H5Gclose);
}

void File::delete_link(const std::string& object) {
  MOERL_H5_CALL(H5Ldelete(id(), absolute(object).c_str(), H5P_DEFAULT), object);
}

std::optional<std::uint64_t> File::write_dataset(const std::string& name, hid_t file_type, hid_t memory_type,
                                                 const std::vector<hsize_t>& dims, bool scalar, const void* data) {
  const std::size_t slash = name.rfind('/');
  if (slash != std::string::npos) create_groups(name.substr(0, slash));
  Handle space(scalar ? MOERL_H5_CALL(H5Screate(H5S_SCALAR), name)
                      : MOERL_H5_CALL(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), name),
               H5Sclose);
  Handle dataset(MOERL_H5_CALL(H5Dcreate2(id(), absolute(name).c_str(), file_type, space.get(), H5P_DEFAULT,
                                          H5P_DEFAULT, H5P_DEFAULT),
                               name),
                 H5Dclose);
  bool empty = false;
  for (hsize_t d : dims) empty = empty || d == 0;
  if (!empty) MOERL_H5_CALL(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), name);
  std::optional<std::uint64_t> raw_offset;
  const haddr_t offset = empty ? HADDR_UNDEF : H5Dget_offset(dataset.get());
  if (offset == HADDR_UNDEF) {
    H5Eclear2(H5E_DEFAULT);
  } else if (MOERL_H5_CALL(H5Tequal(file_type, memory_type), name) > 0) {
    raw_offset = static_cast<std::uint64_t>(offset);
  }
  if (!dataset.reset()) fail(name, "H5Dclose", __LINE__);
  return raw_offset;
}

DatasetLayout File::dataset_layout(const std::string& name) const {
  Handle dataset(MOERL_H5_CALL(H5Dopen2(id(), absolute(name).c_str(), H5P_DEFAULT), name), H5Dclose);
  Handle type(MOERL_H5_CALL(H5Dget_type(dataset.get()), name), H5Tclose);
  return layout_of(dataset.get(), type.get(), name);
}

DatasetExtent File::dataset_extent(const std::string& name, hid_t memory_type) const {
  Handle dataset(MOERL_H5_CALL(H5Dopen2(id(), absolute(name).c_str(), H5P_DEFAULT), name), H5Dclose);
  Handle type(MOERL_H5_CALL(H5Dget_type(dataset.get()), name), H5Tclose);
  DatasetExtent extent;
  extent.layout = layout_of(dataset.get(), type.get(), name);
  // H5Dget_offset is HADDR_UNDEF for chunked and compact layouts and for
  // space not yet allocated.
  const haddr_t offset = H5Dget_offset(dataset.get());
  if (offset == HADDR_UNDEF) {
    H5Eclear2(H5E_DEFAULT);
    return extent;
  }
  if (MOERL_H5_CALL(H5Tequal(type.get(), memory_type), name) > 0)
    extent.raw_offset = static_cast<std::uint64_t>(offset);
  return extent;
}

std::optional<int> File::posix_descriptor() const {
  // H5Dget_offset counts from the HDF5 base address, which is the start of
  // the file only without a user block.
  Handle creation(MOERL_H5_CALL(H5Fget_create_plist(id()), "/"), H5Pclose);
  hsize_t user_block = 0;
  MOERL_H5_CALL(H5Pget_userblock(creation.get(), &user_block), "/");
  if (user_block != 0) return std::nullopt;
  Handle access(MOERL_H5_CALL(H5Fget_access_plist(id()), "/"), H5Pclose);
  if (MOERL_H5_CALL(H5Pget_driver(access.get()), "/") != H5FD_SEC2) return std::nullopt;
  void* handle = nullptr;
  MOERL_H5_CALL(H5Fget_vfd_handle(id(), access.get(), &handle), "/");
  if (handle == nullptr) return std::nullopt;
  return *static_cast<int*>(handle);
}

DatasetLayout File::layout_of(hid_t dataset, hid_t type, const std::string& name) const {
  Handle space(MOERL_H5_CALL(H5Dget_space(dataset), name), H5Sclose);
  DatasetLayout layout;
  const int rank = MOERL_H5_CALL(H5Sget_simple_extent_ndims(space.get()), name);
  layout.dims.resize(static_cast<std::size_t>(rank));
  if (rank > 0) MOERL_H5_CALL(H5Sget_simple_extent_dims(space.get(), layout.dims.data(), nullptr), name);
  layout.type_class = MOERL_H5_CALL(H5Tget_class(type), name);
  layout.type_size = H5Tget_size(type);
  if (layout.type_size == 0) fail(name, "H5Tget_size", __LINE__);
  if (layout.type_class == H5T_INTEGER) layout.type_signed = MOERL_H5_CALL(H5Tget_sign(type), name) == H5T_SGN_2;
  return layout;
}

void File::read_dataset(const std::string& name, hid_t memory_type, void* out, std::size_t bytes) const {
  Handle dataset(MOERL_H5_CALL(H5Dopen2(id(), absolute(name).c_str(), H5P_DEFAULT), name), H5Dclose);
  Handle space(MOERL_H5_CALL(H5Dget_space(dataset.get()), name), H5Sclose);
  const hssize_t elements = MOERL_H5_CALL(H5Sget_simple_extent_npoints(space.get()), name);
  const std::size_t element_size = H5Tget_size(memory_type);
  if (static_cast<std::size_t>(elements) * element_size != bytes) {
    throw Error("HDF5 file '" + path_ + "', dataset '" + object_label(name) + "': holds " + std::to_string(elements) +
                " elements of " + std::to_string(element_size) + " bytes, the reader expected " +
                std::to_string(bytes) + " bytes");
  }
  if (elements == 0) return;
  MOERL_H5_CALL(H5Dread(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out), name);
}

std::vector<std::string> File::leaf_object_names() const {
  // Links only: H5Ovisit reads every object header to learn its type, which
  // took 2.3-2.7 of a 174-array checkpoint header's 2.8 ms; the links alone
  // take 0.5 ms, and a group is the one name another name extends by '/'.
  std::vector<std::string> links;
  MOERL_H5_CALL(H5Lvisit(id(), H5_INDEX_NAME, H5_ITER_INC, collect_link, &links), "/");
  std::sort(links.begin(), links.end());
  std::vector<std::string> leaves;
  for (const std::string& name : links) {
    const std::string children = name + "/";
    const auto next = std::lower_bound(links.begin(), links.end(), children);
    if (next == links.end() || next->compare(0, children.size(), children) != 0) leaves.push_back(name);
  }
  return leaves;
}

// ---------------------------------------------------------------------------
void File::replace_attribute(const std::string& object, const std::string& name, hid_t type, hid_t space,
                             const void* data, hid_t memory_type) {
  const std::string where = object_label(object) + " attribute " + name;
  const std::string path = absolute(object);
  if (MOERL_H5_CALL(H5Aexists_by_name(id(), path.c_str(), name.c_str(), H5P_DEFAULT), where) > 0) {
    MOERL_H5_CALL(H5Adelete_by_name(id(), path.c_str(), name.c_str(), H5P_DEFAULT), where);
  }
  Handle attribute(MOERL_H5_CALL(H5Acreate_by_name(id(), path.c_str(), name.c_str(), type, space, H5P_DEFAULT,
                                                   H5P_DEFAULT, H5P_DEFAULT),
                                 where),
                   H5Aclose);
  MOERL_H5_CALL(H5Awrite(attribute.get(), memory_type, data), where);
}

void File::set_attribute(const std::string& object, const std::string& name, const std::string& value) {
  const std::string where = object_label(object) + " attribute " + name;
  // Fixed-length, NUL-padded: size 0 is not allowed, so "" is stored as one NUL.
  Handle type(MOERL_H5_CALL(H5Tcopy(H5T_C_S1), where), H5Tclose);
  MOERL_H5_CALL(H5Tset_size(type.get(), std::max<std::size_t>(value.size(), 1)), where);
  MOERL_H5_CALL(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), where);
  MOERL_H5_CALL(H5Tset_cset(type.get(), H5T_CSET_UTF8), where);
  Handle space(MOERL_H5_CALL(H5Screate(H5S_SCALAR), where), H5Sclose);
  std::string padded = value;
  if (padded.empty()) padded.push_back('\0');
  replace_attribute(object, name, type.get(), space.get(), padded.data(), type.get());
}

void File::set_attribute(const std::string& object, const std::string& name, std::int64_t value) {
  Handle space(MOERL_H5_CALL(H5Screate(H5S_SCALAR), object), H5Sclose);
  replace_attribute(object, name, H5T_STD_I64LE, space.get(), &value, H5T_NATIVE_INT64);
}

void File::set_attribute(const std::string& object, const std::string& name, double value) {
  Handle space(MOERL_H5_CALL(H5Screate(H5S_SCALAR), object), H5Sclose);
  replace_attribute(object, name, H5T_IEEE_F64LE, space.get(), &value, H5T_NATIVE_DOUBLE);
}

bool File::has_attribute(const std::string& object, const std::string& name) const {
  return MOERL_H5_CALL(H5Aexists_by_name(id(), absolute(object).c_str(), name.c_str(), H5P_DEFAULT),
                       object_label(object) + " attribute " + name) > 0;
}

Handle File::open_attribute(const std::string& object, const std::string& name) const {
  return Handle(MOERL_H5_CALL(H5Aopen_by_name(id(), absolute(object).c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT),
                              object_label(object) + " attribute " + name),
                H5Aclose);
}

namespace {

AttributeKind kind_of(hid_t attribute, const std::string& where, const std::string& path) {
  auto check = [&](auto value, const char* operation) {
    if (value < 0) throw_failure(path, where, operation, __FILE__, __LINE__);
    return value;
  };
  Handle space(check(H5Aget_space(attribute), "H5Aget_space"), H5Sclose);
  if (check(H5Sget_simple_extent_npoints(space.get()), "H5Sget_simple_extent_npoints") != 1)
    return AttributeKind::Other;
  Handle type(check(H5Aget_type(attribute), "H5Aget_type"), H5Tclose);
  const H5T_class_t type_class = check(H5Tget_class(type.get()), "H5Tget_class");
  const std::size_t size = H5Tget_size(type.get());
  if (type_class == H5T_STRING)
    return check(H5Tis_variable_str(type.get()), "H5Tis_variable_str") > 0 ? AttributeKind::Other
                                                                           : AttributeKind::String;
  if (type_class == H5T_INTEGER && size <= 8) return AttributeKind::Int64;
  if (type_class == H5T_FLOAT && size <= 8) return AttributeKind::Float64;
  return AttributeKind::Other;
}

}  // namespace

AttributeKind File::attribute_kind(const std::string& object, const std::string& name) const {
  return kind_of(open_attribute(object, name).get(), object_label(object) + " attribute " + name, path_);
}

// Each reader opens the attribute once (the kind check and the read share
// the handle): a checkpoint's header reads hundreds of them.
std::string File::string_attribute(const std::string& object, const std::string& name) const {
  const std::string where = object_label(object) + " attribute " + name;
  Handle attribute = open_attribute(object, name);
  if (kind_of(attribute.get(), where, path_) != AttributeKind::String) {
    throw Error("HDF5 file '" + path_ + "': " + where + " is not a fixed-length string");
  }
  Handle type(MOERL_H5_CALL(H5Aget_type(attribute.get()), where), H5Tclose);
  std::string value(H5Tget_size(type.get()), '\0');
  MOERL_H5_CALL(H5Aread(attribute.get(), type.get(), value.data()), where);
  while (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

std::int64_t File::int_attribute(const std::string& object, const std::string& name) const {
  const std::string where = object_label(object) + " attribute " + name;
  Handle attribute = open_attribute(object, name);
  if (kind_of(attribute.get(), where, path_) != AttributeKind::Int64) {
    throw Error("HDF5 file '" + path_ + "': " + where + " is not an integer scalar");
  }
  std::int64_t value = 0;
  MOERL_H5_CALL(H5Aread(attribute.get(), H5T_NATIVE_INT64, &value), where);
  return value;
}

double File::double_attribute(const std::string& object, const std::string& name) const {
  const std::string where = object_label(object) + " attribute " + name;
  Handle attribute = open_attribute(object, name);
  if (kind_of(attribute.get(), where, path_) != AttributeKind::Float64) {
    throw Error("HDF5 file '" + path_ + "': " + where + " is not a floating-point scalar");
  }
  double value = 0;
  MOERL_H5_CALL(H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, &value), where);
  return value;
}

std::vector<std::string> File::attribute_names(const std::string& object) const {
  std::vector<std::string> names;
  hsize_t index = 0;
  MOERL_H5_CALL(H5Aiterate_by_name(id(), absolute(object).c_str(), H5_INDEX_NAME, H5_ITER_INC, &index,
                                   collect_attribute_name, &names, H5P_DEFAULT),
                object);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace moerl::storage::h5
