#pragma once
// Loading a Hugging Face model directory's safetensors into a policy. The
// policy's architecture comes from the config ([model] source = "hf:DIR"
// resolved by hf/hf_config.h); this fills its weights. Everything is checked
// before the first parameter is written: a missing, extra, mis-shaped or
// unreadable tensor throws an error that names the file and tensor, and the
// policy keeps its previous weights.

#include <cstdint>
#include <string>

#include "moerl/config/sections.h"
#include "moerl/hf/hf_config.h"
#include "moerl/model/policy.h"

namespace moerl::model {

struct HfLoadStats {
  std::uint64_t bytes = 0;  // tensor bytes read from the files
  std::size_t tensors = 0;
  std::size_t files = 0;
  double seconds = 0;  // open + check + copy, wall clock
};

// Fills `policy` (float32 or any floating dtype; F16/BF16 files are
// converted) from DIR's safetensors, named as `arch` names them.
HfLoadStats load_hf_weights(PolicyImpl& policy, const std::string& dir, hf::Architecture arch);

// A policy for [model] and [moe] with the weights of model.source (which
// must be "hf:DIR").
Policy load_hf_policy(const config::ModelSection& model, const config::MoeSection& moe, HfLoadStats* stats = nullptr);

}  // namespace moerl::model
