#include "moerl/learner/sharded_weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include "moerl/core/check.h"

namespace moerl::learner {
namespace {

constexpr const char* kOptimizerPrefix = "optimizer/";
constexpr const char* kLegacyOptimizerBytes = "optimizer/torch_state";

// The optimizer's per-parameter state key: a string in LibTorch 1.x, the
// TensorImpl pointer in 2.x. The 1.x string is the pointer streamed to an
// ostream (what 1.x's c10::guts::to_string did; 2.x removed that helper).
template <typename Map>
typename Map::key_type state_key(const Map&, const torch::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// The array's shape in the version: an expert array has all E rows there.
storage::Shape logical_shape(const TrainedArray& array, const ExpertLayout& layout) {
  storage::Shape shape(array.tensor.sizes().begin(), array.tensor.sizes().end());
  if (array.expert_rows) shape[0] = layout.experts;
  return shape;
}

void add_tensor(storage::CheckpointWriter& writer, const std::string& name, const torch::Tensor& t) {
  // Host float32 bytes whatever the device: a CPU float32 tensor as it is, a
  // device one copied to the host one tensor at a time.
  const torch::Tensor c = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  writer.add_array(name, storage::DType::Float32, storage::Shape(c.sizes().begin(), c.sizes().end()), c.data_ptr(),
                   static_cast<size_t>(c.numel()) * sizeof(float));
}

// This layout's rows of array `name` (all of it when not an expert array),
// as a float32 tensor shaped like `like` with like's dtype and device.
torch::Tensor read_rows_like(const storage::ShardedVersion& version, const std::string& name, bool expert_rows,
                             const ExpertLayout& layout, const torch::Tensor& like) {
  torch::Tensor host = torch::empty(like.sizes(), torch::kFloat32);
  const auto bytes = static_cast<std::size_t>(host.numel()) * sizeof(float);
  if (expert_rows) {
    version.read_rows(name, layout.rows, host.data_ptr(), bytes);
  } else {
    version.read_into(name, host.data_ptr(), bytes);
  }
  return host.to(like.options());
}

// Array `name` read into `existing` when that can take the bytes as they are
// (a CPU float32 contiguous tensor shaped like `like`, as the optimizer of a
// learner that has already stepped holds: a rollback, a reload), so that no
// fresh memory is faulted in; otherwise into a new tensor (read_rows_like).
torch::Tensor read_rows_reusing(const storage::ShardedVersion& version, const std::string& name, bool expert_rows,
                                const ExpertLayout& layout, const torch::Tensor& like, const torch::Tensor& existing) {
  const bool reusable = existing.defined() && like.device().is_cpu() && like.scalar_type() == torch::kFloat32 &&
                        existing.device().is_cpu() && existing.scalar_type() == torch::kFloat32 &&
                        existing.is_contiguous() && existing.sizes() == like.sizes();
  if (!reusable) return read_rows_like(version, name, expert_rows, layout, like);
  const auto bytes = static_cast<std::size_t>(existing.numel()) * sizeof(float);
  if (expert_rows) {
    version.read_rows(name, layout.rows, existing.data_ptr(), bytes);
  } else {
    version.read_into(name, existing.data_ptr(), bytes);
  }
  return existing;
}

// Where the state of each trained array is in this version: its name
// ("optimizer/ARRAY/"), or its param-group position in the older array
// format ("optimizer/groupG/paramI/", whole tensors).
std::map<std::string, std::string> optimizer_prefixes(const storage::ShardedVersion& version,
                                                      torch::optim::Optimizer& optimizer,
                                                      const std::vector<TrainedArray>& arrays) {
  std::map<const void*, std::string> by_tensor;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].params().size(); ++i)
      by_tensor[groups[g].params()[i].unsafeGetTensorImpl()] =
          std::string(kOptimizerPrefix) + "group" + std::to_string(g) + "/param" + std::to_string(i) + "/";
  const bool by_position = std::any_of(version.arrays().begin(), version.arrays().end(), [](const auto& a) {
    return a.name.rfind("optimizer/group", 0) == 0 && a.name.find("/param") != std::string::npos;
  });
  std::map<std::string, std::string> prefixes;  // array name -> prefix; absent: not optimised
  for (const TrainedArray& array : arrays) {
    const auto it = by_tensor.find(array.tensor.unsafeGetTensorImpl());
    if (it == by_tensor.end()) continue;
    prefixes[array.name] = by_position ? it->second : kOptimizerPrefix + array.name + "/";
  }
  return prefixes;
}

// Checkpoints written before the array layout: LibTorch's serialisation as bytes.
void load_optimizer_bytes(torch::optim::Optimizer& optimizer, const std::vector<std::uint8_t>& bytes) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  optimizer.load(archive);
}

}  // namespace

std::string ExpertLayout::text() const {
  if (experts == 0) return "a policy without routed experts";
  if (members == 1) return "a learner holding all " + std::to_string(experts) + " experts";
  return "member " + std::to_string(member) + " of expert-parallel " + std::to_string(members) + " (experts " +
         storage::row_range_text(rows) + " of " + std::to_string(experts) + ")";
}

ExpertLayout expert_layout(const model::PolicyImpl& policy) {
  ExpertLayout layout;
  for (const auto& layer : policy.decoder_layers) {
    if (!layer->is_moe()) continue;
    const moe::MoeFeedForwardImpl& moe = *layer->moe_mlp;
    layout.experts = moe.moe_config().num_experts;
    layout.rows = {moe.expert_shard().first, moe.expert_shard().count};
    if (const moe::ExpertExchange* group = moe.expert_group()) {
      layout.member = group->rank();
      layout.members = group->size();
    }
    break;  // every MoE layer splits its experts over the same group
  }
  return layout;
}

std::vector<TrainedArray> trained_arrays(model::PolicyImpl& policy, torch::nn::Module* value_head) {
  std::set<const void*> experts;
  for (const auto& layer : policy.decoder_layers)
    if (layer->is_moe())
      for (const auto& p : layer->moe_mlp->experts->parameters()) experts.insert(p.unsafeGetTensorImpl());
  std::vector<TrainedArray> arrays;
  for (const auto& item : policy.named_parameters())
    arrays.push_back({"model/" + item.key(), item.value(), experts.count(item.value().unsafeGetTensorImpl()) > 0});
  if (value_head)
    for (const auto& item : value_head->named_parameters())
      arrays.push_back({"value_head/" + item.key(), item.value(), false});
  return arrays;
}

torch::optim::AdamWParamState* adamw_state(torch::optim::Optimizer& optimizer, const torch::Tensor& parameter) {
  auto& states = optimizer.state();
  const auto it = states.find(state_key(states, parameter));
  if (it == states.end()) return nullptr;  // never stepped
  auto* adam = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get());
  MOERL_CHECK(adam != nullptr, "checkpoints hold AdamW optimizer state only");
  return adam;
}

std::vector<std::string> add_trained_arrays(storage::CheckpointWriter& writer, const std::vector<TrainedArray>& arrays,
                                            const ExpertLayout& layout) {
  std::vector<std::string> split;
  for (const TrainedArray& array : arrays) {
    if (!array.expert_rows && layout.member != 0) continue;  // member 0 writes the replicated arrays
    add_tensor(writer, array.name, array.tensor);
    if (array.expert_rows) split.push_back(array.name);
  }
  return split;
}

std::vector<std::string> add_optimizer_state(storage::CheckpointWriter& writer, torch::optim::Optimizer& optimizer,
                                             const std::vector<TrainedArray>& arrays, const ExpertLayout& layout) {
  std::set<const void*> optimised;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) optimised.insert(p.unsafeGetTensorImpl());
  std::vector<std::string> split;
  for (const TrainedArray& array : arrays) {
    if (!optimised.count(array.tensor.unsafeGetTensorImpl())) continue;
    if (!array.expert_rows && layout.member != 0) continue;
    const torch::optim::AdamWParamState* adam = adamw_state(optimizer, array.tensor);
    if (!adam) continue;  // never stepped
    const std::string prefix = kOptimizerPrefix + array.name + "/";
    if (layout.member == 0) {
      const std::int64_t step = adam->step();
      writer.add_array(prefix + "step", storage::DType::Int64, {}, &step, sizeof step);
    }
    std::vector<std::pair<std::string, torch::Tensor>> moments = {{prefix + "exp_avg", adam->exp_avg()},
                                                                  {prefix + "exp_avg_sq", adam->exp_avg_sq()}};
    if (adam->max_exp_avg_sq().defined()) moments.emplace_back(prefix + "max_exp_avg_sq", adam->max_exp_avg_sq());
    for (const auto& [name, tensor] : moments) {
      add_tensor(writer, name, tensor);
      if (array.expert_rows) split.push_back(name);
    }
  }
  return split;
}

void read_trained_arrays(const storage::ShardedVersion& version, const std::vector<TrainedArray>& arrays,
                         const ExpertLayout& layout) {
  std::vector<storage::ArraySpec> expected;
  for (const TrainedArray& array : arrays)
    expected.push_back({array.name, storage::DType::Float32, logical_shape(array, layout)});
  version.check_arrays(expected);
  torch::NoGradGuard no_grad;
  for (const TrainedArray& array : arrays) {
    torch::Tensor p = array.tensor;
    const bool direct = p.device().is_cpu() && p.scalar_type() == torch::kFloat32 && p.is_contiguous();
    const auto bytes = static_cast<std::size_t>(p.numel()) * sizeof(float);
    if (direct && array.expert_rows) {
      version.read_rows(array.name, layout.rows, p.data_ptr(), bytes);
    } else if (direct) {
      // The common case: straight into the tensor, no staging buffer.
      version.read_into(array.name, p.data_ptr(), bytes);
    } else {
      // A parameter on a device (or in another dtype): through a host buffer.
      p.copy_(read_rows_like(version, array.name, array.expert_rows, layout, p));
    }
  }
}

void read_optimizer_state(const storage::ShardedVersion& version, torch::optim::Optimizer& optimizer,
                          const std::vector<TrainedArray>& arrays, const ExpertLayout& layout) {
  if (version.find(kLegacyOptimizerBytes)) {
    if (layout.members > 1)
      throw storage::CheckpointError(version.label() +
                                     " holds its optimizer state as LibTorch's serialised bytes (an older format), "
                                     "which only a learner holding every expert can read; resume it without expert "
                                     "parallelism and save again to reshard it (this learner: " +
                                     layout.text() + ")");
    load_optimizer_bytes(optimizer, version.read(kLegacyOptimizerBytes));
    return;
  }
  const std::map<std::string, std::string> prefixes = optimizer_prefixes(version, optimizer, arrays);
  // Check every moment against its parameter before changing any state.
  std::vector<storage::ArraySpec> expected;
  for (const TrainedArray& array : arrays) {
    const auto prefix = prefixes.find(array.name);
    if (prefix == prefixes.end() || !version.find(prefix->second + "step")) continue;
    expected.push_back({prefix->second + "step", storage::DType::Int64, {}});
    for (const char* moment : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"})
      if (std::string(moment) != "max_exp_avg_sq" || version.find(prefix->second + moment))
        expected.push_back({prefix->second + moment, storage::DType::Float32, logical_shape(array, layout)});
  }
  version.check_arrays(expected);
  auto& states = optimizer.state();
  for (const TrainedArray& array : arrays) {
    const auto prefix = prefixes.find(array.name);
    if (prefix == prefixes.end()) continue;
    const std::string& at = prefix->second;
    const auto key = state_key(states, array.tensor);
    if (!version.find(at + "step")) {
      states.erase(key);  // never stepped when saved
      continue;
    }
    std::int64_t step = 0;
    const std::vector<std::uint8_t> step_bytes = version.read(at + "step");
    std::memcpy(&step, step_bytes.data(), sizeof step);
    const auto held = states.find(key);
    const auto* previous =
        held == states.end() ? nullptr : dynamic_cast<const torch::optim::AdamWParamState*>(held->second.get());
    const auto moment = [&](const char* which, const torch::Tensor& existing) {
      return read_rows_reusing(version, at + which, array.expert_rows, layout, array.tensor, existing);
    };
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(step);
    state->exp_avg(moment("exp_avg", previous ? previous->exp_avg() : torch::Tensor()));
    state->exp_avg_sq(moment("exp_avg_sq", previous ? previous->exp_avg_sq() : torch::Tensor()));
    if (version.find(at + "max_exp_avg_sq"))
      state->max_exp_avg_sq(moment("max_exp_avg_sq", previous ? previous->max_exp_avg_sq() : torch::Tensor()));
    states[key] = std::move(state);
  }
}

}  // namespace moerl::learner
