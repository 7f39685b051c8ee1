#pragma once
// The small MoE policy the expert-parallel MPI tests train and reshard: three
// layers (layer 0 dense, layers 1 and 2 MoE), 8 experts so that groups of 1,
// 2 and 4 members hold whole shares, a shared expert and the aux loss, so
// that every kind of parameter takes part.

#include "moerl/config/sections.h"

namespace moerl::expert_test {

inline config::ModelSection small_model() {
  config::ModelSection m;
  m.vocab_size = 40;
  m.d_model = 24;
  m.num_layers = 3;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.d_ff = 32;
  m.max_seq_len = 64;
  m.init_std = 0.2;
  return m;
}

inline config::MoeSection small_moe() {
  config::MoeSection s;
  s.enabled = true;
  s.num_experts = 8;
  s.top_k = 2;
  s.d_expert = 16;
  s.first_dense_layers = 1;  // layer 0 dense, layers 1 and 2 MoE
  s.shared_experts = 1;
  s.block_size = 2;
  s.aux_loss_weight = 0.02;
  return s;
}

}  // namespace moerl::expert_test
