#include "moerl/storage/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moerl/core/error.h"

namespace moerl::storage {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void throw_errno(const std::string& what, const std::string& path, int code) {
  throw Error(what + " '" + path + "': " + std::strerror(code));
}

void fsync_fd_of(const std::string& path, int flags, const char* what) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw_errno(std::string("cannot open for ") + what, path, errno);
  const int rc = ::fsync(fd);
  const int code = errno;
  ::close(fd);
  // Some file systems (tmpfs in containers) refuse fsync on directories: nothing to sync there.
  if (rc != 0 && code != EINVAL && code != EROFS) throw_errno(std::string("cannot ") + what, path, code);
}

}  // namespace

std::string temporary_path_for(const std::string& final_path) {
  static std::atomic<unsigned> counter{0};
  const fs::path target(final_path);
  const std::string name = "." + target.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                           std::to_string(counter.fetch_add(1));
  return (target.parent_path() / name).string();
}

bool is_temporary_name(const std::string& file_name) {
  return !file_name.empty() && file_name[0] == '.' && file_name.find(".tmp.") != std::string::npos;
}

void fsync_file(const std::string& path) { fsync_fd_of(path, O_RDONLY, "fsync"); }

void fsync_directory(const std::string& directory) {
  fsync_fd_of(directory.empty() ? "." : directory, O_RDONLY | O_DIRECTORY, "fsync directory");
}

void rename_durably(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    throw Error("cannot rename '" + from + "' to '" + to + "': " + std::strerror(errno));
  }
  fsync_directory(fs::path(to).parent_path().string());
}

void write_file_atomically(const std::string& path, const std::string& content) {
  const std::string temporary = temporary_path_for(path);
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw_errno("cannot create", temporary, errno);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    if (!out) {
      std::remove(temporary.c_str());
      throw Error("cannot write '" + temporary + "'");
    }
  }
  try {
    fsync_file(temporary);
    rename_durably(temporary, path);
  } catch (...) {
    std::remove(temporary.c_str());
    throw;
  }
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_errno("cannot read", path, errno);
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

}  // namespace moerl::storage
