#include "moerl/env/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

#include "moerl/runtime/job_control.h"

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

// The process groups of live children, in a fixed table of atomics so that
// kill_all_child_process_groups() may run inside a signal handler.
std::array<std::atomic<pid_t>, 8192> g_live_groups{};

void remember_group(pid_t group) {
  for (auto& slot : g_live_groups) {
    pid_t empty = 0;
    if (slot.compare_exchange_strong(empty, group)) return;
  }
  // Full table: the watchdog below still covers this group.
}

void forget_group(pid_t group) {
  for (auto& slot : g_live_groups) {
    pid_t expected = group;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

// The watchdog: `/bin/sh` reading "+GROUP" / "-GROUP" lines from a pipe whose
// write end only this process holds (close-on-exec, so children do not).
// When this process ends in any way, SIGKILL and MPI_Abort included, the pipe
// reaches end-of-file and the watchdog kills every group still listed. A
// shell script because it must outlive us and needs nothing but read and kill;
// it ignores the terminal's and the launcher's stop signals so that it lives
// until our end, not before it.
constexpr const char* kWatchdogScript =
    "trap '' INT TERM HUP PIPE\n"
    "groups=' '\n"
    "while read -r op group; do\n"
    "  case \"$op\" in\n"
    "    +) groups=\"$groups$group \" ;;\n"
    "    -) kept=' '; for g in $groups; do [ \"$g\" = \"$group\" ] || kept=\"$kept$g \"; done; groups=$kept ;;\n"
    "  esac\n"
    "done\n"
    "for g in $groups; do kill -s KILL -- \"-$g\" 2>/dev/null; done\n";

class GroupWatchdog {
 public:
  static GroupWatchdog& instance() {
    static GroupWatchdog watchdog;
    return watchdog;
  }
  void announce(char op, pid_t group) {
    std::lock_guard<std::mutex> lock(mutex_);
    // A forked child inherited the parent's lifeline, which the parent keeps
    // open: the parent's watchdog would never see the child end. The child
    // gets one of its own on its first announcement.
    if (owner_ != ::getpid()) {
      close_fd(lifeline_);
      start();
    }
    if (lifeline_ < 0) return;
    const std::string line = std::string(1, op) + " " + std::to_string(group) + "\n";  // "+ 123": read -r op group
    // One short write to a pipe is atomic; a dead watchdog (EPIPE) is not our failure.
    [[maybe_unused]] const ssize_t written = ::write(lifeline_, line.data(), line.size());
  }

 private:
  GroupWatchdog() {
    // An error that aborts the job kills the groups at once, without waiting for our end.
    runtime::add_abort_cleanup(&kill_all_child_process_groups);
    // A fork while another thread announces must not leave the child's copy
    // of the mutex locked; and the parent's groups are not the child's.
    pthread_atfork([] { instance().mutex_.lock(); }, [] { instance().mutex_.unlock(); },
                   [] {
                     instance().mutex_.unlock();
                     for (auto& slot : g_live_groups) slot.store(0);
                   });
    start();
  }

  void start() {
    owner_ = ::getpid();
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[0], STDIN_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
    const char* argv[] = {"/bin/sh", "-c", kWatchdogScript, nullptr};
    pid_t pid = -1;
    const int status = posix_spawn(&pid, "/bin/sh", &actions, &attributes, const_cast<char**>(argv), environ);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipe_fds[0]);
    if (status != 0) {
      ::close(pipe_fds[1]);
      return;
    }
    lifeline_ = pipe_fds[1];
    // Never reaped by us: it exits when we do (the lifeline closes) and init reaps it.
  }

  std::mutex mutex_;
  int lifeline_ = -1;
  pid_t owner_ = -1;  // the process this watchdog watches over
};

}  // namespace

void kill_all_child_process_groups() {
  for (auto& slot : g_live_groups) {
    const pid_t group = slot.load();
    if (group > 0) ::kill(-group, SIGKILL);
  }
}

int live_child_process_groups() {
  int live = 0;
  for (const auto& slot : g_live_groups) live += slot.load() > 0;
  return live;
}

ChildProcess::ChildProcess(const std::string& command) : command_(command) {
  // A write to a dead child must be an error we report, not a SIGPIPE that
  // kills the env worker.
  signal(SIGPIPE, SIG_IGN);
  GroupWatchdog& watchdog = GroupWatchdog::instance();
  int in_pipe[2], out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0)
    throw ProcessError(FailureReason::FailureCannotStart,
                       "cannot create pipes for '" + command + "': " + std::strerror(errno));
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    const int error = errno;
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    throw ProcessError(FailureReason::FailureCannotStart,
                       "cannot create pipes for '" + command + "': " + std::strerror(error));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  // Descriptors the MPI library or other sessions opened without close-on-exec stay ours.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
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
    pid_ = -1;
    throw ProcessError(FailureReason::FailureCannotStart, "cannot start '" + command + "': " + std::strerror(status));
  }
  remember_group(pid_);
  watchdog.announce('+', pid_);
}

ChildProcess::~ChildProcess() {
  close_fd(to_child_);
  close_fd(from_child_);
  if (pid_ <= 0) return;
  // The group first: the shell's children die with it even when the shell already exited.
  ::kill(-pid_, SIGKILL);
  if (!reaped_) waitpid(pid_, nullptr, 0);
  forget_group(pid_);
  GroupWatchdog::instance().announce('-', pid_);
}

void ChildProcess::kill() {
  if (pid_ > 0) ::kill(-pid_, SIGKILL);
}

std::string ChildProcess::describe_exit(FailureReason& reason) {
  reason = FailureReason::FailureCrashed;
  if (reaped_) return "it had already exited";
  int status = 0;
  // The child closed stdout; give it a moment to finish exiting.
  for (int i = 0; i < 50; ++i) {
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      reaped_ = true;
      if (WIFEXITED(status)) {
        // The shell's own codes for "not found" and "not executable".
        if (WEXITSTATUS(status) == 127 || WEXITSTATUS(status) == 126) reason = FailureReason::FailureCannotStart;
        return "it exited with status " + std::to_string(WEXITSTATUS(status)) +
               (reason == FailureReason::FailureCannotStart ? " (the shell could not run the command)" : "");
      }
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
    if (n <= 0) {
      FailureReason reason;
      const std::string how = describe_exit(reason);
      throw ProcessError(reason, "environment process " + std::to_string(pid_) + " ('" + command_ +
                                     "') no longer reads its stdin: " + how);
    }
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
    if (n <= 0) {
      FailureReason reason;
      const std::string how = describe_exit(reason);
      throw ProcessError(
          reason, "environment process " + std::to_string(pid_) + " ('" + command_ + "') ended its output: " + how);
    }
    buffered_.append(chunk, static_cast<size_t>(n));
    if (buffered_.size() > (64u << 20))
      throw ProcessError(FailureReason::FailureInvalidJson,
                         "environment process " + std::to_string(pid_) + " wrote over 64 MiB without a newline");
  }
}

}  // namespace moerl::env
