#pragma once
// A directory of versioned checkpoints: writing versions atomically, listing
// and verifying them, tags, rollback, retention, resume fallback and export.
//
// Directory layout (DIR = e.g. runs/x/checkpoints):
//   v000012.rank0.h5 ... v000012.rankN-1.h5   one shard per writing learner (the
//                                              members of an expert group: expert_shards.h)
//   v000012.index.json                         written last: names the shards, their sizes
//   latest                                     "v000012\n", replaced atomically
//   tags.json                                  {"tags": {"NAME": 12, ...}}, replaced atomically
//   .NAME.tmp.PID.N                            a save in progress (or a crash's leftover)
// A version is complete only when its index exists and names every shard; it
// is valid when, in addition, every shard opens, matches the index, and every
// checksum holds. `latest` moves only after the index is durable, so a crash
// at any point leaves `latest` on a complete version.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moerl/storage/checkpoint_file.h"

namespace moerl::storage {

struct StoreOptions {
  FaultInjection faults;  // for crash tests; FaultInjection::from_environment() in tools
};

struct VersionInfo {
  std::int64_t version = 0;
  bool complete = false;  // the index exists
  bool valid = false;     // complete and fully verified
  std::string problem;    // why not valid ("" when valid)
  bool is_latest = false;
  int num_shards = 0;
  std::int64_t learner_step = -1;  // -1: unknown (shard 0 unreadable or attribute absent)
  std::int64_t policy_version = -1;
  std::int64_t created_unix = 0;
  std::map<std::string, double> metrics;  // attributes "metric.NAME" of shard 0, prefix removed
  std::vector<std::string> tags;
  std::uint64_t bytes = 0;  // every file of the version on disk
};

struct VerifyResult {
  bool valid = false;
  std::string problem;  // the first problem found, naming file and dataset
  std::uint64_t bytes_checked = 0;
};

// Which version to resume from, and which newer ones were passed over and why.
struct ResumeChoice {
  std::optional<std::int64_t> version;
  std::vector<std::pair<std::int64_t, std::string>> skipped;  // (version, reason), newest first
  // resume_choice(): versions newer than the choice that `latest` does not
  // name (a save that stopped before `latest` moved, or a rollback), and
  // temporary files of saves whose process is gone (a crash mid-save).
  std::vector<std::pair<std::int64_t, std::string>> passed_over;
  std::vector<std::string> interrupted_saves;
  bool noteworthy() const { return !skipped.empty() || !passed_over.empty() || !interrupted_saves.empty(); }
  std::string describe() const;  // one line per skipped or passed-over version and leftover, then the choice
};

// What the `latest` file says: a version, nothing (no file yet), or a
// problem (the file is unreadable or holds something other than "vNNNNNN").
struct LatestPointer {
  std::optional<std::int64_t> version;
  std::string problem;  // "" when the pointer is readable (or absent)
};

struct RollbackResult {
  std::optional<std::int64_t> from;  // latest before the rollback
  std::int64_t to = 0;
  std::vector<std::pair<std::int64_t, std::string>> skipped;  // --previous: invalid versions passed over
};

struct RetentionResult {
  std::vector<std::int64_t> kept;
  std::vector<std::int64_t> deleted;
  std::vector<std::string> removed_leftovers;  // temporary files of dead writers, incomplete old versions
};

class CheckpointStore {
 public:
  explicit CheckpointStore(std::string directory, StoreOptions options = {});

  const std::string& directory() const { return directory_; }
  static std::string version_label(std::int64_t version);  // "v000012"
  std::string shard_path(std::int64_t version, int rank) const;
  std::string index_path(std::int64_t version) const;
  std::string latest_path() const;
  // Held by every change of `latest` (saves and rollbacks, across processes).
  std::string lock_path() const;

  // --- Writing a version -------------------------------------------------
  // Each learner rank writes its shard through this writer (creates the
  // directory); commit() puts the shard in place.
  std::unique_ptr<CheckpointWriter> shard_writer(std::int64_t version, int rank, int num_shards) const;
  // Once every shard is committed (after the caller's barrier), one rank writes
  // the index, then moves `latest` to this version; with `only_if_latest_is`,
  // only when `latest` still names that version (or nothing), checked and
  // moved under the store's lock so that a concurrent rollback is never
  // overwritten. Returns whether `latest` moved. Throws when a shard is missing.
  bool complete_version(std::int64_t version, int num_shards, bool move_latest = true,
                        std::optional<std::int64_t> only_if_latest_is = std::nullopt);

  // --- Reading -----------------------------------------------------------
  std::vector<std::int64_t> versions() const;  // every version with any file on disk, ascending
  // Verifies every version (reads all data). A corrupt `latest` marks no
  // version as latest and does not stop the listing (see latest_pointer()).
  std::vector<VersionInfo> list() const;
  VerifyResult verify(std::int64_t version) const;
  // Opens one shard of a complete version after checking it against the index
  // (the checksums are verified as arrays are read).
  CheckpointReader open_shard(std::int64_t version, int rank) const;
  int num_shards(std::int64_t version) const;  // from the index

  // Throws CheckpointError naming the file when `latest` is corrupt.
  std::optional<std::int64_t> latest() const;
  // The same without throwing, for the readers that cope with a corrupt pointer.
  LatestPointer latest_pointer() const;
  // "latest", "12", "v000012", or a tag name.
  std::int64_t resolve(const std::string& version_or_tag) const;
  // The newest valid version, passing over corrupt or incomplete ones.
  ResumeChoice newest_valid() const;
  // For `--resume auto`: `latest` when it is valid (it may have been rolled
  // back on purpose), otherwise the newest valid version.
  ResumeChoice resume_choice() const;

  // --- Tags, rollback, retention -----------------------------------------
  std::map<std::string, std::int64_t> tags() const;
  // Tags a valid version (a tag that exists moves); names: [A-Za-z0-9_.-], not a version number.
  void tag(std::int64_t version, const std::string& name);
  void untag(const std::string& name);
  // Moves `latest` to a version or tag; refuses a target that is not valid.
  // Also repairs a corrupt `latest` (`from` is then empty).
  RollbackResult rollback_to(const std::string& version_or_tag);
  // Moves `latest` to the newest valid version older than the current `latest`.
  RollbackResult rollback_previous();
  // Keeps the newest `keep_last` complete versions, every tagged version, the
  // version `latest` names and the newest valid one; deletes the other
  // versions (index first, so a half-deleted version is never complete) and
  // leftovers of crashed saves. `just_written`: a version the caller has
  // just completed (so known valid); when it is the newest complete one, the
  // newest-valid search (a full read of it) is skipped.
  RetentionResult apply_retention(int keep_last, std::optional<std::int64_t> just_written = std::nullopt);

  // --- Export --------------------------------------------------------------
  // Writes the arrays under `prefix` of every shard into one checkpoint file
  // (weights only, for inference), expert arrays split over the shards of an
  // expert-parallel version gathered whole (expert_shards.h); returns its
  // size in bytes.
  std::uint64_t export_weights(std::int64_t version, const std::string& out_path,
                               const std::string& prefix = "model/") const;

 private:
  void set_latest(std::int64_t version);
  void note_passed_over(ResumeChoice& choice) const;
  void write_tags(const std::map<std::string, std::int64_t>& tags);
  std::uint64_t bytes_on_disk(std::int64_t version) const;

  std::string directory_;
  StoreOptions options_;
};

}  // namespace moerl::storage
