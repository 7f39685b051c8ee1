#include "moerl/storage/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "moerl/core/error.h"

namespace moerl::storage {

FileLock::FileLock(std::string path, double timeout_s) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open lock file '" + path_ + "': " + std::strerror(errno));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int code = errno;
    if (code != EWOULDBLOCK && code != EINTR) {
      ::close(fd_);
      throw Error("cannot lock '" + path_ + "': " + std::strerror(code));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::close(fd_);
      throw Error("lock '" + path_ + "' still held by another process after " + std::to_string(timeout_s) +
                  " s (a stuck `moerl checkpoint` command or learner?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

FileLock::~FileLock() {
  // Closing the descriptor releases the lock.
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace moerl::storage
