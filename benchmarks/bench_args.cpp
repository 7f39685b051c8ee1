#include "bench_args.h"

#include "moerl/core/error.h"

namespace moerl::bench {

std::string quickstart_config() { return std::string(MOERL_SOURCE_DIR) + "/configs/quickstart.toml"; }

PolicyBenchArgs parse_policy_bench_args(const std::vector<std::string>& args, const std::string& who,
                                        const std::string& usage, const OwnOption& own,
                                        const std::string& default_config) {
  PolicyBenchArgs out;
  out.config_path = default_config;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::function<const std::string&()> value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw Error(who + ": " + a + " needs a value");
      return args[++i];
    };
    if (a == "--config" || a == "-c") {
      out.config_path = value();
    } else if (a == "--set") {
      out.overrides.push_back(value());
    } else if (a == "--init") {
      out.init_path = value();
    } else if (!own || !own(a, value)) {
      throw Error(who + ": unknown option '" + a + "' (options: " + usage + ")");
    }
  }
  return out;
}

std::int64_t whole_number(const std::string& text, const std::string& who, const std::string& option) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw Error(who + ": " + option + ": '" + text + "' is not a whole number");
  return v;
}

}  // namespace moerl::bench
