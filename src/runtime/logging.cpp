#include "moerl/runtime/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <filesystem>

namespace moerl::runtime {
namespace {

spdlog::level::level_enum to_spdlog(config::LogLevel level) {
  switch (level) {
    case config::LogLevel::Trace: return spdlog::level::trace;
    case config::LogLevel::Debug: return spdlog::level::debug;
    case config::LogLevel::Info: return spdlog::level::info;
    case config::LogLevel::Warn: return spdlog::level::warn;
    case config::LogLevel::Error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace

void init_logging(const LogSetup& setup) {
  std::string tag = "rank " + std::to_string(setup.rank);
  if (!setup.role_label.empty()) tag += " " + setup.role_label;
  const std::string pattern = "[%H:%M:%S.%e] [" + tag + "] [%l] %v";
  const auto level = to_spdlog(setup.level);

  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  // Debug and trace are asked for explicitly: then every rank prints them.
  const bool speaks_for_job = setup.rank == 0 || level <= spdlog::level::debug;
  console->set_level(speaks_for_job ? level : std::max(level, spdlog::level::warn));
  std::vector<spdlog::sink_ptr> sinks{console};
  if (!setup.per_rank_file.empty()) {
    const auto parent = std::filesystem::path(setup.per_rank_file).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(setup.per_rank_file);
    file->set_level(level);
    sinks.push_back(file);
  }
  auto logger = std::make_shared<spdlog::logger>("moerl", sinks.begin(), sinks.end());
  logger->set_level(level);
  logger->set_pattern(pattern);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

void flush_logs() {
  if (auto logger = spdlog::default_logger()) logger->flush();
}

}  // namespace moerl::runtime
