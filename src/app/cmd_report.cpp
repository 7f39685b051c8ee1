// moerl report RUN_DIR [--out DIR]: an HTML page with PNG plots of a run
// (RUN_DIR/report/index.html by default), also while the job runs.
//
// The page is made by scripts/report.py of the source tree this binary was
// built from, run by Debian's /usr/bin/python3 (the interpreter of Debian's
// python3-matplotlib; a python3 first in PATH, pyenv or a virtual
// environment, may not see it), as moerl bench algos runs plot_curves.py.
// The script prints what it wrote, the path of index.html last.

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "commands.h"

namespace moerl::app {
namespace {

namespace fs = std::filesystem;

constexpr int kNotARun = 2;            // also the script's status for it
constexpr int kMissingMatplotlib = 3;  // the script's status
constexpr int kNoInterpreter = 127;

std::string interpreter() { return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3"; }

// Runs argv with this process's stdout and stderr; its exit status, 128 + signal, or 127 when it cannot start.
int run_child(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = fork();
  if (child < 0) {
    std::fprintf(stderr, "moerl report: fork failed: %s\n", std::strerror(errno));
    return 1;
  }
  if (child == 0) {
    execvp(args[0], args.data());
    _exit(kNoInterpreter);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return 1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int run_report(const ReportOptions& options) {
  const std::string& run_dir = options.run_dir;
  std::error_code error;
  if (!fs::is_directory(run_dir, error)) {
    std::fprintf(stderr,
                 "moerl report: %s: no such directory (expected a run directory, <run.output_dir>/<run.name>)\n",
                 run_dir.c_str());
    return kNotARun;
  }
  if (!fs::is_regular_file(fs::path(run_dir) / "metrics.jsonl", error)) {
    std::fprintf(stderr,
                 "moerl report: %s is not a run directory: it has no metrics.jsonl (a job writes it from "
                 "its first learner step)\n",
                 run_dir.c_str());
    return kNotARun;
  }
  const std::string script = std::string(MOERL_SOURCE_DIR) + "/scripts/report.py";
  if (!fs::is_regular_file(script, error)) {
    std::fprintf(stderr, "moerl report: %s is missing (moerl runs it from the source tree it was built from)\n",
                 script.c_str());
    return 1;
  }
  const std::string python = interpreter();
  std::vector<std::string> argv = {python, script, run_dir};
  if (!options.out_dir.empty()) {
    argv.push_back("--out");
    argv.push_back(options.out_dir);
  }
  const int status = run_child(argv);
  if (status == 0) return 0;
  if (status == kMissingMatplotlib) {
    std::fprintf(stderr,
                 "moerl report: no report of %s: matplotlib is not installed for %s (Debian: apt-get install "
                 "python3-matplotlib; scripts/setup.sh installs it)\n",
                 run_dir.c_str(), python.c_str());
    return kMissingMatplotlib;
  }
  if (status == kNoInterpreter) {
    std::fprintf(stderr, "moerl report: no report of %s: %s could not be started\n", run_dir.c_str(), python.c_str());
    return 1;
  }
  std::fprintf(stderr, "moerl report: no report of %s: %s failed (exit status %d; it says why above)\n",
               run_dir.c_str(), script.c_str(), status);
  return status == kNotARun ? kNotARun : 1;
}

}  // namespace moerl::app
