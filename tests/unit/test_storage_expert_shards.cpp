// Expert-sharded versions: which shard pieces fill a range of rows
// (cover_rows), and a version saved over P shards read back as logical
// arrays, whole or as the rows of any other layout.

#include <catch2/catch.hpp>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "moerl/storage/checkpoint_store.h"
#include "moerl/storage/expert_shards.h"

using namespace moerl::storage;

namespace {

constexpr std::int64_t kExperts = 8;
constexpr std::int64_t kRow = 3;  // floats per expert row

// Experts [m*E/P, (m+1)*E/P) of every split array for member m of P.
RowRange rows_of(int member, int members) {
  const std::int64_t share = kExperts / members;
  return {member * share, share};
}

// Row e of "model/experts" holds e*10 + j; of "optimizer/model/experts/exp_avg", -(e*10 + j).
std::vector<float> expert_rows(RowRange rows, float sign) {
  std::vector<float> v;
  for (std::int64_t e = rows.first; e < rows.end(); ++e)
    for (std::int64_t j = 0; j < kRow; ++j) v.push_back(sign * static_cast<float>(e * 10 + j));
  return v;
}

// A version saved by P members: shard m holds its expert rows, shard 0 also the replicated array.
void save_split(CheckpointStore& store, std::int64_t version, int members) {
  for (int m = 0; m < members; ++m) {
    auto writer = store.shard_writer(version, m, members);
    const RowRange rows = rows_of(m, members);
    const auto w = expert_rows(rows, 1), a = expert_rows(rows, -1);
    writer->add_array("model/experts", DType::Float32, {rows.count, kRow}, w.data(), w.size() * 4);
    writer->add_array("optimizer/model/experts/exp_avg", DType::Float32, {rows.count, kRow}, a.data(), a.size() * 4);
    if (m == 0) {
      const std::vector<float> norm = {1, 2, 3, 4};
      writer->add_array("model/norm", DType::Float32, {4}, norm.data(), norm.size() * 4);
      writer->set_attribute(attribute_key::kLearnerStep, std::int64_t{7});
    }
    write_expert_split(*writer, {m, members, kExperts, rows, {"model/experts", "optimizer/model/experts/exp_avg"}});
    writer->commit();
  }
  store.complete_version(version, members);
}

std::vector<float> floats(const std::vector<std::uint8_t>& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

}  // namespace

TEST_CASE("cover_rows: pieces from the shards that hold each row", "[storage][expert_shards]") {
  const std::vector<RowRange> halves = {{0, 4}, {4, 4}};
  // A range inside one shard: part of it.
  CHECK(*cover_rows({1, 2}, halves) == std::vector<RowPiece>{{0, 1, 0, 2}});
  // A range spanning both: two pieces, in row order.
  CHECK(*cover_rows({2, 4}, halves) == std::vector<RowPiece>{{0, 2, 0, 2}, {1, 0, 2, 2}});
  // Everything from quarters (P=4 read at Q=1).
  const std::vector<RowRange> quarters = {{0, 2}, {2, 2}, {4, 2}, {6, 2}};
  const auto all = *cover_rows({0, 8}, quarters);
  REQUIRE(all.size() == 4);
  CHECK(all[3] == RowPiece{3, 0, 6, 2});
  // Sources in any order; an empty range needs nothing.
  CHECK(*cover_rows({3, 3}, {{4, 4}, {0, 4}}) == std::vector<RowPiece>{{1, 3, 0, 1}, {0, 0, 1, 2}});
  CHECK(cover_rows({5, 0}, halves)->empty());
  // A row no source holds.
  CHECK_FALSE(cover_rows({0, 8}, {{0, 4}, {5, 3}}).has_value());
  CHECK_FALSE(cover_rows({0, 9}, halves).has_value());
}

TEST_CASE("a version saved over P shards reads as whole arrays and as any layout's rows", "[storage][expert_shards]") {
  moerl_test::TempDir dir;
  CheckpointStore store(dir.file("ckpt"));
  save_split(store, 1, 4);
  const ShardedVersion version(store, 1);
  CHECK(version.num_shards() == 4);
  CHECK(version.expert_members() == 4);
  CHECK(version.layout_text() == "expert-parallel 4 (experts [0, 2) [2, 4) [4, 6) [6, 8) of 8)");
  REQUIRE(version.find("model/experts") != nullptr);
  CHECK(version.find("model/experts")->shape == Shape{kExperts, kRow});
  CHECK(version.is_split("optimizer/model/experts/exp_avg"));
  CHECK_FALSE(version.is_split("model/norm"));
  CHECK(version.arrays().size() == 3);
  CHECK(floats(version.read("model/experts")) == expert_rows({0, kExperts}, 1));
  CHECK(floats(version.read("model/norm")) == std::vector<float>{1, 2, 3, 4});
  CHECK(version.primary().int_attribute(attribute_key::kLearnerStep) == 7);
  // The rows of each member at P = 2 and at P = 8, and a range across three shards.
  for (int members : {1, 2, 8}) {
    for (int m = 0; m < members; ++m) {
      const RowRange rows = rows_of(m, members);
      std::vector<float> got(static_cast<size_t>(rows.count * kRow));
      version.read_rows("optimizer/model/experts/exp_avg", rows, got.data(), got.size() * 4);
      CHECK(got == expert_rows(rows, -1));
    }
  }
  std::vector<float> across(5 * kRow);
  version.read_rows("model/experts", {1, 5}, across.data(), across.size() * 4);
  CHECK(across == expert_rows({1, 5}, 1));
  // Rows of a whole array, and the checks.
  std::vector<float> two(2);
  version.read_rows("model/norm", {2, 2}, two.data(), 8);
  CHECK(two == std::vector<float>{3, 4});
  CHECK_THROWS_WITH(version.read_rows("model/experts", {6, 4}, across.data(), 4 * kRow * 4),
                    Catch::Contains("has no rows [6, 10)"));
  CHECK_THROWS_WITH(version.check_arrays({{"model/experts", DType::Float32, {4, kRow}}}),
                    Catch::Contains("v000001.rank0.h5") && Catch::Contains("expert-parallel 4") &&
                        Catch::Contains("has shape [8, 3], expected [4, 3]"));

  // export gathers the experts: the same file content as an unsplit save.
  save_split(store, 2, 1);
  const ShardedVersion unsplit(store, 2);
  CHECK(unsplit.layout_text() == "expert-parallel 1 (experts [0, 8) of 8)");
  CHECK(unsplit.read("model/experts") == version.read("model/experts"));
  store.export_weights(1, dir.file("split.h5"));
  store.export_weights(2, dir.file("whole.h5"));
  const CheckpointReader split_export(dir.file("split.h5")), whole_export(dir.file("whole.h5"));
  CHECK(split_export.read("model/experts") == whole_export.read("model/experts"));
  CHECK(split_export.info("model/experts").shape == Shape{kExperts, kRow});
}

TEST_CASE("a sharded version that lacks rows or disagrees on its layout is refused", "[storage][expert_shards]") {
  moerl_test::TempDir dir;
  CheckpointStore store(dir.file("ckpt"));
  // Two shards that both claim experts [0, 4): rows [4, 8) are nowhere.
  for (int m = 0; m < 2; ++m) {
    auto writer = store.shard_writer(3, m, 2);
    const auto w = expert_rows({0, 4}, 1);
    writer->add_array("model/experts", DType::Float32, {4, kRow}, w.data(), w.size() * 4);
    write_expert_split(*writer, {m, 2, kExperts, {0, 4}, {"model/experts"}});
    writer->commit();
  }
  store.complete_version(3, 2);
  CHECK_THROWS_WITH(ShardedVersion(store, 3), Catch::Contains("lacks some of the 8 experts"));
  // A shard of another expert-parallel size than its version's shard count.
  for (int m = 0; m < 2; ++m) {
    auto writer = store.shard_writer(4, m, 2);
    const auto w = expert_rows(rows_of(m, 2), 1);
    writer->add_array("model/experts", DType::Float32, {4, kRow}, w.data(), w.size() * 4);
    write_expert_split(*writer, {m, m == 0 ? 2 : 4, kExperts, rows_of(m, 2), {"model/experts"}});
    writer->commit();
  }
  store.complete_version(4, 2);
  CHECK_THROWS_WITH(ShardedVersion(store, 4), Catch::Contains("disagree on the expert layout"));
}
