// Child jobs of the job-running benchmarks (see child_jobs.h).

#include "child_jobs.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "moerl/core/error.h"

namespace moerl::bench {

namespace fs = std::filesystem;

std::string self_binary() { return fs::read_symlink("/proc/self/exe").string(); }

std::string launcher_path(const std::string& who) {
  const std::string launcher = std::string(MOERL_SOURCE_DIR) + "/scripts/launch.sh";
  if (!fs::exists(launcher)) throw Error(who + ": no launcher at " + launcher);
  return launcher;
}

int run_job(const std::vector<std::string>& argv, const std::string& log_path, double deadline_s,
            const std::string& who) {
  // Everything the child needs is prepared before fork: after it only
  // async-signal-safe calls run.
  const std::string binary = self_binary();
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t child = fork();
  if (child < 0) throw Error(who + ": fork failed");
  if (child == 0) {
    // Its own process group, so that a deadline takes mpirun and every rank with it.
    setpgid(0, 0);
    std::FILE* log = std::fopen(log_path.c_str(), "w");
    if (log) {
      dup2(fileno(log), 1);
      dup2(fileno(log), 2);
    }
    setenv("MOERL_BIN", binary.c_str(), 1);
    execvp(args[0], args.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  for (;;) {
    int status = 0;
    if (waitpid(child, &status, WNOHANG) == child)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-child, SIGKILL);
      waitpid(child, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

JsonValue read_json_file(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw Error("cannot read " + path);
  std::stringstream text;
  text << file.rdbuf();
  try {
    return JsonValue::parse(text.str());
  } catch (const JsonError& error) {
    throw Error(path + " is not JSON: " + error.what());
  }
}

std::vector<MetricsPoint> metrics_series(const std::string& metrics_path, const std::string& role,
                                         const std::string& group, const std::string& name) {
  std::ifstream file(metrics_path);
  if (!file) throw Error("cannot read " + metrics_path);
  std::vector<MetricsPoint> out;
  int number = 0;
  for (std::string text; std::getline(file, text);) {
    ++number;
    if (text.empty()) continue;
    JsonValue line;
    try {
      line = JsonValue::parse(text);
    } catch (const JsonError& error) {
      throw Error(metrics_path + " line " + std::to_string(number) + " is not JSON: " + error.what());
    }
    const std::optional<JsonValue> step = line.find("step");
    const std::optional<JsonValue> time_ms = line.find("time_ms");
    const std::optional<JsonValue> roles = line.find("roles");
    const std::optional<JsonValue> of_role = roles ? roles->find(role) : std::nullopt;
    const std::optional<JsonValue> values = of_role ? of_role->find(group) : std::nullopt;
    const std::optional<JsonValue> value = values ? values->find(name) : std::nullopt;
    if (!step || !value) continue;
    MetricsPoint point;
    point.step = static_cast<std::int64_t>(step->as_number());
    point.time_s = time_ms ? time_ms->as_number() / 1000.0 : 0.0;
    point.value = value->is_null() ? NAN : value->as_number();
    out.push_back(point);
  }
  return out;
}

}  // namespace moerl::bench
