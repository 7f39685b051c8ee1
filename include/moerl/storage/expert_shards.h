#pragma once
// A checkpoint version whose expert tensors are split over its shards, read
// as the logical (whole) arrays whatever the layout it was saved in.
//
// With expert parallelism the P members of an expert group each hold E/P of
// every MoE layer's routed experts (moe/expert_parallel.h), and a version
// saved by the group has one shard per member: shard m holds rows
// [m*E/P, (m+1)*E/P) along dim 0 of every expert array (the parameters and
// their optimizer moments), shard 0 in addition every replicated array.
// Every shard says which rows it holds, of how many, in which layout
// (ExpertSplit, stored as attributes "expert_layout.*"), so that a reader
// needs no model to gather: `moerl checkpoint export-hf` and `diff` run on a
// login node without LibTorch.
//
// A reader in another layout (Q members, or one learner holding every
// expert) asks for its own rows of each expert array; they may span several
// shards or be part of one (cover_rows). A version without the attributes
// (written before expert parallelism, or by `write-sample`) has nothing
// split: each array is whole in the first shard that holds it.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "moerl/storage/checkpoint_file.h"

namespace moerl::storage {

class CheckpointStore;

// Rows [first, first + count) along dim 0 of an array.
struct RowRange {
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::int64_t end() const { return first + count; }
  bool operator==(const RowRange& other) const { return first == other.first && count == other.count; }
};

std::string row_range_text(const RowRange& rows);  // "[4, 8)"

// One copy of a gather: `count` rows starting at row `source_row` of
// source `source` go to row `target_row` of the wanted range (counted
// from its first row).
struct RowPiece {
  std::size_t source = 0;
  std::int64_t source_row = 0;  // relative to the source's first row
  std::int64_t target_row = 0;  // relative to want.first
  std::int64_t count = 0;
  bool operator==(const RowPiece& other) const {
    return source == other.source && source_row == other.source_row && target_row == other.target_row &&
           count == other.count;
  }
};

// The pieces, in row order, that fill `want` from sources holding `held[i]`
// (the first source holding a row provides it). nullopt when a row of `want`
// is held by no source.
std::optional<std::vector<RowPiece>> cover_rows(RowRange want, const std::vector<RowRange>& held);

// What one shard holds of the split arrays: rows `rows` of `experts` along
// dim 0 of every array named in `arrays`; member `member` of `members`.
struct ExpertSplit {
  int member = 0;
  int members = 1;
  std::int64_t experts = 0;
  RowRange rows;
  std::vector<std::string> arrays;
};

void write_expert_split(CheckpointWriter& writer, const ExpertSplit& split);
// nullopt for a shard without the attributes (nothing split).
std::optional<ExpertSplit> read_expert_split(const CheckpointReader& reader);

// "expert_layout.": the prefix of the attributes write_expert_split sets (a
// diff across layouts leaves them out).
constexpr const char* kExpertLayoutPrefix = "expert_layout.";

// Every shard of one complete version opened, and its arrays as logical ones.
class ShardedVersion {
 public:
  // Opens every shard (each checked against the index) and their layouts;
  // throws CheckpointError when shards disagree on the layout or a split
  // array's rows are not all present.
  ShardedVersion(const CheckpointStore& store, std::int64_t version);

  std::int64_t version() const { return version_; }
  std::string label() const;  // "DIR/v000012"
  int num_shards() const { return static_cast<int>(shards_.size()); }
  const CheckpointReader& shard(int rank) const { return shards_.at(static_cast<std::size_t>(rank)); }
  // Shard 0: the attributes of the version and its replicated arrays.
  const CheckpointReader& primary() const { return shards_.front(); }
  // The expert-parallel size it was saved at (1 when nothing is split), and E (0 then).
  int expert_members() const { return members_; }
  std::int64_t experts() const { return experts_; }
  std::string layout_text() const;  // "expert-parallel 2 (experts [0, 4) [4, 8) of 8)" or "unsplit, 1 shard"

  // Every logical array in name order; a split one with its whole shape and
  // checksum 0 (each shard's part has its own).
  const std::vector<ArrayInfo>& arrays() const { return arrays_; }
  const ArrayInfo* find(const std::string& name) const;
  bool is_split(const std::string& name) const { return split_.count(name) > 0; }

  // Every array of `expected` must be present with that dtype and logical
  // shape; one error naming shard 0's file lists every difference.
  void check_arrays(const std::vector<ArraySpec>& expected) const;
  // The whole logical array (read_into: into `out`, exactly its bytes).
  std::vector<std::uint8_t> read(const std::string& name) const;
  void read_into(const std::string& name, void* out, std::size_t bytes) const;
  // Rows `rows` along dim 0 of the logical array, into `out` (exactly their bytes).
  void read_rows(const std::string& name, RowRange rows, void* out, std::size_t bytes) const;

 private:
  std::string directory_;
  std::int64_t version_ = 0;
  std::vector<CheckpointReader> shards_;
  int members_ = 1;
  std::int64_t experts_ = 0;
  std::vector<RowRange> shard_rows_;               // [shard] the expert rows it holds
  std::map<std::string, std::vector<int>> split_;  // split array -> the shards holding its rows
  std::map<std::string, int> whole_;               // unsplit array -> the first shard holding it
  std::vector<ArrayInfo> arrays_;
};

}  // namespace moerl::storage
