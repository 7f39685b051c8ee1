// `moerl bench hf-load`: loading a Hugging Face model directory (sharded
// safetensors) into a policy, in GB/s of tensor data, against reading the
// same files with read(2) into one buffer of their size in the same run (the
// floor of any loader that copies the weights into its own memory; both from
// the page cache after a first read). One case with float32 files (mmap + copy), one
// with BF16 files converted to the float32 policy on the way.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <vector>

#include "moerl/bench/registry.h"
#include "moerl/bench/timing.h"
#include "moerl/core/error.h"
#include "moerl/hf/hf_weights.h"
#include "moerl/model/hf_policy_loader.h"
#include "moerl/hf/safetensors.h"

namespace {

namespace fs = std::filesystem;

using moerl::bench::best_seconds;

// read(2) of every safetensors file of `dir` into one buffer as large as all
// of them (allocated and touched once, outside the timing, as the policy's
// parameters are).
std::uint64_t read_all(const fs::path& dir, std::vector<char>& buffer) {
  std::uint64_t total = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw moerl::Error("bench hf-load: cannot open " + entry.path().string());
    ssize_t n = 0;
    while (total < buffer.size() && (n = ::read(fd, buffer.data() + total, buffer.size() - total)) > 0) {
      total += static_cast<std::uint64_t>(n);
    }
    ::close(fd);
  }
  return total;
}

std::uint64_t directory_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  for (const auto& entry : fs::directory_iterator(dir)) total += entry.file_size();
  return total;
}

// The policy's parameters rewritten as BF16 files in `dir` (same names).
void write_bf16_copy(const fs::path& from, const fs::path& dir) {
  const moerl::hf::SafetensorsDirectory files(from.string());
  std::vector<torch::Tensor> keep;
  std::vector<moerl::hf::TensorToWrite> tensors;
  for (const std::string& name : files.tensor_names()) {
    const moerl::hf::TensorInfo& info = files.info(name);
    torch::Tensor t =
        torch::from_blob(const_cast<std::uint8_t*>(files.data(name)), info.shape).to(torch::kBFloat16).contiguous();
    keep.push_back(t);
    tensors.push_back(
        {name, moerl::hf::DType::BF16, info.shape, t.data_ptr(), static_cast<std::size_t>(t.numel()) * 2});
  }
  moerl::hf::write_sharded_safetensors(dir.string(), tensors, 256u << 20);
  fs::copy_file(from / "config.json", dir / "config.json");
}

moerl::bench::BenchReport run(const moerl::bench::BenchOptions& options) {
  moerl::config::ModelSection model;
  moerl::config::MoeSection moe;
  model.vocab_size = options.quick ? 4096 : 32000;
  model.d_model = options.quick ? 128 : 512;
  model.num_layers = options.quick ? 2 : 4;
  model.num_heads = 8;
  model.num_kv_heads = 2;
  moe.num_experts = 8;
  moe.d_expert = options.quick ? 128 : 512;
  const int repetitions = options.quick ? 2 : 5;

  const fs::path root = fs::temp_directory_path() / ("moerl_bench_hf_load_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path f32_dir = root / "f32", bf16_dir = root / "bf16";
  moerl::bench::BenchReport report;
  try {
    torch::NoGradGuard no_grad;
    moerl::model::Policy source(model, moe);
    std::vector<moerl::hf::ParameterView> views;
    for (const auto& item : source->named_parameters()) {
      const torch::Tensor& p = item.value();
      views.push_back({item.key(), std::vector<std::int64_t>(p.sizes().begin(), p.sizes().end()), p.data_ptr<float>()});
    }
    moerl::hf::export_hf_model(views, model, moe, f32_dir.string(), 64u << 20);
    write_bf16_copy(f32_dir, bf16_dir);

    moerl::model::Policy target(model, moe);
    std::vector<char> buffer(directory_bytes(f32_dir), 1);
    for (const auto& [label, dir] : {std::pair<const char*, fs::path>{"float32 files", f32_dir},
                                     std::pair<const char*, fs::path>{"bf16 files -> float32", bf16_dir}}) {
      std::uint64_t file_bytes = 0;
      const double read_s = best_seconds(repetitions, [&] { file_bytes = read_all(dir, buffer); });
      moerl::model::HfLoadStats stats;
      const double load_s = best_seconds(repetitions, [&] {
        stats = moerl::model::load_hf_weights(*target, dir.string(), moerl::hf::Architecture::Mixtral);
      });
      moerl::bench::BenchCase c;
      c.name = std::string("load ") + label;
      c.params = {{"tensors", static_cast<std::int64_t>(stats.tensors)},
                  {"files", static_cast<std::int64_t>(stats.files)},
                  {"tensor_MiB", static_cast<double>(stats.bytes) / (1 << 20)}};
      c.metrics = {{"GB_per_s", static_cast<double>(stats.bytes) / load_s / 1e9}, {"ms", load_s * 1e3}};
      c.baseline = {{"GB_per_s", static_cast<double>(file_bytes) / read_s / 1e9}, {"ms", read_s * 1e3}};
      c.ratio_metric = "GB_per_s";
      report.cases.push_back(c);
    }
  } catch (...) {
    fs::remove_all(root);
    throw;
  }
  fs::remove_all(root);
  return report;
}

}  // namespace

MOERL_BENCHMARK("hf-load", "HF safetensors -> policy load GB/s vs read(2) of the same files", run);
