#include "moerl/bench/report.h"

#include <unistd.h>

#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>

#include "moerl/core/blas_kernels.h"
#include "moerl/core/error.h"
#include "moerl/core/json_writer.h"

namespace moerl::bench {
namespace {

std::string param_text(const ParamValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        std::ostringstream out;
        if constexpr (std::is_same_v<T, bool>) {
          out << (v ? "true" : "false");
        } else if constexpr (std::is_same_v<T, double>) {
          out << std::setprecision(4) << v;
        } else {
          out << v;
        }
        return out.str();
      },
      value);
}

void write_param(JsonWriter& json, const ParamValue& value) {
  std::visit([&json](const auto& v) { json.value(v); }, value);
}

template <typename Map>
void write_map(JsonWriter& json, const Map& map) {
  json.begin_object();
  for (const auto& [key, value] : map) {
    json.key(key);
    if constexpr (std::is_same_v<typename Map::mapped_type, ParamValue>) {
      write_param(json, value);
    } else {
      json.value(value);
    }
  }
  json.end_object();
}

std::string metrics_text(const std::map<std::string, double>& metrics) {
  std::ostringstream out;
  out << std::setprecision(4);
  bool first = true;
  for (const auto& [key, value] : metrics) {
    out << (first ? "" : " ") << key << "=" << value;
    first = false;
  }
  return out.str();
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

}  // namespace

std::optional<double> BenchCase::ratio() const {
  if (ratio_metric.empty()) return std::nullopt;
  const auto measured = metrics.find(ratio_metric);
  const auto reference = baseline.find(ratio_metric);
  if (measured == metrics.end() || reference == baseline.end()) return std::nullopt;
  const double numerator = higher_is_better ? measured->second : reference->second;
  const double denominator = higher_is_better ? reference->second : measured->second;
  if (denominator == 0.0) return std::nullopt;
  return numerator / denominator;
}

std::string BenchReport::to_json() const {
  JsonWriter json;
  json.begin_object().key("bench").value(bench).key("host");
  write_map(json, host);
  json.key("cases").begin_array();
  for (const BenchCase& c : cases) {
    json.begin_object().key("name").value(c.name).key("params");
    write_map(json, c.params);
    json.key("metrics");
    write_map(json, c.metrics);
    json.key("baseline");
    write_map(json, c.baseline);
    json.key("ratio");
    if (const auto r = c.ratio()) {
      json.value(*r);
    } else {
      json.null();
    }
    if (!c.ratio_metric.empty()) json.key("ratio_metric").value(c.ratio_metric);
    json.end_object();
  }
  json.end_array().end_object();
  return json.str();
}

std::string BenchReport::to_table() const {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"case", "params", "metrics", "baseline", "ratio"});
  for (const BenchCase& c : cases) {
    std::ostringstream params;
    bool first = true;
    for (const auto& [key, value] : c.params) {
      params << (first ? "" : " ") << key << "=" << param_text(value);
      first = false;
    }
    std::ostringstream ratio;
    if (const auto r = c.ratio()) {
      ratio << std::fixed << std::setprecision(2) << *r << "x " << c.ratio_metric;
    } else {
      ratio << "-";
    }
    rows.push_back({c.name, params.str(), metrics_text(c.metrics), metrics_text(c.baseline), ratio.str()});
  }
  std::vector<size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  std::ostringstream out;
  out << "bench " << bench << "\n";
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t i = 0; i < rows[r].size(); ++i) {
      out << std::left << std::setw(static_cast<int>(widths[i]) + 2) << rows[r][i];
    }
    out << "\n";
    if (r == 0) {
      size_t total = 0;
      for (size_t w : widths) total += w + 2;
      out << std::string(total, '-') << "\n";
    }
  }
  return out.str();
}

void BenchReport::write_json(const std::string& path) const {
  std::ofstream file(path);
  if (!file) throw Error("cannot write benchmark result to '" + path + "'");
  file << to_json() << "\n";
  if (!file) throw Error("error while writing benchmark result to '" + path + "'");
}

std::map<std::string, ParamValue> describe_host() {
  char hostname[256] = {};
  gethostname(hostname, sizeof hostname - 1);
  std::map<std::string, ParamValue> host;
  host["hostname"] = std::string(hostname);
  host["cpu"] = cpu_model();
  host["cores"] = static_cast<std::int64_t>(std::thread::hardware_concurrency());
  host["compiler"] = std::string(__VERSION__);
  host["moerl_version"] = std::string(MOERL_VERSION);
  // Every GEMM's speed depends on these: a result names the kernels it ran on.
  const blas::BlasInfo blas = blas::blas_info();
  host["blas"] = blas.library;
  host["blas_core"] = blas.core;
  host["blas_threads"] = static_cast<std::int64_t>(blas.threads);
  host["blas_choice"] = blas.choice;
  host["cpu_gemm"] = blas::cpu_gemm_summary();
#ifdef MOERL_WITH_CUDA
  host["cuda_build"] = true;
#else
  host["cuda_build"] = false;
#endif
  return host;
}

}  // namespace moerl::bench
