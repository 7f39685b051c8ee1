#pragma once
// Copies completed checkpoint versions (and other run artifacts: environment
// snapshots, metric logs) into an archive directory, the stand-in for object
// storage, on one background thread. archive_copy() returns at once: a
// training step never waits for a copy. The archive of checkpoints is itself a
// checkpoint store (same layout), so `moerl checkpoint list ARCHIVE` works on it.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moerl::storage {

struct ArchiveResult {
  std::string what;         // "v000012" or the copied file
  std::string destination;  // directory or file in the archive
  std::uint64_t bytes = 0;
  double seconds = 0;
  std::vector<std::int64_t> pruned;  // versions the archive's retention deleted
};

class Archiver {
 public:
  // keep_last: versions kept in the archive (plus tagged ones); 0 keeps all.
  Archiver(std::string checkpoint_dir, std::string archive_dir, int keep_last = 0);
  // Finishes the queued copies, then stops the thread.
  ~Archiver();
  Archiver(const Archiver&) = delete;
  Archiver& operator=(const Archiver&) = delete;

  // Queues a copy of a complete, valid version into ARCHIVE/checkpoints. The
  // future holds the result or the error (a version that does not verify, a
  // full disk); copies are verified in the archive before they count.
  std::future<ArchiveResult> archive_copy(std::int64_t version);
  // Queues a copy of any file to ARCHIVE/<relative_destination> (temporary name, fsync, rename).
  std::future<ArchiveResult> archive_file(const std::string& source_path, const std::string& relative_destination);

  std::size_t pending() const;  // queued or running
  void wait_idle() const;
  // As wait_idle(), for at most `timeout_s`; false when copies are still queued or running.
  bool wait_idle_for(double timeout_s) const;
  std::string checkpoint_archive_dir() const;

 private:
  std::future<ArchiveResult> enqueue(std::function<ArchiveResult()> job);
  void run();
  ArchiveResult copy_version(std::int64_t version);

  std::string checkpoint_dir_;
  std::string archive_dir_;
  int keep_last_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::deque<std::packaged_task<ArchiveResult()>> queue_;
  std::size_t running_ = 0;
  bool stopping_ = false;
  std::thread worker_;  // last: starts after every other member exists
};

}  // namespace moerl::storage
