#include "moerl/storage/expert_shards.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "moerl/storage/checkpoint_store.h"

namespace moerl::storage {
namespace {

constexpr const char* kMember = "expert_layout.member";
constexpr const char* kMembers = "expert_layout.members";
constexpr const char* kExperts = "expert_layout.experts";
constexpr const char* kFirst = "expert_layout.first";
constexpr const char* kCount = "expert_layout.count";
constexpr const char* kArrays = "expert_layout.arrays";  // names, one a line

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

// Bytes of one row along dim 0 of an array of this dtype and shape.
std::size_t row_bytes(const ArrayInfo& info) {
  std::size_t bytes = dtype_size(info.dtype);
  for (std::size_t d = 1; d < info.shape.size(); ++d) bytes *= static_cast<std::size_t>(info.shape[d]);
  return bytes;
}

}  // namespace

std::string row_range_text(const RowRange& rows) {
  return "[" + std::to_string(rows.first) + ", " + std::to_string(rows.end()) + ")";
}

std::optional<std::vector<RowPiece>> cover_rows(RowRange want, const std::vector<RowRange>& held) {
  std::vector<RowPiece> pieces;
  std::int64_t row = want.first;
  while (row < want.end()) {
    const auto it = std::find_if(held.begin(), held.end(),
                                 [row](const RowRange& h) { return h.count > 0 && h.first <= row && row < h.end(); });
    if (it == held.end()) return std::nullopt;
    const std::int64_t count = std::min(it->end(), want.end()) - row;
    pieces.push_back({static_cast<std::size_t>(it - held.begin()), row - it->first, row - want.first, count});
    row += count;
  }
  return pieces;
}

void write_expert_split(CheckpointWriter& writer, const ExpertSplit& split) {
  writer.set_attribute(kMember, static_cast<std::int64_t>(split.member));
  writer.set_attribute(kMembers, static_cast<std::int64_t>(split.members));
  writer.set_attribute(kExperts, split.experts);
  writer.set_attribute(kFirst, split.rows.first);
  writer.set_attribute(kCount, split.rows.count);
  std::string names;
  for (const std::string& name : split.arrays) names += name + "\n";
  writer.set_attribute(kArrays, names);
}

std::optional<ExpertSplit> read_expert_split(const CheckpointReader& reader) {
  if (!reader.has_attribute(kMembers)) return std::nullopt;
  ExpertSplit split;
  split.member = static_cast<int>(reader.int_attribute(kMember));
  split.members = static_cast<int>(reader.int_attribute(kMembers));
  split.experts = reader.int_attribute(kExperts);
  split.rows = {reader.int_attribute(kFirst), reader.int_attribute(kCount)};
  split.arrays = lines_of(reader.string_attribute(kArrays));
  if (split.members < 1 || split.member < 0 || split.member >= split.members || split.rows.first < 0 ||
      split.rows.count < 0 || split.rows.end() > split.experts)
    throw CheckpointError(reader.path() + ": expert layout out of range: member " + std::to_string(split.member) +
                          " of " + std::to_string(split.members) + ", experts " + row_range_text(split.rows) + " of " +
                          std::to_string(split.experts));
  return split;
}

ShardedVersion::ShardedVersion(const CheckpointStore& store, std::int64_t version)
    : directory_(store.directory()), version_(version) {
  const int count = store.num_shards(version);
  for (int rank = 0; rank < count; ++rank) shards_.push_back(store.open_shard(version, rank));
  std::vector<std::optional<ExpertSplit>> splits;
  for (const auto& shard : shards_) splits.push_back(read_expert_split(shard));
  if (splits.front()) {
    members_ = splits.front()->members;
    experts_ = splits.front()->experts;
  }
  for (int rank = 0; rank < count; ++rank) {
    const auto& split = splits[static_cast<std::size_t>(rank)];
    const bool agrees =
        split ? split->members == members_ && split->experts == experts_ && split->member == rank : !splits.front();
    if (!agrees || (splits.front() && members_ != count))
      throw CheckpointError(label() + ": the shards disagree on the expert layout (" + shard(rank).path() + " vs " +
                            primary().path() + ", " + std::to_string(count) + " shards)");
    shard_rows_.push_back(split ? split->rows : RowRange{});
    if (!split) continue;
    for (const std::string& name : split->arrays) {
      const ArrayInfo& part = shard(rank).info(name);
      if (part.shape.empty() || part.shape[0] != split->rows.count)
        throw CheckpointError(shard(rank).path() + ": split array '" + name + "' has shape " + shape_text(part.shape) +
                              ", expected " + std::to_string(split->rows.count) + " rows (experts " +
                              row_range_text(split->rows) + ")");
      split_[name].push_back(rank);
    }
  }
  std::map<std::string, ArrayInfo> logical;
  for (const auto& [name, holders] : split_) {
    ArrayInfo info = shard(holders.front()).info(name);
    info.shape[0] = experts_;
    info.checksum = 0;
    info.bytes = row_bytes(info) * static_cast<std::size_t>(experts_);
    std::vector<RowRange> held;
    for (int rank : holders) {
      const ArrayInfo& part = shard(rank).info(name);
      if (part.dtype != info.dtype ||
          !std::equal(part.shape.begin() + 1, part.shape.end(), info.shape.begin() + 1, info.shape.end()) ||
          part.shape.size() != info.shape.size())
        throw CheckpointError(label() + ": the parts of split array '" + name + "' differ: " + dtype_name(part.dtype) +
                              shape_text(part.shape) + " in " + shard(rank).path() + ", " + dtype_name(info.dtype) +
                              shape_text(shard(holders.front()).info(name).shape) + " in " +
                              shard(holders.front()).path());
      held.push_back(shard_rows_[static_cast<std::size_t>(rank)]);
    }
    if (!cover_rows({0, experts_}, held))
      throw CheckpointError(label() + ": split array '" + name + "' lacks some of the " + std::to_string(experts_) +
                            " experts (" + layout_text() + ")");
    logical.emplace(name, info);
  }
  for (int rank = 0; rank < count; ++rank) {
    const auto& split = splits[static_cast<std::size_t>(rank)];
    for (const ArrayInfo& array : shard(rank).arrays()) {
      if (split && std::find(split->arrays.begin(), split->arrays.end(), array.name) != split->arrays.end()) continue;
      if (split_.count(array.name))
        throw CheckpointError(label() + ": array '" + array.name + "' is split over shards but whole in " +
                              shard(rank).path());
      if (!whole_.emplace(array.name, rank).second)
        throw CheckpointError(label() + ": array '" + array.name + "' appears in more than one shard");
      logical.emplace(array.name, array);
    }
  }
  for (auto& [name, info] : logical) arrays_.push_back(info);
}

std::string ShardedVersion::label() const {
  return (std::filesystem::path(directory_) / CheckpointStore::version_label(version_)).string();
}

std::string ShardedVersion::layout_text() const {
  if (split_.empty() && experts_ == 0)
    return "unsplit, " + std::to_string(num_shards()) + " shard" + (num_shards() == 1 ? "" : "s");
  std::string text = "expert-parallel " + std::to_string(members_) + " (experts";
  for (const RowRange& rows : shard_rows_) text += " " + row_range_text(rows);
  return text + " of " + std::to_string(experts_) + ")";
}

const ArrayInfo* ShardedVersion::find(const std::string& name) const {
  const auto it = std::lower_bound(arrays_.begin(), arrays_.end(), name,
                                   [](const ArrayInfo& a, const std::string& n) { return a.name < n; });
  return it != arrays_.end() && it->name == name ? &*it : nullptr;
}

void ShardedVersion::check_arrays(const std::vector<ArraySpec>& expected) const {
  std::vector<std::string> problems;
  for (const auto& spec : expected) {
    const ArrayInfo* a = find(spec.name);
    if (!a) {
      problems.push_back("dataset '" + spec.name + "' is missing");
      continue;
    }
    if (a->dtype != spec.dtype)
      problems.push_back("dataset '" + spec.name + "' has dtype " + dtype_name(a->dtype) + ", expected " +
                         dtype_name(spec.dtype));
    if (a->shape != spec.shape)
      problems.push_back("dataset '" + spec.name + "' has shape " + shape_text(a->shape) + ", expected " +
                         shape_text(spec.shape));
  }
  if (problems.empty()) return;
  std::string text = primary().path() + (num_shards() > 1 ? " (and the other shards of " + layout_text() + ")" : "") +
                     " does not match the expected arrays (" + std::to_string(problems.size()) + " problem" +
                     (problems.size() == 1 ? "" : "s") + "): ";
  for (std::size_t i = 0; i < problems.size(); ++i) text += (i ? "; " : "") + problems[i];
  throw CheckpointError(text);
}

std::vector<std::uint8_t> ShardedVersion::read(const std::string& name) const {
  const ArrayInfo* info = find(name);
  if (!info) throw CheckpointError(label() + ": dataset '" + name + "' is missing");
  std::vector<std::uint8_t> bytes(info->bytes);
  read_into(name, bytes.data(), bytes.size());
  return bytes;
}

void ShardedVersion::read_into(const std::string& name, void* out, std::size_t bytes) const {
  const auto whole = whole_.find(name);
  if (whole != whole_.end()) return shard(whole->second).read_into(name, out, bytes);
  const ArrayInfo* info = find(name);
  if (!info) throw CheckpointError(label() + ": dataset '" + name + "' is missing");
  read_rows(name, {0, info->shape[0]}, out, bytes);
}

void ShardedVersion::read_rows(const std::string& name, RowRange rows, void* out, std::size_t bytes) const {
  const ArrayInfo* info = find(name);
  if (!info) throw CheckpointError(label() + ": dataset '" + name + "' is missing");
  const std::string where = label() + ": dataset '" + name + "' " + dtype_name(info->dtype) + shape_text(info->shape);
  if (info->shape.empty() || rows.first < 0 || rows.count < 0 || rows.end() > info->shape[0])
    throw CheckpointError(where + ": has no rows " + row_range_text(rows));
  const std::size_t row = row_bytes(*info);
  if (bytes != row * static_cast<std::size_t>(rows.count))
    throw CheckpointError(where + ": rows " + row_range_text(rows) + " are " +
                          std::to_string(row * static_cast<std::size_t>(rows.count)) + " bytes, the destination has " +
                          std::to_string(bytes));
  auto* target = static_cast<std::uint8_t*>(out);
  const auto whole = whole_.find(name);
  if (whole != whole_.end()) {
    if (rows.count == info->shape[0]) return shard(whole->second).read_into(name, out, bytes);
    const std::vector<std::uint8_t> all = shard(whole->second).read(name);
    std::memcpy(target, all.data() + row * static_cast<std::size_t>(rows.first), bytes);
    return;
  }
  const std::vector<int>& holders = split_.at(name);
  std::vector<RowRange> held;
  for (int rank : holders) held.push_back(shard_rows_[static_cast<std::size_t>(rank)]);
  const auto pieces = cover_rows(rows, held);
  if (!pieces) throw CheckpointError(where + ": no shard holds some of rows " + row_range_text(rows));
  // Each shard's part is read (and its checksum checked) once, whatever it
  // provides: straight into the target when all of it is wanted (a learner
  // loading the rows its own shard saved), else through a buffer.
  std::map<std::size_t, std::vector<std::uint8_t>> parts;
  for (const RowPiece& piece : *pieces) {
    const CheckpointReader& source = shard(holders[piece.source]);
    if (piece.source_row == 0 && piece.count == held[piece.source].count) {
      source.read_into(name, target + row * static_cast<std::size_t>(piece.target_row),
                       row * static_cast<std::size_t>(piece.count));
      continue;
    }
    auto part = parts.find(piece.source);
    if (part == parts.end()) part = parts.emplace(piece.source, source.read(name)).first;
    std::memcpy(target + row * static_cast<std::size_t>(piece.target_row),
                part->second.data() + row * static_cast<std::size_t>(piece.source_row),
                row * static_cast<std::size_t>(piece.count));
  }
}

}  // namespace moerl::storage
