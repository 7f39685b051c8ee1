#include "moerl/env/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

extern char** environ;

namespace moerl::env {
namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

ChildProcess::ChildProcess(const std::string& command) : command_(command) {
  // A write to a dead child must be an error we report, not a SIGPIPE that
  // kills the env worker.
  signal(SIGPIPE, SIG_IGN);
  int in_pipe[2], out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0)
    throw ProcessError("cannot create pipes for '" + command + "': " + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  // Its own process group: the shell may fork the real program, and killing
  // the group reaches both (killing only the shell would orphan the program).
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  const int status = posix_spawn(&pid_, "/bin/sh", &actions, &attributes, const_cast<char**>(argv), environ);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  to_child_ = in_pipe[1];
  from_child_ = out_pipe[0];
  if (status != 0) {
    close_fd(to_child_);
    close_fd(from_child_);
    reaped_ = true;
    throw ProcessError("cannot start '" + command + "': " + std::strerror(status));
  }
}

ChildProcess::~ChildProcess() {
  close_fd(to_child_);
  close_fd(from_child_);
  if (!reaped_ && pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  } else if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);  // the shell is gone; its children may not be
  }
}

void ChildProcess::kill() {
  if (pid_ > 0) ::kill(-pid_, SIGKILL);
}

std::string ChildProcess::describe_exit() {
  if (reaped_) return "it had already exited";
  int status = 0;
  // The child closed stdout; give it a moment to finish exiting.
  for (int i = 0; i < 50; ++i) {
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      reaped_ = true;
      if (WIFEXITED(status)) return "it exited with status " + std::to_string(WEXITSTATUS(status));
      if (WIFSIGNALED(status)) return "it was killed by signal " + std::to_string(WTERMSIG(status));
      return "it stopped";
    }
    usleep(2000);
  }
  return "it closed its stdout";
}

void ChildProcess::write_line(const std::string& text) {
  std::string line = text + "\n";
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = ::write(to_child_, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw ProcessError("environment process " + std::to_string(pid_) + " ('" + command_ +
                         "') no longer reads its stdin: " + describe_exit());
    written += static_cast<size_t>(n);
  }
}

std::optional<std::string> ChildProcess::read_line(double timeout_s) {
  const double deadline = now_seconds() + timeout_s;
  for (;;) {
    if (const auto newline = buffered_.find('\n'); newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    const double left = deadline - now_seconds();
    if (left <= 0) return std::nullopt;
    pollfd fd{from_child_, POLLIN, 0};
    const int ready = ::poll(&fd, 1, static_cast<int>(left * 1000) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;  // re-check the deadline
    char chunk[4096];
    const ssize_t n = ::read(from_child_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw ProcessError("environment process " + std::to_string(pid_) + " ('" + command_ +
                         "') ended its output: " + describe_exit());
    buffered_.append(chunk, static_cast<size_t>(n));
    if (buffered_.size() > (64u << 20))
      throw ProcessError("environment process " + std::to_string(pid_) +
                         " wrote over 64 MiB without a newline");
  }
}

}  // namespace moerl::env
