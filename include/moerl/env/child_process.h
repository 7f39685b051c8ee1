#pragma once
// A child process started with `/bin/sh -c COMMAND`, its stdin and stdout
// connected to us by pipes (stderr is inherited, so its complaints reach the
// job log). Reads take a timeout; a dead child is an error naming its exit
// status, never a hang.
//
// Nothing outlives us: each child leads its own process group (the shell may
// fork the real program), which is killed when the ChildProcess goes, on
// kill(), by kill_all_child_process_groups() (abort paths), and, when this
// process dies without any of those (SIGKILL, MPI_Abort), by a watchdog
// process that holds the other end of a pipe from us and kills every group
// still registered once that pipe closes.

#include <sys/types.h>

#include <optional>
#include <string>

#include "moerl/env/env_failure.h"

namespace moerl::env {

// The process could not start, exited, or broke the pipe protocol; the
// reason is FailureCannotStart or FailureCrashed.
class ProcessError : public EnvironmentFailure {
 public:
  using EnvironmentFailure::EnvironmentFailure;
};

class ChildProcess {
 public:
  explicit ChildProcess(const std::string& command);
  ~ChildProcess();  // kills (SIGKILL) the child's process group and reaps the child
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Writes text + '\n'; throws ProcessError if the child is gone.
  void write_line(const std::string& text);
  // The next line (without '\n'), or nullopt if none arrived within timeout_s.
  // Throws ProcessError when the child closed its stdout or exited.
  std::optional<std::string> read_line(double timeout_s);

  void kill();  // SIGKILL to the whole group; safe to call from another thread
  pid_t pid() const { return pid_; }
  const std::string& command() const { return command_; }

 private:
  std::string describe_exit(FailureReason& reason);

  std::string command_;
  pid_t pid_ = -1;
  int to_child_ = -1;    // child's stdin
  int from_child_ = -1;  // child's stdout
  std::string buffered_;
  bool reaped_ = false;
};

// SIGKILLs the process group of every live ChildProcess of this process.
// Async-signal-safe (a fixed table and kill(2)): abort and signal paths call it.
void kill_all_child_process_groups();

// Process groups of live children (for tests: nothing may be left behind).
int live_child_process_groups();

}  // namespace moerl::env
