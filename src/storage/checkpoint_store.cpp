#include "moerl/storage/checkpoint_store.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include "moerl/core/json_value.h"
#include "moerl/core/json_writer.h"
#include "moerl/storage/atomic_file.h"
#include "moerl/storage/expert_shards.h"
#include "moerl/storage/file_lock.h"

namespace moerl::storage {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexFormat = "moerl-checkpoint-index/1";
constexpr const char* kLatestFile = "latest";
constexpr const char* kLockFile = ".latest.lock";
// Changing `latest` takes a few milliseconds; a holder for longer is stuck.
constexpr double kLockTimeoutS = 60.0;
constexpr const char* kTagsFile = "tags.json";

const std::regex& shard_pattern() {
  static const std::regex pattern(R"(v(\d+)\.rank(\d+)\.h5)");
  return pattern;
}
const std::regex& index_pattern() {
  static const std::regex pattern(R"(v(\d+)\.index\.json)");
  return pattern;
}

struct ShardEntry {
  int rank = 0;
  std::string file;
  std::uint64_t bytes = 0;
};

struct Index {
  std::int64_t version = 0;
  int num_shards = 0;
  std::vector<ShardEntry> shards;
};

Index read_index(const std::string& path, std::int64_t version) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw CheckpointError("version " + CheckpointStore::version_label(version) + " is incomplete: index '" + path +
                          "' is missing (the save did not finish)");
  }
  try {
    const JsonValue json = JsonValue::parse(read_whole_file(path));
    if (json.at("format").as_string() != kIndexFormat) {
      throw CheckpointError("index '" + path + "': format is not " + kIndexFormat);
    }
    Index index;
    index.version = static_cast<std::int64_t>(json.at("version").as_number());
    index.num_shards = static_cast<int>(json.at("num_shards").as_number());
    for (const JsonValue& shard : json.at("shards").as_array()) {
      index.shards.push_back({static_cast<int>(shard.at("rank").as_number()), shard.at("file").as_string(),
                              static_cast<std::uint64_t>(shard.at("bytes").as_number())});
    }
    if (index.version != version) {
      throw CheckpointError("index '" + path + "' is for version " + std::to_string(index.version));
    }
    if (index.num_shards < 1 || static_cast<int>(index.shards.size()) != index.num_shards) {
      throw CheckpointError("index '" + path + "' lists " + std::to_string(index.shards.size()) +
                            " shards for num_shards " + std::to_string(index.num_shards));
    }
    for (int r = 0; r < index.num_shards; ++r) {
      const ShardEntry& entry = index.shards[static_cast<std::size_t>(r)];
      if (entry.rank != r || entry.file.find('/') != std::string::npos) {
        throw CheckpointError("index '" + path + "': shard entry " + std::to_string(r) + " is malformed");
      }
    }
    return index;
  } catch (const JsonError& error) {
    throw CheckpointError("index '" + path + "' is corrupt: " + error.what());
  }
}

std::uint64_t file_size_or_zero(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  return ec ? 0 : static_cast<std::uint64_t>(size);
}

bool valid_tag_name(const std::string& name) {
  if (name.empty() || name.size() > 100 || name == "latest") return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
          c == '-')) {
      return false;
    }
  }
  static const std::regex version_like(R"(v?\d+)");
  return !std::regex_match(name, version_like);
}

bool process_alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

}  // namespace

// ---------------------------------------------------------------------------
std::string ResumeChoice::describe() const {
  std::ostringstream out;
  for (const auto& [version, reason] : skipped) {
    out << "skipped " << CheckpointStore::version_label(version) << ": " << reason << "\n";
  }
  for (const auto& [version, reason] : passed_over) {
    out << "not using " << CheckpointStore::version_label(version) << ": " << reason << "\n";
  }
  for (const std::string& name : interrupted_saves) {
    out << "an interrupted save left '" << name << "' (its process is gone)\n";
  }
  if (version) {
    out << "using " << CheckpointStore::version_label(*version) << "\n";
  } else {
    out << "no valid checkpoint\n";
  }
  return out.str();
}

CheckpointStore::CheckpointStore(std::string directory, StoreOptions options)
    : directory_(std::move(directory)), options_(options) {
  if (directory_.empty()) directory_ = ".";
}

std::string CheckpointStore::version_label(std::int64_t version) {
  char text[32];
  std::snprintf(text, sizeof text, "v%06lld", static_cast<long long>(version));
  return text;
}

std::string CheckpointStore::shard_path(std::int64_t version, int rank) const {
  return (fs::path(directory_) / (version_label(version) + ".rank" + std::to_string(rank) + ".h5")).string();
}

std::string CheckpointStore::index_path(std::int64_t version) const {
  return (fs::path(directory_) / (version_label(version) + ".index.json")).string();
}

std::string CheckpointStore::latest_path() const { return (fs::path(directory_) / kLatestFile).string(); }
std::string CheckpointStore::lock_path() const { return (fs::path(directory_) / kLockFile).string(); }

// ---------------------------------------------------------------------------
std::unique_ptr<CheckpointWriter> CheckpointStore::shard_writer(std::int64_t version, int rank, int num_shards) const {
  if (version < 0) throw CheckpointError("checkpoint version must be >= 0, got " + std::to_string(version));
  std::error_code ec;
  fs::create_directories(directory_, ec);
  if (ec) throw CheckpointError("cannot create checkpoint directory '" + directory_ + "': " + ec.message());
  return std::make_unique<CheckpointWriter>(shard_path(version, rank), ShardIdentity{version, rank, num_shards},
                                            options_.faults);
}

bool CheckpointStore::complete_version(std::int64_t version, int num_shards, bool move_latest,
                                       std::optional<std::int64_t> only_if_latest_is) {
  const std::string label = version_label(version);
  JsonWriter json;
  json.begin_object().key("format").value(kIndexFormat).key("version").value(version);
  json.key("num_shards").value(num_shards).key("shards").begin_array();
  for (int rank = 0; rank < num_shards; ++rank) {
    const std::string path = shard_path(version, rank);
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      throw CheckpointError("cannot complete version " + label + ": shard '" + path + "' (rank " +
                            std::to_string(rank) + " of " + std::to_string(num_shards) + ") does not exist");
    }
    // The identity catches a shard of another version or shard count under
    // this name; the arrays are checked when the version is read.
    const ShardIdentity id = read_shard_identity(path);
    if (id.version != version || id.rank != rank || id.num_shards != num_shards) {
      throw CheckpointError("cannot complete version " + label + ": '" + path + "' holds version " +
                            std::to_string(id.version) + " rank " + std::to_string(id.rank) + " of " +
                            std::to_string(id.num_shards));
    }
    json.begin_object().key("rank").value(rank);
    json.key("file").value(fs::path(path).filename().string());
    json.key("bytes").value(static_cast<std::int64_t>(file_size_or_zero(path)));
    json.end_object();
  }
  json.end_array().end_object();
  options_.faults.at(FaultPoint::BeforeIndex, index_path(version));
  write_file_atomically(index_path(version), json.str() + "\n");
  if (!move_latest) return false;
  const FileLock lock(lock_path(), kLockTimeoutS);
  if (only_if_latest_is) {
    const std::optional<std::int64_t> current = latest();
    if (current && *current != *only_if_latest_is) return false;
  }
  options_.faults.at(FaultPoint::BeforeLatest, latest_path());
  set_latest(version);
  return true;
}

void CheckpointStore::set_latest(std::int64_t version) {
  write_file_atomically(latest_path(), version_label(version) + "\n");
}

// ---------------------------------------------------------------------------
std::vector<std::int64_t> CheckpointStore::versions() const {
  std::set<std::int64_t> found;
  std::error_code ec;
  if (!fs::is_directory(directory_, ec)) {
    throw CheckpointError("checkpoint directory '" + directory_ + "' does not exist");
  }
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch match;
    if (std::regex_match(name, match, shard_pattern()) || std::regex_match(name, match, index_pattern())) {
      found.insert(std::stoll(match[1].str()));
    }
  }
  return {found.begin(), found.end()};
}

int CheckpointStore::num_shards(std::int64_t version) const {
  return read_index(index_path(version), version).num_shards;
}

CheckpointReader CheckpointStore::open_shard(std::int64_t version, int rank) const {
  const Index index = read_index(index_path(version), version);
  if (rank < 0 || rank >= index.num_shards) {
    throw CheckpointError("version " + version_label(version) + " has " + std::to_string(index.num_shards) +
                          " shards; rank " + std::to_string(rank) + " has none");
  }
  const ShardEntry& entry = index.shards[static_cast<std::size_t>(rank)];
  const std::string path = (fs::path(directory_) / entry.file).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw CheckpointError("checkpoint file '" + path + "' is missing (named by " + index_path(version) + ")");
  }
  const std::uint64_t size = file_size_or_zero(path);
  if (size != entry.bytes) {
    throw CheckpointError("checkpoint file '" + path + "' has " + std::to_string(size) + " bytes, the index says " +
                          std::to_string(entry.bytes) + (size < entry.bytes ? " (truncated)" : ""));
  }
  CheckpointReader reader(path);
  const ShardIdentity& id = reader.identity();
  if (id.version != version || id.rank != rank || id.num_shards != index.num_shards) {
    throw CheckpointError("checkpoint file '" + path + "' holds version " + std::to_string(id.version) + " rank " +
                          std::to_string(id.rank) + " of " + std::to_string(id.num_shards) + ", expected version " +
                          std::to_string(version) + " rank " + std::to_string(rank) + " of " +
                          std::to_string(index.num_shards));
  }
  return reader;
}

VerifyResult CheckpointStore::verify(std::int64_t version) const {
  VerifyResult result;
  try {
    const Index index = read_index(index_path(version), version);
    for (int rank = 0; rank < index.num_shards; ++rank) {
      result.bytes_checked += open_shard(version, rank).verify_all();
    }
    result.valid = true;
  } catch (const Error& error) {
    result.problem = error.what();
  }
  return result;
}

std::uint64_t CheckpointStore::bytes_on_disk(std::int64_t version) const {
  std::uint64_t total = 0;
  const std::string prefix = version_label(version) + ".";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) total += file_size_or_zero(entry.path().string());
  }
  return total;
}

std::vector<VersionInfo> CheckpointStore::list() const {
  const std::optional<std::int64_t> current = latest_pointer().version;
  const auto all_tags = tags();
  std::vector<VersionInfo> infos;
  for (std::int64_t version : versions()) {
    VersionInfo info;
    info.version = version;
    info.is_latest = current && *current == version;
    info.bytes = bytes_on_disk(version);
    for (const auto& [name, tagged] : all_tags) {
      if (tagged == version) info.tags.push_back(name);
    }
    std::error_code ec;
    info.complete = fs::exists(index_path(version), ec);
    const VerifyResult verified = verify(version);
    info.valid = verified.valid;
    info.problem = verified.problem;
    try {
      info.num_shards = info.complete ? num_shards(version) : 0;
      const CheckpointReader shard0(shard_path(version, 0));
      if (shard0.has_attribute(attribute_key::kLearnerStep)) {
        info.learner_step = shard0.int_attribute(attribute_key::kLearnerStep);
      }
      if (shard0.has_attribute(attribute_key::kPolicyVersion)) {
        info.policy_version = shard0.int_attribute(attribute_key::kPolicyVersion);
      }
      if (shard0.has_attribute(attribute_key::kCreatedUnix)) {
        info.created_unix = shard0.int_attribute(attribute_key::kCreatedUnix);
      }
      const std::string prefix = attribute_key::kMetricPrefix;
      for (const auto& [name, value] : shard0.attributes()) {
        if (name.rfind(prefix, 0) != 0) continue;
        if (const auto* d = std::get_if<double>(&value)) info.metrics[name.substr(prefix.size())] = *d;
        if (const auto* i = std::get_if<std::int64_t>(&value)) {
          info.metrics[name.substr(prefix.size())] = static_cast<double>(*i);
        }
      }
    } catch (const Error&) {
      // Unreadable metadata: the problem is already recorded by verify().
    }
    infos.push_back(std::move(info));
  }
  return infos;
}

std::optional<std::int64_t> CheckpointStore::latest() const {
  LatestPointer pointer = latest_pointer();
  if (!pointer.problem.empty()) throw CheckpointError(pointer.problem);
  return pointer.version;
}

LatestPointer CheckpointStore::latest_pointer() const {
  LatestPointer pointer;
  std::error_code ec;
  if (!fs::exists(latest_path(), ec)) return pointer;
  std::string text;
  try {
    text = read_whole_file(latest_path());
  } catch (const Error& error) {
    pointer.problem = "latest pointer '" + latest_path() + "' is unreadable: " + error.what();
    return pointer;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  static const std::regex pattern(R"(v(\d{1,18}))");  // 18 digits: no stoll overflow
  std::smatch match;
  if (!std::regex_match(text, match, pattern)) {
    constexpr std::size_t kShown = 40;  // a binary blob would flood the message
    const std::string shown = text.size() > kShown ? text.substr(0, kShown) + "..." : text;
    pointer.problem = "latest pointer '" + latest_path() + "' is corrupt: '" + shown + "'";
    return pointer;
  }
  pointer.version = std::stoll(match[1].str());
  return pointer;
}

std::int64_t CheckpointStore::resolve(const std::string& version_or_tag) const {
  if (version_or_tag == "latest") {
    const auto current = latest();
    if (!current) throw CheckpointError("'" + directory_ + "' has no latest pointer yet");
    return *current;
  }
  static const std::regex pattern(R"(v?(\d+))");
  std::smatch match;
  if (std::regex_match(version_or_tag, match, pattern)) return std::stoll(match[1].str());
  const auto all_tags = tags();
  const auto it = all_tags.find(version_or_tag);
  if (it != all_tags.end()) return it->second;
  std::string known;
  for (const auto& [name, version] : all_tags) known += (known.empty() ? "" : ", ") + name;
  throw CheckpointError("'" + version_or_tag + "' is neither a version nor a tag in '" + directory_ +
                        "' (tags: " + (known.empty() ? "none" : known) + ")");
}

ResumeChoice CheckpointStore::newest_valid() const {
  ResumeChoice choice;
  const std::vector<std::int64_t> all = versions();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const VerifyResult verified = verify(*it);
    if (verified.valid) {
      choice.version = *it;
      return choice;
    }
    choice.skipped.emplace_back(*it, verified.problem);
  }
  return choice;
}

ResumeChoice CheckpointStore::resume_choice() const {
  const LatestPointer pointer = latest_pointer();
  const std::optional<std::int64_t> current = pointer.version;
  std::string latest_problem = pointer.problem;
  ResumeChoice choice;
  bool latest_valid = false;
  if (current) {
    const VerifyResult verified = verify(*current);
    latest_valid = verified.valid;
    if (verified.valid) {
      choice.version = current;
    } else {
      latest_problem = "latest: " + verified.problem;
    }
  }
  if (!latest_valid) {
    choice = newest_valid();
    if (current && !latest_problem.empty()) {
      const bool listed =
          std::any_of(choice.skipped.begin(), choice.skipped.end(), [&](const auto& s) { return s.first == *current; });
      if (!listed) choice.skipped.insert(choice.skipped.begin(), {*current, latest_problem});
    }
  }
  note_passed_over(choice);
  return choice;
}

void CheckpointStore::note_passed_over(ResumeChoice& choice) const {
  if (choice.version) {
    const std::vector<std::int64_t> all = versions();
    for (auto it = all.rbegin(); it != all.rend() && *it > *choice.version; ++it) {
      const bool skipped =
          std::any_of(choice.skipped.begin(), choice.skipped.end(), [&](const auto& s) { return s.first == *it; });
      if (skipped) continue;
      const VerifyResult verified = verify(*it);
      choice.passed_over.emplace_back(*it, verified.valid ? "complete and valid, but `latest` names " +
                                                                version_label(*choice.version) +
                                                                " (a save stopped before `latest` moved, or a rollback)"
                                                          : verified.problem);
    }
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    const std::string name = entry.path().filename().string();
    if (!is_temporary_name(name)) continue;
    const long pid = std::strtol(name.c_str() + name.find(".tmp.") + 5, nullptr, 10);
    if (!process_alive(pid)) choice.interrupted_saves.push_back(name);
  }
  std::sort(choice.interrupted_saves.begin(), choice.interrupted_saves.end());
}

// ---------------------------------------------------------------------------
std::map<std::string, std::int64_t> CheckpointStore::tags() const {
  const std::string path = (fs::path(directory_) / kTagsFile).string();
  std::map<std::string, std::int64_t> result;
  std::error_code ec;
  if (!fs::exists(path, ec)) return result;
  try {
    const JsonValue json = JsonValue::parse(read_whole_file(path));
    for (const auto& [name, version] : json.at("tags").as_object()) {
      result[name] = static_cast<std::int64_t>(version.as_number());
    }
  } catch (const JsonError& error) {
    throw CheckpointError("tags file '" + path + "' is corrupt: " + error.what());
  }
  return result;
}

void CheckpointStore::write_tags(const std::map<std::string, std::int64_t>& all_tags) {
  JsonWriter json;
  json.begin_object().key("tags").begin_object();
  for (const auto& [name, version] : all_tags) json.key(name).value(version);
  json.end_object().end_object();
  write_file_atomically((fs::path(directory_) / kTagsFile).string(), json.str() + "\n");
}

void CheckpointStore::tag(std::int64_t version, const std::string& name) {
  if (!valid_tag_name(name)) {
    throw CheckpointError("invalid tag name '" + name + "': use [A-Za-z0-9_.-], not 'latest' and not a version number");
  }
  const VerifyResult verified = verify(version);
  if (!verified.valid) {
    throw CheckpointError("refusing to tag " + version_label(version) + " as '" + name + "': " + verified.problem);
  }
  auto all_tags = tags();
  all_tags[name] = version;
  write_tags(all_tags);
}

void CheckpointStore::untag(const std::string& name) {
  auto all_tags = tags();
  if (all_tags.erase(name) == 0) throw CheckpointError("no tag '" + name + "' in '" + directory_ + "'");
  write_tags(all_tags);
}

RollbackResult CheckpointStore::rollback_to(const std::string& version_or_tag) {
  const FileLock lock(lock_path(), kLockTimeoutS);
  RollbackResult result;
  result.from = latest_pointer().version;  // a corrupt pointer is what a rollback repairs
  result.to = resolve(version_or_tag);
  const VerifyResult verified = verify(result.to);
  if (!verified.valid) {
    throw CheckpointError("refusing to roll back to " + version_label(result.to) + " ('" + version_or_tag +
                          "'): " + verified.problem);
  }
  set_latest(result.to);
  return result;
}

RollbackResult CheckpointStore::rollback_previous() {
  const FileLock lock(lock_path(), kLockTimeoutS);
  RollbackResult result;
  result.from = latest();
  if (!result.from) throw CheckpointError("'" + directory_ + "' has no latest pointer: nothing to roll back from");
  const std::vector<std::int64_t> all = versions();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (*it >= *result.from) continue;
    const VerifyResult verified = verify(*it);
    if (verified.valid) {
      result.to = *it;
      set_latest(result.to);
      return result;
    }
    result.skipped.emplace_back(*it, verified.problem);
  }
  throw CheckpointError("no valid version older than " + version_label(*result.from) + " in '" + directory_ + "' (" +
                        std::to_string(result.skipped.size()) + " older version(s) invalid)");
}

RetentionResult CheckpointStore::apply_retention(int keep_last, std::optional<std::int64_t> just_written) {
  if (keep_last < 1) throw CheckpointError("retention must keep at least 1 version, got " + std::to_string(keep_last));
  RetentionResult result;
  const std::vector<std::int64_t> all = versions();
  std::vector<std::int64_t> complete;
  std::error_code ec;
  for (std::int64_t v : all) {
    if (fs::exists(index_path(v), ec)) complete.push_back(v);
  }
  std::set<std::int64_t> keep;
  for (auto it = complete.rbegin(); it != complete.rend() && static_cast<int>(keep.size()) < keep_last; ++it) {
    keep.insert(*it);
  }
  for (const auto& [name, version] : tags()) keep.insert(version);
  // A corrupt pointer protects nothing; the newest valid version is kept below.
  if (const auto current = latest_pointer().version) keep.insert(*current);
  const std::int64_t newest_complete = complete.empty() ? -1 : complete.back();
  if (!(just_written && *just_written == newest_complete)) {
    if (const auto newest = newest_valid().version) keep.insert(*newest);
  }

  for (std::int64_t v : all) {
    const bool is_complete = std::binary_search(complete.begin(), complete.end(), v);
    if (keep.count(v)) {
      result.kept.push_back(v);
      continue;
    }
    // An incomplete version newer than every complete one may be a save in progress.
    if (!is_complete && v > newest_complete) {
      result.kept.push_back(v);
      continue;
    }
    // Index first: from here on the version is incomplete, whatever happens next.
    fs::remove(index_path(v), ec);
    fsync_directory(directory_);
    const std::string prefix = version_label(v) + ".";
    for (const auto& entry : fs::directory_iterator(directory_, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) == 0) fs::remove(entry.path(), ec);
    }
    if (is_complete) {
      result.deleted.push_back(v);
    } else {
      result.removed_leftovers.push_back(version_label(v) + " (incomplete)");
    }
  }
  // Temporary files whose writer process is gone.
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    const std::string name = entry.path().filename().string();
    if (!is_temporary_name(name)) continue;
    const std::size_t tmp = name.find(".tmp.");
    const long pid = std::strtol(name.c_str() + tmp + 5, nullptr, 10);
    if (!process_alive(pid)) {
      fs::remove(entry.path(), ec);
      result.removed_leftovers.push_back(name);
    }
  }
  fsync_directory(directory_);
  return result;
}

// ---------------------------------------------------------------------------
std::uint64_t CheckpointStore::export_weights(std::int64_t version, const std::string& out_path,
                                              const std::string& prefix) const {
  // The logical arrays: an expert-parallel version's split ones gathered, so
  // the file is the same whatever the layout the version was saved in.
  const ShardedVersion shards(*this, version);
  CheckpointWriter writer(out_path, ShardIdentity{version, 0, 1});
  for (const char* key : {attribute_key::kLearnerStep, attribute_key::kPolicyVersion, attribute_key::kConfigToml}) {
    if (shards.primary().has_attribute(key)) writer.set_attribute(key, shards.primary().attributes().at(key));
  }
  std::size_t exported = 0;
  for (const ArrayInfo& array : shards.arrays()) {
    if (array.name.rfind(prefix, 0) != 0) continue;
    const std::vector<std::uint8_t> bytes = shards.read(array.name);
    writer.add_array(array.name, array.dtype, array.shape, bytes.data(), bytes.size());
    ++exported;
  }
  if (exported == 0) {
    throw CheckpointError("cannot export " + version_label(version) + ": it has no arrays under '" + prefix + "'");
  }
  writer.set_attribute("weights_only", std::int64_t{1});
  writer.set_attribute("exported_from", (fs::path(directory_) / version_label(version)).string());
  return writer.commit();
}

}  // namespace moerl::storage
