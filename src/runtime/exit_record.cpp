#include "moerl/runtime/exit_record.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace moerl::runtime {
namespace {

// Formatted once by prepare_exit_record(): a signal handler cannot allocate.
char g_record_path[4096] = "";

}  // namespace

void prepare_exit_record() {
  const char* dir = std::getenv("MOERL_EXIT_STATUS_DIR");
  if (dir == nullptr || *dir == '\0') return;
  const int written =
      std::snprintf(g_record_path, sizeof(g_record_path), "%s/%ld.status", dir, static_cast<long>(getpid()));
  if (written <= 0 || static_cast<size_t>(written) >= sizeof(g_record_path)) g_record_path[0] = '\0';
}

void record_exit_status(int status) noexcept {
  if (g_record_path[0] == '\0') return;
  const int fd = open(g_record_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  // Digits by hand: snprintf is not async-signal-safe.
  char text[16];
  int length = 0;
  unsigned value = static_cast<unsigned>(status) & 0xffu;
  char reversed[4];
  int digits = 0;
  do {
    reversed[digits++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0);
  while (digits > 0) text[length++] = reversed[--digits];
  text[length++] = '\n';
  ssize_t ignored = write(fd, text, static_cast<size_t>(length));
  (void)ignored;
  close(fd);
}

void exit_with_record(int status) noexcept {
  record_exit_status(status);
  std::_Exit(status);
}

}  // namespace moerl::runtime
