#pragma once
// An exclusive advisory lock on a file (flock(2)), held for one scope.
//
// The checkpoint store takes one around every change of `latest`: a save
// that moves `latest` only when nobody else moved it, and a `moerl checkpoint
// rollback` from another process, must not interleave between the check and
// the write. The lock is released when the scope ends or the process dies.

#include <string>

namespace moerl::storage {

class FileLock {
 public:
  // Creates the lock file when missing. Waits at most `timeout_s` for another
  // holder, then throws moerl::Error naming the file.
  FileLock(std::string path, double timeout_s);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace moerl::storage
