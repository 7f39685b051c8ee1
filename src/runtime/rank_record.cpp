#include "moerl/runtime/rank_record.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "moerl/core/error.h"
#include "moerl/core/json_writer.h"

namespace moerl::runtime {

std::string write_rank_record(const std::string& run_directory, const World& world, int restart) {
  const std::filesystem::path directory = std::filesystem::path(run_directory) / "ranks";
  std::filesystem::create_directories(directory);
  const std::string path = (directory / ("rank-" + std::to_string(world.rank()) + ".json")).string();
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  JsonWriter json;
  json.begin_object()
      .key("rank")
      .value(world.rank())
      .key("role")
      .value(role_name(world.role()))
      .key("role_index")
      .value(world.role_index())
      .key("host")
      .value(world.hostname())
      .key("placement_host")
      .value(world.placement_host())
      .key("pid")
      .value(static_cast<std::int64_t>(getpid()))
      .key("started_at")
      .value(now)
      .key("restart")
      .value(restart)
      .end_object();
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << json.str() << "\n";
    if (!out) throw Error("cannot write rank record '" + temporary + "'");
  }
  std::filesystem::rename(temporary, path);
  return path;
}

}  // namespace moerl::runtime
