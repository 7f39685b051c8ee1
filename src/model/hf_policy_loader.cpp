// Hugging Face safetensors -> Policy parameters: plan and check every
// tensor first (hf::plan_hf_load), then copy straight from the mapping
// (converting F16/BF16 to the policy's dtype).

#include "moerl/model/hf_policy_loader.h"

#include <chrono>
#include <cstring>

#include "moerl/hf/hf_weights.h"
#include "moerl/hf/safetensors.h"

namespace moerl::model {
namespace {

using hf::DType;
using hf::SafetensorsFile;
using hf::TensorInfo;

torch::Dtype torch_dtype(DType dtype) {
  switch (dtype) {
    case DType::F32: return torch::kFloat;
    case DType::F16: return torch::kHalf;
    case DType::BF16: return torch::kBFloat16;
  }
  return torch::kFloat;
}

// A view of the mapped bytes as a tensor; a copy when the bytes are not
// aligned for the element type (the format does not promise alignment).
torch::Tensor mapped_tensor(const SafetensorsFile& file, const TensorInfo& info) {
  const std::uint8_t* bytes = file.data(info);
  const torch::Dtype dtype = torch_dtype(info.dtype);
  if (reinterpret_cast<std::uintptr_t>(bytes) % hf::dtype_size(info.dtype) == 0) {
    return torch::from_blob(const_cast<std::uint8_t*>(bytes), info.shape, torch::TensorOptions().dtype(dtype));
  }
  torch::Tensor copy = torch::empty(info.shape, torch::TensorOptions().dtype(dtype));
  std::memcpy(copy.data_ptr(), bytes, info.bytes());
  return copy;
}

}  // namespace

HfLoadStats load_hf_weights(PolicyImpl& policy, const std::string& dir, hf::Architecture arch) {
  const auto start = std::chrono::steady_clock::now();
  const hf::SafetensorsDirectory files(dir);
  auto parameters = policy.named_parameters(/*recurse=*/true);
  std::vector<hf::ParameterShape> shapes;
  for (const auto& item : parameters) {
    shapes.push_back({item.key(), std::vector<std::int64_t>(item.value().sizes().begin(), item.value().sizes().end())});
  }
  // Everything is matched and checked before the first copy.
  const std::vector<hf::TensorSource> plan =
      hf::plan_hf_load(files, shapes, policy.moe_config().num_experts, arch, policy.model_config().tie_embeddings);
  HfLoadStats stats;
  stats.files = files.num_files();
  torch::NoGradGuard no_grad;
  for (const hf::TensorSource& source : plan) {
    torch::Tensor target = parameters[source.parameter].value();
    if (source.slice >= 0) target = target.select(0, source.slice);
    target.copy_(mapped_tensor(*source.file, *source.tensor));
    stats.bytes += source.tensor->bytes();
    ++stats.tensors;
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

Policy load_hf_policy(const config::ModelSection& model, const config::MoeSection& moe, HfLoadStats* stats) {
  const std::string dir = hf::hf_directory(model.source);
  if (dir.empty()) throw hf::HfConfigError("model.source is '" + model.source + "', not an hf: directory");
  const hf::Architecture arch = hf::read_hf_model(dir).architecture;
  Policy policy(model, moe);
  const HfLoadStats loaded = load_hf_weights(*policy, dir, arch);
  if (stats != nullptr) *stats = loaded;
  return policy;
}

}  // namespace moerl::model
