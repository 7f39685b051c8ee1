// `moerl checkpoint ...`: inspect, verify, tag, roll back, prune and export
// the versions in a checkpoint directory.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <vector>

#include "checkpoint_command.h"
#include "moerl/config/config_error.h"
#include "moerl/core/error.h"
#include "moerl/core/join.h"
#include "moerl/learner/evaluation_record.h"
#include "moerl/storage/checkpoint_store.h"
#include "moerl/storage/expert_shards.h"

namespace moerl::app {

namespace {

using storage::CheckpointStore;

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

void require_directory(const std::string& dir) {
  if (!std::filesystem::is_directory(dir)) {
    throw storage::CheckpointError("checkpoint directory '" + dir + "' does not exist");
  }
}

// The `latest` part of the listing's last line. A corrupt pointer is shown,
// not fatal: the versions are still worth listing, and `--resume auto` copes
// by taking the newest valid one.
std::string latest_summary(const storage::LatestPointer& pointer, const std::vector<storage::VersionInfo>& infos) {
  if (!pointer.problem.empty()) {
    std::string text = "CORRUPT (" + pointer.problem + "); ";
    const auto newest_valid = std::find_if(infos.rbegin(), infos.rend(), [](const auto& i) { return i.valid; });
    text += newest_valid == infos.rend() ? "no valid version to resume from"
                                         : "--resume auto takes the newest valid version, " +
                                               CheckpointStore::version_label(newest_valid->version);
    return text + "; `moerl checkpoint rollback DIR --to VERSION` rewrites the pointer";
  }
  if (!pointer.version) return "none";
  const std::string label = CheckpointStore::version_label(*pointer.version);
  const bool listed = std::any_of(infos.begin(), infos.end(), [](const auto& i) { return i.is_latest; });
  return listed ? label : label + " (no such version on disk)";
}

// "sort=62% guess=73%" from the version's held-out evaluation ([eval]
// every_steps), "-" when it has none, "unreadable" when its record is damaged.
std::string held_out_summary(const CheckpointStore& store, std::int64_t version) {
  try {
    const std::optional<learner::EvaluationRecord> record = learner::read_evaluation(store.directory(), version);
    if (!record) return "-";
    std::vector<std::string> parts;
    for (const auto& [family, score] : record->sampled)
      parts.push_back(family + "=" + std::to_string(static_cast<int>(std::lround(100 * score.success_rate()))) + "%");
    return parts.empty() ? "-" : join(parts, " ");
  } catch (const Error&) {
    return "unreadable";
  }
}

int run_list(const CheckpointStore& store) {
  const storage::LatestPointer pointer = store.latest_pointer();
  const auto infos = store.list();
  if (infos.empty()) {
    std::cout << store.directory() << ": no checkpoints";
    if (!pointer.problem.empty()) std::cout << "; latest: " << latest_summary(pointer, infos);
    std::cout << "\n";
    return 0;
  }
  std::printf("%-9s %-8s %-7s %-6s %-6s %-10s %-8s %-20s %-28s %s\n", "version", "step", "policy", "latest", "shards",
              "size", "status", "tags", "held-out success", "metrics at save");
  int invalid = 0;
  for (const auto& info : infos) {
    std::vector<std::string> metrics;
    for (const auto& [name, value] : info.metrics) {
      std::ostringstream m;
      m << name << "=" << value;
      metrics.push_back(m.str());
    }
    const std::string status = info.valid ? "valid" : info.complete ? "INVALID" : "partial";
    invalid += info.valid ? 0 : 1;
    std::printf("%-9s %-8s %-7s %-6s %-6d %-10s %-8s %-20s %-28s %s\n",
                CheckpointStore::version_label(info.version).c_str(),
                info.learner_step >= 0 ? std::to_string(info.learner_step).c_str() : "?",
                info.policy_version >= 0 ? std::to_string(info.policy_version).c_str() : "?", info.is_latest ? "*" : "",
                info.num_shards, human_bytes(info.bytes).c_str(), status.c_str(),
                info.tags.empty() ? "-" : join(info.tags, ",").c_str(), held_out_summary(store, info.version).c_str(),
                join(metrics, " ").c_str());
    if (!info.valid) std::printf("          ^ %s\n", info.problem.c_str());
  }
  std::printf("%zu version(s), %d not valid; latest: %s\n", infos.size(), invalid,
              latest_summary(pointer, infos).c_str());
  return 0;
}

int run_verify(const CheckpointStore& store, const std::string& target) {
  std::vector<std::int64_t> versions;
  if (target.empty()) {
    versions = store.versions();
  } else {
    versions.push_back(store.resolve(target));
  }
  if (versions.empty()) {
    std::cout << store.directory() << ": no checkpoints to verify\n";
    return 1;
  }
  int invalid = 0;
  for (std::int64_t v : versions) {
    const storage::VerifyResult result = store.verify(v);
    if (result.valid) {
      std::cout << CheckpointStore::version_label(v) << ": valid (" << human_bytes(result.bytes_checked)
                << " of arrays checked)\n";
    } else {
      std::cout << CheckpointStore::version_label(v) << ": INVALID: " << result.problem << "\n";
      ++invalid;
    }
  }
  return invalid == 0 ? 0 : 1;
}

int run_rollback(CheckpointStore& store, const CheckpointOptions& options) {
  if (options.previous == !options.to.empty()) {
    std::cerr << "moerl checkpoint rollback: give exactly one of --to VERSION|TAG and --previous\n";
    return 2;
  }
  const storage::RollbackResult result = options.previous ? store.rollback_previous() : store.rollback_to(options.to);
  for (const auto& [version, reason] : result.skipped) {
    std::cout << "skipped " << CheckpointStore::version_label(version) << ": " << reason << "\n";
  }
  std::cout << "latest: " << (result.from ? CheckpointStore::version_label(*result.from) : std::string("none"))
            << " -> " << CheckpointStore::version_label(result.to)
            << " (a running job loads it at its next step and publishes it to the actors)\n";
  return 0;
}

int run_prune(CheckpointStore& store, int keep_last) {
  const storage::RetentionResult result = store.apply_retention(keep_last);
  for (std::int64_t v : result.deleted) std::cout << "deleted " << CheckpointStore::version_label(v) << "\n";
  for (const auto& leftover : result.removed_leftovers) std::cout << "removed leftover " << leftover << "\n";
  std::cout << result.kept.size() << " version(s) kept, " << result.deleted.size() << " deleted\n";
  return 0;
}

// "DIR" or "DIR:VERSION|TAG" (a suffix with no '/' after the last ':').
std::pair<std::string, std::string> split_version_spec(const std::string& spec) {
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos || colon + 1 == spec.size() || spec.find('/', colon) != std::string::npos)
    return {spec, "latest"};
  return {spec.substr(0, colon), spec.substr(colon + 1)};
}

std::string attribute_text(const storage::AttributeValue& value) {
  std::ostringstream out;
  out.precision(17);
  std::visit([&](const auto& v) { out << v; }, value);
  return out.str();
}

// An element of a float32 or float64 array's bytes, widened.
double float_element(const storage::ArrayInfo& info, const std::vector<std::uint8_t>& bytes, std::size_t e) {
  if (info.dtype == storage::DType::Float64) {
    double v;
    std::memcpy(&v, bytes.data() + e * 8, 8);
    return v;
  }
  float v;
  std::memcpy(&v, bytes.data() + e * 4, 4);
  return static_cast<double>(v);
}

bool is_float_array(const storage::ArrayInfo& info) {
  return info.dtype == storage::DType::Float32 || info.dtype == storage::DType::Float64;
}

// max |a - b| over two float arrays of the same shape.
double max_abs_difference(const storage::ArrayInfo& info, const std::vector<std::uint8_t>& a,
                          const std::vector<std::uint8_t>& b) {
  double max_abs = 0;
  for (std::size_t e = 0; e < a.size() / storage::dtype_size(info.dtype); ++e)
    max_abs = std::max(max_abs, std::fabs(float_element(info, a, e) - float_element(info, b, e)));
  return max_abs;
}

// Where two arrays of the same dtype and shape first differ, with both values.
std::string first_difference(const storage::ArrayInfo& info, const std::vector<std::uint8_t>& a,
                             const std::vector<std::uint8_t>& b) {
  const std::size_t size = storage::dtype_size(info.dtype);
  std::size_t at = 0;
  while (at < a.size() && a[at] == b[at]) ++at;
  const std::size_t element = at / size;
  std::ostringstream out;
  out.precision(9);
  out << "element " << element << " of " << storage::shape_text(info.shape) << " " << storage::dtype_name(info.dtype);
  std::size_t differing = 0;
  for (std::size_t e = 0; e < a.size() / size; ++e)
    differing += std::memcmp(a.data() + e * size, b.data() + e * size, size) != 0;
  if (is_float_array(info)) {
    out << ": " << float_element(info, a, element) << " vs " << float_element(info, b, element) << "; max |a - b| "
        << max_abs_difference(info, a, b);
  } else if (info.dtype == storage::DType::Int64) {
    std::int64_t x, y;
    std::memcpy(&x, a.data() + element * 8, 8);
    std::memcpy(&y, b.data() + element * 8, 8);
    out << ": " << x << " vs " << y;
  } else {
    out << ": byte " << static_cast<int>(a[at]) << " vs " << static_cast<int>(b[at]);
  }
  out << " (" << differing << " element(s) differ)";
  return out.str();
}

// The attribute differences of two shards, `where` naming the shard.
void diff_attributes(const storage::CheckpointReader& a, const storage::CheckpointReader& b, const std::string& where,
                     const std::string& label_a, const std::string& label_b,
                     const std::function<bool(const std::string&)>& is_ignored, std::vector<std::string>& differences,
                     std::size_t& compared) {
  for (const auto& [name, value] : a.attributes()) {
    if (is_ignored(name)) continue;
    const auto it = b.attributes().find(name);
    if (it == b.attributes().end()) {
      differences.push_back("attribute " + name + where + ": only in " + label_a);
    } else if (it->second != value) {
      differences.push_back("attribute " + name + where + ": " + attribute_text(value) + " vs " +
                            attribute_text(it->second));
    }
    ++compared;
  }
  for (const auto& [name, value] : b.attributes())
    if (!is_ignored(name) && !a.attributes().count(name))
      differences.push_back("attribute " + name + where + ": only in " + label_b);
}

// Compares two versions as logical arrays: an expert-parallel version's
// expert arrays gathered whole (storage/expert_shards.h), so the same
// weights saved in two layouts are identical. Every array's bytes and every
// attribute except the ones that differ between any two saves (creation
// time, the resolved config with its run name), the expert layout, and those
// under --ignore; attributes shard by shard when both have as many shards,
// else shard 0's.
int run_diff(const CheckpointOptions& options) {
  const auto [dir_a, which_a] = split_version_spec(options.dir);
  const auto [dir_b, which_b] = split_version_spec(options.other);
  require_directory(dir_a);
  require_directory(dir_b);
  const CheckpointStore store_a(dir_a), store_b(dir_b);
  const std::int64_t version_a = store_a.resolve(which_a), version_b = store_b.resolve(which_b);
  const std::string label_a = dir_a + ":" + CheckpointStore::version_label(version_a);
  const std::string label_b = dir_b + ":" + CheckpointStore::version_label(version_b);
  std::vector<std::string> ignored = {storage::attribute_key::kCreatedUnix, storage::attribute_key::kConfigToml,
                                      storage::kExpertLayoutPrefix};
  ignored.insert(ignored.end(), options.ignore.begin(), options.ignore.end());
  auto is_ignored = [&](const std::string& name) {
    return std::any_of(ignored.begin(), ignored.end(), [&](const std::string& p) { return name.rfind(p, 0) == 0; });
  };
  const storage::ShardedVersion a(store_a, version_a), b(store_b, version_b);
  std::vector<std::string> differences;
  std::uint64_t compared_bytes = 0;
  std::size_t compared_arrays = 0, compared_attributes = 0;
  std::map<std::string, int> arrays_by_group;  // "model" -> arrays compared under model/
  double largest_gap = 0;                      // of the float arrays that differ within --tolerance
  for (const storage::ArrayInfo& info : a.arrays()) {
    if (is_ignored(info.name)) continue;
    const storage::ArrayInfo* other = b.find(info.name);
    if (!other) {
      differences.push_back("array " + info.name + ": only in " + label_a);
    } else if (other->dtype != info.dtype || other->shape != info.shape) {
      differences.push_back("array " + info.name + ": " + storage::dtype_name(info.dtype) +
                            storage::shape_text(info.shape) + " vs " + storage::dtype_name(other->dtype) +
                            storage::shape_text(other->shape));
    } else {
      const std::vector<std::uint8_t> bytes_a = a.read(info.name), bytes_b = b.read(info.name);
      if (bytes_a != bytes_b) {
        // --tolerance: float arrays within it are equal (the largest gap is reported).
        const double gap = is_float_array(info) ? max_abs_difference(info, bytes_a, bytes_b) : -1;
        if (gap >= 0 && gap <= options.tolerance) {
          largest_gap = std::max(largest_gap, gap);
        } else {
          differences.push_back("array " + info.name + ": " + first_difference(info, bytes_a, bytes_b));
        }
      }
      compared_bytes += bytes_a.size();
      ++compared_arrays;
      ++arrays_by_group[info.name.substr(0, info.name.find('/'))];
    }
  }
  for (const storage::ArrayInfo& info : b.arrays())
    if (!is_ignored(info.name) && !a.find(info.name))
      differences.push_back("array " + info.name + ": only in " + label_b);
  const int shards = a.num_shards() == b.num_shards() ? a.num_shards() : 1;
  for (int rank = 0; rank < shards; ++rank)
    diff_attributes(a.shard(rank), b.shard(rank), shards > 1 ? " (shard " + std::to_string(rank) + ")" : "", label_a,
                    label_b, is_ignored, differences, compared_attributes);
  if (a.layout_text() != b.layout_text())
    std::cout << "layouts differ (compared as whole arrays): " << label_a << " is " << a.layout_text() << ", "
              << label_b << " is " << b.layout_text() << "\n";
  if (differences.empty()) {
    std::vector<std::string> groups;
    for (const auto& [group, count] : arrays_by_group) groups.push_back(group + " " + std::to_string(count));
    std::ostringstream within;
    within.precision(3);
    if (largest_gap > 0) within << " within tolerance " << options.tolerance << " (max |a - b| " << largest_gap << ")";
    std::cout << label_a << " and " << label_b << " are " << (largest_gap > 0 ? "equal" + within.str() : "identical")
              << ": " << compared_arrays << " arrays (" << join(groups, ", ") << "; " << human_bytes(compared_bytes)
              << "), " << compared_attributes << " attributes (not compared: " << join(ignored, ", ") << ")\n";
    return 0;
  }
  std::cout << label_a << " and " << label_b << " differ in " << differences.size() << " place(s):\n";
  for (const std::string& d : differences) std::cout << "  " << d << "\n";
  return 1;
}

// A small but representative version: every dtype, every array group, the
// attributes a learner writes. For testing the store and these commands.
int run_write_sample(const CheckpointOptions& options) {
  storage::StoreOptions store_options;
  store_options.faults = storage::FaultInjection::from_environment();
  CheckpointStore store(options.dir, store_options);
  const std::int64_t version = std::stoll(options.version);
  if (options.shards < 1) throw storage::CheckpointError("--shards must be >= 1");
  for (int rank = 0; rank < options.shards; ++rank) {
    auto writer = store.shard_writer(version, rank, options.shards);
    const std::string r = std::to_string(rank);
    std::vector<float> embed(32 * 16);
    for (std::size_t i = 0; i < embed.size(); ++i) {
      embed[i] = static_cast<float>(std::sin(0.01 * static_cast<double>(i + 1) * static_cast<double>(version + 1)));
    }
    writer->add_array("model/shard" + r + "/embed", storage::DType::Float32, {32, 16}, embed.data(), embed.size() * 4);
    std::vector<std::uint16_t> expert(4 * 16 * 8, static_cast<std::uint16_t>(0x3f80 + version));
    writer->add_array("model/shard" + r + "/experts.w1", storage::DType::BFloat16, {4, 16, 8}, expert.data(),
                      expert.size() * 2);
    std::vector<double> moment(embed.begin(), embed.end());
    writer->add_array("optimizer/shard" + r + "/adam_m/embed", storage::DType::Float64, {32, 16}, moment.data(),
                      moment.size() * 8);
    std::vector<std::uint8_t> rng(64, static_cast<std::uint8_t>(rank + 1));
    writer->add_array("rng/rank" + r, storage::DType::UInt8, {64}, rng.data(), rng.size());
    const std::vector<std::int64_t> cursor = {version * 10, 7, 0};
    writer->add_array("state/rank" + r + "/cursor", storage::DType::Int64, {3}, cursor.data(), cursor.size() * 8);
    writer->set_attribute(storage::attribute_key::kLearnerStep, version * 10);
    writer->set_attribute(storage::attribute_key::kPolicyVersion, version);
    writer->set_attribute(storage::attribute_key::kConfigToml,
                          std::string("# sample checkpoint\n[model]\nd_model = 16\n"));
    writer->set_attribute("metric.reward_mean", 0.05 * static_cast<double>(version));
    writer->commit();
  }
  store.complete_version(version, options.shards, !options.no_latest);
  std::cout << "wrote sample " << CheckpointStore::version_label(version) << " (" << options.shards << " shard(s)) to "
            << options.dir << "\n";
  return 0;
}

}  // namespace

int run_checkpoint(const CheckpointOptions& options) {
  try {
    if (options.action == "accept") return run_accept(options);
    CheckpointStore store(options.dir);
    if (options.action == "write-sample") return run_write_sample(options);
    if (options.action == "import-hf") return run_import_hf(store, options);
    if (options.action == "diff") return run_diff(options);
    require_directory(options.dir);
    if (options.action == "list") return run_list(store);
    if (options.action == "verify") return run_verify(store, options.version);
    if (options.action == "tag") {
      const std::int64_t version = store.resolve(options.version);
      store.tag(version, options.name);
      std::cout << "tagged " << CheckpointStore::version_label(version) << " as '" << options.name << "'\n";
      return 0;
    }
    if (options.action == "rollback") return run_rollback(store, options);
    if (options.action == "export") {
      const std::int64_t version = store.resolve(options.version);
      const std::uint64_t bytes = store.export_weights(version, options.out_path);
      std::cout << "exported the weights of " << CheckpointStore::version_label(version) << " to " << options.out_path
                << " (" << human_bytes(bytes) << ")\n";
      return 0;
    }
    if (options.action == "prune") return run_prune(store, options.keep_last);
    if (options.action == "export-hf") return run_export_hf(store, options);
    std::cerr << "moerl checkpoint: unknown action '" << options.action << "'\n";
    return 2;
  } catch (const config::ConfigError& error) {  // import-hf --config F
    std::cerr << "moerl checkpoint " << options.action << ": " << error.what() << "\n";
    return config::kConfigErrorExitStatus;
  } catch (const storage::InjectedFault& error) {
    std::cerr << "moerl checkpoint: " << error.what() << "\n";
    return storage::kFaultExitStatus;
  } catch (const storage::CheckpointError& error) {
    std::cerr << "moerl checkpoint " << options.action << ": " << error.what() << "\n";
    const bool refused = options.action == "rollback" || options.action == "tag" || options.action == "export";
    return refused && std::filesystem::is_directory(options.dir) ? 1 : 2;
  } catch (const std::exception& error) {
    std::cerr << "moerl checkpoint " << options.action << ": " << error.what() << "\n";
    return 1;
  }
}

void add_checkpoint_subcommands(CLI::App& checkpoint_cmd, CheckpointOptions& options) {
  checkpoint_cmd.require_subcommand(1);
  auto named = [&](const char* name, const char* help) {
    CLI::App* sub = checkpoint_cmd.add_subcommand(name, help);
    sub->add_option("dir", options.dir, "Checkpoint directory (RUN_DIR/checkpoints)")->required();
    sub->callback([&options, name] { options.action = name; });
    return sub;
  };
  named("list",
        "List versions: step, policy version, tags, metrics at save, size, valid or not; a corrupt `latest` "
        "pointer is marked CORRUPT and every readable version is still listed (exit 0 whatever is damaged; "
        "`verify` exits 1 on an invalid version)");
  auto* verify = named("verify", "Verify every version, or one (exit 1 when any is invalid)");
  verify->add_option("version", options.version, "Version (12, v000012) or tag");
  auto* tag = named("tag", "Tag a valid version (a tag that exists moves)");
  tag->add_option("version", options.version, "Version or tag")->required();
  tag->add_option("name", options.name, "New tag: [A-Za-z0-9_.-]")->required();
  auto* rollback = named("rollback", "Move `latest` to a valid version; actors pick it up at their next sync");
  auto* to = rollback->add_option("--to", options.to, "Version or tag");
  rollback->add_flag("--previous", options.previous, "The newest valid version older than latest")->excludes(to);
  auto* exported = named("export", "Write the model weights of one version to one HDF5 file (for inference)");
  exported->add_option("version", options.version, "Version or tag")->required();
  exported->add_option("out", options.out_path, "Output .h5 file")->required();
  auto* prune = named("prune", "Retention: keep the last K versions plus tagged ones and latest; delete the rest");
  prune->add_option("--keep", options.keep_last, "Versions to keep (K >= 1)")->required()->check(CLI::PositiveNumber);
  CLI::App* diff = checkpoint_cmd.add_subcommand(
      "diff", "Compare two versions array by array and attribute by attribute (exit 1 when they differ)");
  diff->add_option("a", options.dir, "First: DIR[:VERSION|TAG] (default: its latest)")->required();
  diff->add_option("b", options.other, "Second: DIR[:VERSION|TAG]")->required();
  diff->add_option("--ignore", options.ignore, "Attribute name or array-name prefix not to compare (repeatable)");
  diff->add_option("--tolerance", options.tolerance,
                   "Float arrays whose largest element difference is at most this count as equal (default 0: "
                   "bitwise); e.g. runs whose sums run in another order")
      ->check(CLI::NonNegativeNumber);
  diff->callback([&options] { options.action = "diff"; });
  auto* sample = named("write-sample", "Write a small sample version (a tool for testing the store)");
  sample->add_option("version", options.version, "Version number")->required()->check(CLI::NonNegativeNumber);
  sample->add_option("--shards", options.shards, "Number of shards");
  sample->add_flag("--no-latest", options.no_latest, "Do not move latest");
  sample->group("");  // hidden from --help
  add_hf_checkpoint_subcommands(checkpoint_cmd, options);
  add_accept_subcommand(checkpoint_cmd, options);
}

}  // namespace moerl::app
