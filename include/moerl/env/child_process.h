#pragma once
// A child process started with `/bin/sh -c COMMAND`, its stdin and stdout
// connected to us by pipes (stderr is inherited, so its complaints reach the
// job log). Reads take a timeout; a dead child is an error naming its exit
// status, never a hang.

#include <sys/types.h>

#include <optional>
#include <string>

#include "moerl/core/error.h"

namespace moerl::env {

class ProcessError : public Error {
 public:
  using Error::Error;
};

class ChildProcess {
 public:
  explicit ChildProcess(const std::string& command);
  ~ChildProcess();  // kills (SIGKILL) and reaps the child if it still runs
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Writes text + '\n'; throws ProcessError if the child is gone.
  void write_line(const std::string& text);
  // The next line (without '\n'), or nullopt if none arrived within timeout_s.
  // Throws ProcessError when the child closed its stdout or exited.
  std::optional<std::string> read_line(double timeout_s);

  void kill();           // SIGKILL; safe to call from another thread
  pid_t pid() const { return pid_; }
  const std::string& command() const { return command_; }

 private:
  std::string describe_exit();

  std::string command_;
  pid_t pid_ = -1;
  int to_child_ = -1;    // child's stdin
  int from_child_ = -1;  // child's stdout
  std::string buffered_;
  bool reaped_ = false;
};

}  // namespace moerl::env
