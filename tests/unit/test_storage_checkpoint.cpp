// Checkpoint shard files: round trips of every dtype and attribute kind, and
// every kind of damage refused with an error naming the file and dataset.

#include <catch2/catch.hpp>
#include <hdf5.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "moerl/storage/checkpoint_file.h"
#include "moerl/storage/checksum.h"
#include "moerl/storage/hdf5_file.h"

namespace fs = std::filesystem;
using namespace moerl::storage;

namespace {

using moerl_test::TempDir;

template <typename T>
void add(CheckpointWriter& writer, const std::string& name, DType dtype, const Shape& shape,
         const std::vector<T>& values) {
  writer.add_array(name, dtype, shape, values.data(), values.size() * sizeof(T));
}

template <typename T>
std::vector<T> as(const std::vector<std::uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// Writes a small shard with one array of each dtype.
void write_sample(const std::string& path) {
  CheckpointWriter writer(path, ShardIdentity{3, 0, 1});
  add<float>(writer, "model/w", DType::Float32, {2, 3}, {1.5f, -2, 3, 4, 5, 6.25f});
  add<double>(writer, "optimizer/adam_m/w", DType::Float64, {3}, {0.1, 0.2, 1e300});
  add<std::int64_t>(writer, "state/cursor", DType::Int64, {}, {-(std::int64_t{1} << 40)});
  add<std::uint8_t>(writer, "rng/rank0", DType::UInt8, {5}, {0, 1, 2, 254, 255});
  add<std::uint16_t>(writer, "model/bf16", DType::BFloat16, {2, 2}, {0x3f80, 0xbf80, 0x0000, 0x7f80});
  add<float>(writer, "model/empty", DType::Float32, {0, 4}, std::vector<float>{});
  writer.set_attribute(attribute_key::kLearnerStep, std::int64_t{120});
  writer.set_attribute(attribute_key::kPolicyVersion, std::int64_t{3});
  writer.set_attribute(attribute_key::kConfigToml, std::string("[model]\nd_model = 64\n"));
  writer.set_attribute("metric.reward_mean", 0.75);
  writer.set_attribute("empty_text", std::string());
  writer.commit();
}

void flip_byte(const std::string& path, std::uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5A);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// The file offset of a contiguous dataset's first byte.
std::uint64_t data_offset(const std::string& path, const std::string& dataset) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(file >= 0);
  const hid_t d = H5Dopen2(file, dataset.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  const haddr_t offset = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(file);
  REQUIRE(offset != HADDR_UNDEF);
  return offset;
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("CRC-32C matches the standard check value", "[storage]") {
  const char* text = "123456789";
  CHECK(crc32c(text, 9) == 0xE3069283u);
  std::vector<std::uint8_t> data(1000 + 7);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 31 + 7);
  for (std::size_t n : {0, 1, 7, 8, 9, 63, 1007}) {
    INFO("n = " << n);
    // Incremental equals one-shot.
    CHECK(crc32c(data.data() + n / 2, n - n / 2, crc32c(data.data(), n / 2)) == crc32c(data.data(), n));
  }
  CHECK(checksum_hex(0xE3069283u) == "0xe3069283");
}

TEST_CASE("a checkpoint file round-trips every dtype and attribute", "[storage]") {
  TempDir dir;
  const std::string path = dir.file("v000003.rank0.h5");
  write_sample(path);
  // Only the final file is left: the temporary one was renamed.
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);

  const CheckpointReader reader(path);
  CHECK(reader.identity().version == 3);
  CHECK(reader.identity().num_shards == 1);
  REQUIRE(reader.arrays().size() == 6);
  CHECK(as<float>(reader.read("model/w")) == std::vector<float>{1.5f, -2, 3, 4, 5, 6.25f});
  CHECK(reader.info("model/w").shape == Shape{2, 3});
  CHECK(reader.info("model/w").dtype == DType::Float32);
  CHECK(as<double>(reader.read("optimizer/adam_m/w")) == std::vector<double>{0.1, 0.2, 1e300});
  CHECK(reader.info("state/cursor").shape.empty());
  CHECK(as<std::int64_t>(reader.read("state/cursor")) == std::vector<std::int64_t>{-(std::int64_t{1} << 40)});
  CHECK(reader.read("rng/rank0") == std::vector<std::uint8_t>{0, 1, 2, 254, 255});
  CHECK(reader.info("model/bf16").dtype == DType::BFloat16);
  CHECK(as<std::uint16_t>(reader.read("model/bf16")) == std::vector<std::uint16_t>{0x3f80, 0xbf80, 0, 0x7f80});
  CHECK(reader.info("model/empty").shape == Shape{0, 4});
  CHECK(reader.read("model/empty").empty());

  CHECK(reader.int_attribute(attribute_key::kLearnerStep) == 120);
  CHECK(reader.string_attribute(attribute_key::kConfigToml) == "[model]\nd_model = 64\n");
  CHECK(reader.double_attribute("metric.reward_mean") == 0.75);
  CHECK(reader.string_attribute("empty_text").empty());
  CHECK(reader.string_attribute(attribute_key::kProgramVersion).rfind("moerl ", 0) == 0);
  CHECK(reader.verify_all() == 24 + 24 + 8 + 5 + 8);
  CHECK_THROWS_WITH(reader.int_attribute("nope"), Catch::Contains("attribute 'nope' is missing"));
  CHECK_THROWS_WITH(reader.int_attribute(attribute_key::kConfigToml), Catch::Contains("is not an integer"));

  std::vector<float> into(6);
  reader.read_into("model/w", into.data(), into.size() * sizeof(float));
  CHECK(into[5] == 6.25f);
  CHECK_THROWS_WITH(reader.read_into("model/w", into.data(), 8), Catch::Contains("the destination has 8"));
}

TEST_CASE("large string attributes (a resolved config) are stored whole", "[storage]") {
  TempDir dir;
  const std::string path = dir.file("big.h5");
  std::string config;
  while (config.size() < 200000) config += "key_" + std::to_string(config.size()) + " = 1\n";
  {
    CheckpointWriter writer(path);
    writer.set_attribute(attribute_key::kConfigToml, config);
    writer.commit();
  }
  CHECK(CheckpointReader(path).string_attribute(attribute_key::kConfigToml) == config);
}

TEST_CASE("the writer refuses bad names, sizes and shards", "[storage]") {
  TempDir dir;
  CheckpointWriter writer(dir.file("x.h5"));
  const float one = 1;
  CHECK_THROWS_WITH(writer.add_array("_hidden", DType::Float32, {1}, &one, 4), Catch::Contains("invalid array name"));
  CHECK_THROWS_WITH(writer.add_array("a//b", DType::Float32, {1}, &one, 4), Catch::Contains("invalid array name"));
  CHECK_THROWS_WITH(writer.add_array("a b", DType::Float32, {1}, &one, 4), Catch::Contains("invalid array name"));
  CHECK_THROWS_WITH(writer.add_array("a", DType::Float32, {2}, &one, 4), Catch::Contains("needs 8 bytes, got 4"));
  writer.add_array("a", DType::Float32, {1}, &one, 4);
  CHECK_THROWS_WITH(writer.add_array("a", DType::Float32, {1}, &one, 4), Catch::Contains("added twice"));
  CHECK_THROWS_WITH(writer.set_attribute("_format", std::int64_t{1}), Catch::Contains("invalid attribute name"));
  CHECK_THROWS_AS(CheckpointWriter(dir.file("y.h5"), ShardIdentity{1, 2, 2}), CheckpointError);
}

TEST_CASE("an uncommitted writer leaves nothing behind", "[storage]") {
  TempDir dir;
  {
    CheckpointWriter writer(dir.file("v.h5"));
    const double x = 2;
    writer.add_array("model/x", DType::Float64, {1}, &x, 8);
    CHECK(fs::exists(writer.temporary_path()));
  }
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("a flipped byte inside a dataset is a checksum error naming it", "[storage]") {
  TempDir dir;
  const std::string path = dir.file("v000003.rank0.h5");
  write_sample(path);
  flip_byte(path, data_offset(path, "/optimizer/adam_m/w") + 9);
  const CheckpointReader reader(path);  // the header is intact
  CHECK(as<float>(reader.read("model/w"))[0] == 1.5f);
  const std::string message = error_of([&] { reader.read("optimizer/adam_m/w"); });
  CHECK_THAT(message, Catch::Contains(path) && Catch::Contains("dataset 'optimizer/adam_m/w'") &&
                          Catch::Contains("checksum mismatch"));
  CHECK_THROWS_WITH(reader.verify_all(), Catch::Contains("optimizer/adam_m/w"));
}

TEST_CASE("a truncated file is refused naming the file", "[storage]") {
  TempDir dir;
  const std::string path = dir.file("v000003.rank0.h5");
  write_sample(path);
  fs::resize_file(path, fs::file_size(path) / 2);
  const std::string message = error_of([&] {
    CheckpointReader reader(path);
    reader.verify_all();
  });
  CHECK_THAT(message, Catch::Contains(path) && Catch::Contains("truncated"));
  fs::resize_file(path, 0);
  CHECK_THROWS_WITH(CheckpointReader(path), Catch::Contains(path));
  CHECK_THROWS_WITH(CheckpointReader(dir.file("absent.h5")), Catch::Contains("absent.h5"));
}

TEST_CASE("a deleted dataset is refused naming it", "[storage]") {
  TempDir dir;
  const std::string path = dir.file("v000003.rank0.h5");
  write_sample(path);
  {
    moerl::storage::h5::File file = moerl::storage::h5::File::open(path, true);
    file.delete_link("rng/rank0");
  }
  CHECK_THROWS_WITH(CheckpointReader(path), Catch::Contains(path) && Catch::Contains("dataset 'rng/rank0' is missing"));
}

TEST_CASE("an altered attribute fails the header checksum", "[storage]") {
  TempDir dir;
  const std::string path = dir.file("v000003.rank0.h5");
  write_sample(path);
  {
    moerl::storage::h5::File file = moerl::storage::h5::File::open(path, true);
    file.set_attribute("/", attribute_key::kLearnerStep, std::int64_t{999});
  }
  CHECK_THROWS_WITH(CheckpointReader(path), Catch::Contains("header checksum mismatch"));
}

TEST_CASE("arrays are checked against an expected spec, every difference listed", "[storage]") {
  TempDir dir;
  const std::string path = dir.file("v000003.rank0.h5");
  write_sample(path);
  const CheckpointReader reader(path);
  reader.check_arrays({{"model/w", DType::Float32, {2, 3}}, {"state/cursor", DType::Int64, {}}});
  const std::string message = error_of([&] {
    reader.check_arrays({{"model/w", DType::Float32, {3, 2}},
                         {"model/bf16", DType::Float32, {2, 2}},
                         {"model/absent", DType::Float32, {1}}});
  });
  CHECK_THAT(message, Catch::Contains(path) && Catch::Contains("3 problems") &&
                          Catch::Contains("dataset 'model/w' has shape [2, 3], expected [3, 2]") &&
                          Catch::Contains("dataset 'model/bf16' has dtype bfloat16, expected float32") &&
                          Catch::Contains("dataset 'model/absent' is missing"));
  CHECK_THROWS_WITH(reader.read(ArraySpec{"rng/rank0", DType::UInt8, {6}}), Catch::Contains("expected [6]"));
  CHECK(reader.read(ArraySpec{"rng/rank0", DType::UInt8, {5}}).size() == 5);
}

TEST_CASE("a large array read past HDF5 in blocks equals what was written, and a flip in a later block is caught",
          "[storage]") {
  TempDir dir;
  const std::string path = dir.file("v000001.rank0.h5");
  // 1.2 MB: several of the reader's 256 KiB blocks and a partial last one.
  std::vector<float> values(300007);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f - 7.0f;
  {
    CheckpointWriter writer(path);
    add<float>(writer, "model/big", DType::Float32, {static_cast<std::int64_t>(values.size())}, values);
    writer.commit();
  }
  const std::uint64_t offset = data_offset(path, "/model/big");
  {
    // The reader's path past HDF5 applies: HDF5's descriptor and the data's offset are known.
    const auto file = moerl::storage::h5::File::open(path);
    CHECK(file.posix_descriptor().has_value());
    CHECK(file.dataset_extent("model/big", H5T_NATIVE_FLOAT).raw_offset == offset);
    CHECK_FALSE(file.dataset_extent("model/big", H5T_NATIVE_DOUBLE).raw_offset.has_value());
  }
  // Large arrays start on a page boundary of the file, where the kernel
  // copies them into 64-byte-aligned tensors at full speed.
  CHECK(offset % 4096 == 0);
  CHECK(as<float>(CheckpointReader(path).read("model/big")) == values);
  flip_byte(path, offset + 3 * (std::size_t{256} << 10) + 17);
  CHECK_THROWS_WITH(CheckpointReader(path).read("model/big"),
                    Catch::Contains("dataset 'model/big'") && Catch::Contains("checksum mismatch"));
}

TEST_CASE("a file without the array table (written before it existed) reads the same", "[storage]") {
  TempDir dir;
  const std::string path = dir.file("v000003.rank0.h5");
  write_sample(path);
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(file >= 0);
    REQUIRE(H5Adelete(file, "_array_table") >= 0);
    H5Fclose(file);
  }
  const CheckpointReader reader(path);
  REQUIRE(reader.arrays().size() == 6);
  CHECK(reader.info("model/w").shape == Shape{2, 3});
  CHECK(reader.info("model/empty").shape == Shape{0, 4});
  CHECK(reader.info("model/bf16").dtype == DType::BFloat16);
  CHECK(as<float>(reader.read("model/w")) == std::vector<float>{1.5f, -2, 3, 4, 5, 6.25f});
  CHECK(reader.verify_all() == 24 + 24 + 8 + 5 + 8);
}

TEST_CASE("the header's array offsets: read there, a wrong one read through HDF5, a malformed one refused",
          "[storage]") {
  TempDir dir;
  const std::string path = dir.file("v000003.rank0.h5");
  write_sample(path);
  const std::vector<float> w{1.5f, -2, 3, 4, 5, 6.25f};
  const std::uint64_t w_offset = data_offset(path, "/model/w");
  const std::uint64_t m_offset = data_offset(path, "/optimizer/adam_m/w");
  {
    const CheckpointReader reader(path);
    CHECK(reader.info("model/w").file_offset == w_offset);
    CHECK(reader.info("optimizer/adam_m/w").file_offset == m_offset);
    CHECK_FALSE(reader.info("model/empty").file_offset.has_value());  // no bytes, no place
  }
  auto set_offsets = [&](const std::string& text) {
    moerl::storage::h5::File file = moerl::storage::h5::File::open(path, true);
    file.set_attribute("/", "_array_offsets", text);
  };
  // Positions that hold other bytes, and one past the end of the file.
  set_offsets("0\n0\n99999999999\n0\n0\n-\n");
  {
    const CheckpointReader reader(path);
    CHECK(as<float>(reader.read("model/w")) == w);
    CHECK(reader.verify_all() == 24 + 24 + 8 + 5 + 8);
  }
  set_offsets("0\nx\n0\n0\n0\n-\n");
  CHECK_THROWS_WITH(CheckpointReader(path), Catch::Contains(path) &&
                                                Catch::Contains("entry 2 of the header's array offsets ('x'") &&
                                                Catch::Contains("optimizer/adam_m/w"));
  set_offsets("0\n0\n0\n0\n0\n");
  CHECK_THROWS_WITH(CheckpointReader(path), Catch::Contains("array offsets have 5 entries for 6 arrays"));
  {
    // A file written before the offsets existed.
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(file >= 0);
    REQUIRE(H5Adelete(file, "_array_offsets") >= 0);
    H5Fclose(file);
  }
  const CheckpointReader reader(path);
  CHECK_FALSE(reader.info("model/w").file_offset.has_value());
  CHECK(as<float>(reader.read("model/w")) == w);
  CHECK(reader.verify_all() == 24 + 24 + 8 + 5 + 8);
}

TEST_CASE("a dataset replaced by one of another shape is refused when read, naming it", "[storage]") {
  TempDir dir;
  const std::string path = dir.file("v000003.rank0.h5");
  write_sample(path);
  {
    moerl::storage::h5::File file = moerl::storage::h5::File::open(path, true);
    file.delete_link("model/w");
    const std::vector<float> other(6, 1.0f);
    file.write_dataset("model/w", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {3, 2}, false, other.data());
  }
  const CheckpointReader reader(path);  // the header itself is intact
  CHECK_THROWS_WITH(reader.read("model/w"),
                    Catch::Contains(path) && Catch::Contains("dataset 'model/w'") &&
                        Catch::Contains("stored shape [3, 2] differs from the header's [2, 3]"));
  CHECK(reader.read("rng/rank0").size() == 5);
}

TEST_CASE("a malformed array table is refused naming the entry", "[storage]") {
  TempDir dir;
  const std::string path = dir.file("v000003.rank0.h5");
  write_sample(path);
  std::string table;
  {
    moerl::storage::h5::File file = moerl::storage::h5::File::open(path, true);
    table = file.string_attribute("/", "_array_table");
    const std::size_t tab = table.find('\t');
    file.set_attribute("/", "_array_table",
                       table.substr(0, tab) + "\tfloat32\t2,,3\t1" + table.substr(table.find('\n')));
  }
  CHECK_THROWS_WITH(CheckpointReader(path),
                    Catch::Contains(path) && Catch::Contains("entry 1 of the header's array table"));
  {
    moerl::storage::h5::File file = moerl::storage::h5::File::open(path, true);
    file.set_attribute("/", "_array_table", table.substr(0, table.rfind('\n', table.size() - 2) + 1));
  }
  CHECK_THROWS_WITH(CheckpointReader(path), Catch::Contains("array table has 5 entries for 6 arrays"));
}

TEST_CASE("HDF5 errors name the file and object and carry the error stack", "[storage]") {
  TempDir dir;
  const std::string path = dir.file("plain.h5");
  auto file = moerl::storage::h5::File::create(path);
  const std::string message = error_of([&] { file.dataset_layout("no/such"); });
  CHECK_THAT(message, Catch::Contains("HDF5") && Catch::Contains(path) && Catch::Contains("/no/such"));
  CHECK_FALSE(file.exists("no/such"));
  file.create_groups("a/b");
  CHECK(file.exists("a/b"));
}

TEST_CASE("fault injection points parse and fire", "[storage]") {
  CHECK(FaultInjection::parse("").point == FaultPoint::None);
  CHECK(FaultInjection::parse("before-rename").point == FaultPoint::BeforeRename);
  CHECK(FaultInjection::parse("after-data:exit").action == FaultAction::Exit);
  CHECK_THROWS_WITH(FaultInjection::parse("sometime"), Catch::Contains("point must be"));
  TempDir dir;
  CheckpointWriter writer(dir.file("f.h5"), {}, FaultInjection::parse("after-data"));
  CHECK_THROWS_AS(writer.commit(), InjectedFault);
}
