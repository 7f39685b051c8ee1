#include "moerl/storage/archive.h"

#include <chrono>
#include <filesystem>
#include <fstream>

#include <hdf5.h>

#include "moerl/storage/atomic_file.h"
#include "moerl/storage/checkpoint_store.h"

// The archive thread verifies copies through HDF5 while the learner may be
// saving: that needs a thread-safe HDF5 build (Debian's serial one is).
#if !defined(H5_HAVE_THREADSAFE)
#warning "HDF5 is not thread-safe: archive copies must not overlap checkpoint saves"
#endif

namespace moerl::storage {

namespace fs = std::filesystem;

namespace {

// Copies through a temporary name in the destination directory, fsyncs, renames.
std::uint64_t copy_file_durably(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::create_directories(fs::path(to).parent_path(), ec);
  if (ec) throw Error("cannot create archive directory '" + fs::path(to).parent_path().string() + "': " + ec.message());
  const std::string temporary = temporary_path_for(to);
  if (!fs::copy_file(from, temporary, fs::copy_options::overwrite_existing, ec)) {
    throw Error("cannot copy '" + from + "' to '" + temporary + "': " + ec.message());
  }
  try {
    fsync_file(temporary);
    rename_durably(temporary, to);
  } catch (...) {
    fs::remove(temporary, ec);
    throw;
  }
  return static_cast<std::uint64_t>(fs::file_size(to, ec));
}

}  // namespace

Archiver::Archiver(std::string checkpoint_dir, std::string archive_dir, int keep_last)
    : checkpoint_dir_(std::move(checkpoint_dir)),
      archive_dir_(std::move(archive_dir)),
      keep_last_(keep_last),
      worker_([this] { run(); }) {}

Archiver::~Archiver() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

std::string Archiver::checkpoint_archive_dir() const { return (fs::path(archive_dir_) / "checkpoints").string(); }

std::future<ArchiveResult> Archiver::enqueue(std::function<ArchiveResult()> job) {
  std::packaged_task<ArchiveResult()> task(std::move(job));
  std::future<ArchiveResult> result = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  changed_.notify_all();
  return result;
}

std::future<ArchiveResult> Archiver::archive_copy(std::int64_t version) {
  return enqueue([this, version] { return copy_version(version); });
}

std::future<ArchiveResult> Archiver::archive_file(const std::string& source_path,
                                                  const std::string& relative_destination) {
  const std::string destination = (fs::path(archive_dir_) / relative_destination).string();
  return enqueue([source_path, destination] {
    const auto start = std::chrono::steady_clock::now();
    ArchiveResult result;
    result.what = source_path;
    result.destination = destination;
    result.bytes = copy_file_durably(source_path, destination);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  });
}

std::size_t Archiver::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size() + running_;
}

void Archiver::wait_idle() const {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return queue_.empty() && running_ == 0; });
}

bool Archiver::wait_idle_for(double timeout_s) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                           [this] { return queue_.empty() && running_ == 0; });
}

void Archiver::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and every queued copy is done
    std::packaged_task<ArchiveResult()> task = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    task();  // exceptions land in the future
    lock.lock();
    --running_;
    changed_.notify_all();
  }
}

ArchiveResult Archiver::copy_version(std::int64_t version) {
  const auto start = std::chrono::steady_clock::now();
  const CheckpointStore source(checkpoint_dir_);
  const VerifyResult verified = source.verify(version);
  if (!verified.valid) {
    throw CheckpointError("not archiving " + CheckpointStore::version_label(version) + ": " + verified.problem);
  }
  const std::string destination_dir = checkpoint_archive_dir();
  CheckpointStore archive(destination_dir);
  ArchiveResult result;
  result.what = CheckpointStore::version_label(version);
  result.destination = destination_dir;
  const int shards = source.num_shards(version);
  for (int rank = 0; rank < shards; ++rank) {
    result.bytes += copy_file_durably(source.shard_path(version, rank), archive.shard_path(version, rank));
  }
  // The index last, as in a save: the archived version is complete only now.
  result.bytes += copy_file_durably(source.index_path(version), archive.index_path(version));
  const std::string tags_file = (fs::path(checkpoint_dir_) / "tags.json").string();
  std::error_code ec;
  if (fs::exists(tags_file, ec)) copy_file_durably(tags_file, (fs::path(destination_dir) / "tags.json").string());
  const VerifyResult copied = archive.verify(version);
  if (!copied.valid) {
    throw CheckpointError("archived copy of " + result.what + " does not verify: " + copied.problem);
  }
  if (keep_last_ > 0) result.pruned = archive.apply_retention(keep_last_).deleted;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace moerl::storage
