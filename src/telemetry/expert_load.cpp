#include "moerl/telemetry/expert_load.h"

#include <algorithm>
#include <string>

#include "moerl/telemetry/metrics.h"

namespace moerl::telemetry {

void ExpertLoad::add(std::size_t layer, const std::vector<std::int64_t>& tokens_per_expert,
                     std::int64_t dropped_tokens) {
  if (tokens.size() <= layer) {
    tokens.resize(layer + 1);
    dropped.resize(layer + 1, 0);
  }
  std::vector<std::int64_t>& row = tokens[layer];
  if (row.size() < tokens_per_expert.size()) row.resize(tokens_per_expert.size(), 0);
  for (std::size_t e = 0; e < tokens_per_expert.size(); ++e) row[e] += tokens_per_expert[e];
  dropped[layer] += dropped_tokens;
}

void record_expert_load(const ExpertLoad& load) {
  auto& m = metrics();
  for (std::size_t layer = 0; layer < load.tokens.size(); ++layer) {
    const std::vector<std::int64_t>& row = load.tokens[layer];
    std::int64_t total = 0, most = 0;
    for (std::int64_t n : row) {
      total += n;
      most = std::max(most, n);
    }
    if (total == 0) continue;
    const std::string prefix = "moe.layer." + std::to_string(layer);
    for (std::size_t e = 0; e < row.size(); ++e)
      m.set(prefix + ".expert." + std::to_string(e) + ".load",
            static_cast<double>(row[e]) / static_cast<double>(total));
    const double mean = static_cast<double>(total) / static_cast<double>(row.size());
    m.set(prefix + ".imbalance", static_cast<double>(most) / mean);
    m.add(prefix + ".dropped_tokens", static_cast<double>(load.dropped[layer]));
  }
}

}  // namespace moerl::telemetry
