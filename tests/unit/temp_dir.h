#pragma once
// A fresh directory under the system temp dir for one test, removed at scope exit.

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace moerl_test {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("moerl_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // A path inside the directory.
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace moerl_test
