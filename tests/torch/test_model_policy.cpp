// The policy model: KV-cache decoding vs full forward on ragged batches,
// routing replay, training from scratch, parameter report.

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <sstream>

#include "moerl/model/param_report.h"
#include "moerl/model/policy.h"

using moerl::config::ModelSection;
using moerl::config::MoeSection;
using moerl::model::KVCache;
using moerl::model::Policy;
using moerl::model::SequenceId;

namespace {

ModelSection tiny_model() {
  ModelSection m;
  m.vocab_size = 264;
  m.d_model = 32;
  m.num_layers = 3;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.d_ff = 48;
  m.max_seq_len = 64;
  m.init_std = 0.1;  // larger than default so logits vary visibly across positions
  return m;
}

MoeSection tiny_moe() {
  MoeSection e;
  e.enabled = true;
  e.num_experts = 4;
  e.top_k = 2;
  e.d_expert = 16;
  e.shared_experts = 1;
  e.first_dense_layers = 1;
  return e;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Right-pads rows with `pad` into [B, S] and returns the lengths [B].
std::pair<torch::Tensor, torch::Tensor> pad_rows(const std::vector<std::vector<std::int64_t>>& rows, std::int64_t pad) {
  std::int64_t width = 0;
  for (const auto& r : rows) width = std::max<std::int64_t>(width, static_cast<std::int64_t>(r.size()));
  torch::Tensor tokens = torch::full({static_cast<std::int64_t>(rows.size()), width}, pad, torch::kLong);
  std::vector<std::int64_t> lengths;
  for (std::size_t b = 0; b < rows.size(); ++b) {
    for (std::size_t i = 0; i < rows[b].size(); ++i) tokens[b][i] = rows[b][i];
    lengths.push_back(static_cast<std::int64_t>(rows[b].size()));
  }
  return {tokens, torch::tensor(lengths, torch::kLong)};
}

std::vector<std::int64_t> random_tokens(std::int64_t n, std::int64_t vocab) {
  const torch::Tensor t = torch::randint(0, vocab, {n}, torch::kLong);
  return std::vector<std::int64_t>(t.data_ptr<std::int64_t>(), t.data_ptr<std::int64_t>() + n);
}

// Runs a schedule of cached steps in which sequences join, append a varying
// number of tokens, and leave, and compares every step's logits (and expert
// choices) with a full forward over the whole sequences.
void check_cache_matches_full_forward(torch::Dtype dtype, const MoeSection& moe, double tolerance) {
  torch::manual_seed(11);
  const ModelSection model = tiny_model();
  Policy policy(model, moe);
  policy->to(dtype);
  policy->eval();
  torch::NoGradGuard no_grad;

  // Five sequences of different lengths.
  const std::vector<std::int64_t> full_len{9, 5, 12, 7, 6};
  std::vector<std::vector<std::int64_t>> seqs;
  for (std::int64_t n : full_len) seqs.push_back(random_tokens(n, model.vocab_size));

  // Reference: one full forward per sequence (no batching at all) ...
  std::vector<torch::Tensor> ref_logits, ref_experts;
  for (const auto& s : seqs) {
    auto [tokens, lengths] = pad_rows({s}, 0);
    auto out = policy(tokens, lengths);
    ref_logits.push_back(out.logits);
    if (out.expert_indices.defined()) ref_experts.push_back(out.expert_indices);
  }
  // ... which must also equal the ragged full forward of all five, whatever the padding value.
  for (std::int64_t pad : {0, 258, 7}) {
    auto [tokens, lengths] = pad_rows(seqs, pad);
    auto out = policy(tokens, lengths);
    std::int64_t offset = 0;
    for (std::size_t b = 0; b < seqs.size(); ++b) {
      const auto n = static_cast<std::int64_t>(seqs[b].size());
      const double d = max_abs_diff(out.logits.narrow(0, offset, n), ref_logits[b]);
      INFO("ragged full forward, pad " << pad << ", row " << b << ": max |diff| = " << d);
      CHECK(d <= tolerance);
      offset += n;
    }
    // unpack() places row b's tokens at [b, 0:n].
    const torch::Tensor unpacked = out.unpack(out.logits);
    CHECK(unpacked.size(0) == 5);
    CHECK(max_abs_diff(unpacked[2].narrow(0, 0, 12), ref_logits[2]) <= tolerance);
    CHECK(max_abs_diff(out.next_token_logits()[1], ref_logits[1][4]) <= tolerance);
    // A whole forward carries the auxiliary loss (0 for a dense model).
    REQUIRE(out.aux_loss.defined());
    CHECK(out.aux_loss.dim() == 0);
    // The head at chosen rows only: the same logits as those rows of the full
    // forward, in the order asked, and the same hidden states everywhere.
    const torch::Tensor rows = torch::tensor({20, 0, 3, 9, 38, 21}, torch::kLong);
    auto picked = policy(tokens, lengths, torch::Tensor(), rows);
    CHECK(picked.logits.size(0) == 6);
    CHECK(max_abs_diff(picked.logits, out.logits.index_select(0, rows)) <= tolerance);
    CHECK(max_abs_diff(picked.hidden, out.hidden) <= tolerance);
    CHECK_THROWS_WITH(picked.next_token_logits(), Catch::Contains("at other chosen rows only"));
    CHECK_THROWS(policy(tokens, lengths, torch::Tensor(), torch::tensor({39}, torch::kLong)));  // 39 positions
  }

  // Cached schedule: each step lists (sequence index, tokens to append).
  // Sequence 3 joins after 1 leaves and reuses its slot (stale data there).
  struct Step {
    std::vector<int> join, leave;
    std::vector<std::pair<int, std::int64_t>> rows;
  };
  const std::vector<Step> schedule{
      {{0, 1}, {}, {{0, 4}, {1, 2}}},       // prefill two, ragged
      {{}, {}, {{0, 1}, {1, 1}}},           // decode
      {{2}, {}, {{2, 6}, {0, 1}, {1, 2}}},  // 2 joins with a prefill; 1 appends 2
      {{3}, {1}, {{3, 3}, {2, 1}}},         // 1 leaves (done), 3 joins; 0 sits out
      {{}, {}, {{0, 1}, {2, 1}, {3, 1}}},
      {{4}, {}, {{2, 2}, {4, 6}, {3, 3}, {0, 2}}},
      {{}, {0, 4}, {{2, 1}}},
      {{}, {3}, {{2, 1}}},
  };
  KVCache cache = policy->make_cache(/*initial_slots=*/2, /*initial_capacity=*/4);
  std::map<int, SequenceId> ids;
  std::map<int, std::int64_t> done;
  int step_index = 0;
  for (const Step& step : schedule) {
    for (int s : step.leave) {
      cache.remove_sequence(ids.at(s));
      ids.erase(s);
    }
    for (int s : step.join) ids[s] = cache.add_sequence();
    std::vector<std::vector<std::int64_t>> rows;
    std::vector<SequenceId> row_ids;
    for (const auto& [s, n] : step.rows) {
      rows.emplace_back(seqs[s].begin() + done[s], seqs[s].begin() + done[s] + n);
      row_ids.push_back(ids.at(s));
    }
    auto [tokens, lengths] = pad_rows(rows, 258);
    // Every other step asks for the next token's logits only (what the
    // rollout engine does); they must equal each row's last full logits.
    const bool next_only = step_index % 2 == 1;
    auto out = policy->forward_cached(tokens, lengths, cache, row_ids, torch::Tensor(), next_only);
    // A cached forward (a rollout step) trains on nothing: no auxiliary loss.
    CHECK_FALSE(out.aux_loss.defined());
    if (next_only) {
      CHECK(out.logits.size(0) == static_cast<std::int64_t>(step.rows.size()));
      std::int64_t row = 0;
      for (const auto& [s, n] : step.rows) {
        CHECK(max_abs_diff(out.next_token_logits()[row], ref_logits[s][done[s] + n - 1]) <= tolerance);
        done[s] += n;
        CHECK(cache.length(ids.at(s)) == done[s]);
        ++row;
      }
      ++step_index;
      continue;
    }
    std::int64_t offset = 0;
    for (const auto& [s, n] : step.rows) {
      const double d = max_abs_diff(out.logits.narrow(0, offset, n), ref_logits[s].narrow(0, done[s], n));
      INFO("step " << step_index << ", sequence " << s << ", positions " << done[s] << ".." << done[s] + n - 1
                   << ": max |cached - full| = " << d);
      CHECK(d <= tolerance);
      if (!ref_experts.empty()) {
        const bool same = out.expert_indices.narrow(0, offset, n).equal(ref_experts[s].narrow(0, done[s], n));
        CHECK(same);
      }
      offset += n;
      done[s] += n;
      CHECK(cache.length(ids.at(s)) == done[s]);
    }
    ++step_index;
  }
  for (std::size_t s = 0; s < seqs.size(); ++s) CHECK(done[static_cast<int>(s)] == full_len[s]);
  CHECK(cache.num_sequences() == 1);
  CHECK(cache.capacity() >= 12);
}

}  // namespace

TEST_CASE("KV-cache decoding equals the full forward on a ragged batch (MoE, double)", "[model][policy][kvcache]") {
  check_cache_matches_full_forward(torch::kDouble, tiny_moe(), 1e-10);
}

TEST_CASE("KV-cache decoding equals the full forward on a ragged batch (dense, float)", "[model][policy][kvcache]") {
  MoeSection dense;
  dense.enabled = false;
  check_cache_matches_full_forward(torch::kFloat, dense, 1e-4);
}

TEST_CASE("routing replay with the recorded experts reproduces the forward", "[model][policy][moe]") {
  torch::manual_seed(3);
  const ModelSection model = tiny_model();
  const MoeSection moe = tiny_moe();
  Policy policy(model, moe);
  policy->to(torch::kDouble);
  CHECK(policy->num_moe_layers() == 2);
  CHECK(policy->moe_layer_indices() == std::vector<std::int64_t>{1, 2});

  const auto [tokens, lengths] = pad_rows({random_tokens(10, 264), random_tokens(4, 264)}, 258);
  const auto first = policy(tokens, lengths);
  REQUIRE(first.expert_indices.defined());
  CHECK(first.expert_indices.sizes() == torch::IntArrayRef({14, 2, 2}));
  CHECK(first.router_stats.size() == 2);
  const auto replay = policy(tokens, lengths, first.expert_indices);
  const double d = max_abs_diff(replay.logits, first.logits);
  INFO("max |replayed - free| logits = " << d << ", aux " << replay.aux_loss.item<double>() << " vs "
                                         << first.aux_loss.item<double>());
  CHECK(d == 0.0);
  CHECK(replay.expert_indices.equal(first.expert_indices));
  CHECK(replay.aux_loss.item<double>() == Approx(first.aux_loss.item<double>()).epsilon(1e-12));

  // Forcing other experts changes the output: replay is really applied.
  const auto shifted = (first.expert_indices + 1).remainder(moe.num_experts);
  const auto other = policy(tokens, lengths, shifted);
  CHECK(other.expert_indices.equal(shifted));
  CHECK(max_abs_diff(other.logits, first.logits) > 1e-6);

  // Replay also works through the KV cache, token by token.
  torch::NoGradGuard no_grad;
  KVCache cache = policy->make_cache();
  const SequenceId id = cache.add_sequence();
  const torch::Tensor row = tokens[0].unsqueeze(0);
  for (std::int64_t t = 0; t < 10; ++t) {
    const auto step =
        policy->forward_cached(row.narrow(1, t, 1), torch::Tensor(), cache, {id}, shifted.narrow(0, t, 1));
    CHECK(max_abs_diff(step.logits, other.logits.narrow(0, t, 1)) < 1e-10);
  }

  CHECK_THROWS(policy(tokens, lengths, first.expert_indices.narrow(0, 0, 5)));
}

TEST_CASE("a tiny MoE policy overfits a fixed sequence", "[model][policy][train]") {
  torch::manual_seed(5);
  ModelSection model = tiny_model();
  model.num_layers = 2;
  model.init_std = 0.02;
  MoeSection moe = tiny_moe();
  moe.first_dense_layers = 0;
  Policy policy(model, moe);
  torch::optim::Adam optimizer(policy->parameters(), torch::optim::AdamOptions(1e-2));

  const std::string text = "the quick brown fox jumps over the lazy dog 0123";
  std::vector<std::int64_t> ids{256};
  for (unsigned char c : text) ids.push_back(c);
  const torch::Tensor tokens = torch::tensor(ids, torch::kLong).unsqueeze(0);  // [1, S]
  const std::int64_t S = tokens.size(1);
  const torch::Tensor targets = tokens[0].narrow(0, 1, S - 1);

  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < 100; ++step) {
    optimizer.zero_grad();
    const auto out = policy(tokens);
    const torch::Tensor ce = torch::nn::functional::cross_entropy(out.logits.narrow(0, 0, S - 1), targets);
    (ce + out.aux_loss).backward();
    optimizer.step();
    const double value = ce.item<double>();
    REQUIRE(std::isfinite(value));
    if (step == 0) first_loss = value;
    last_loss = value;
  }
  INFO("cross-entropy: step 0 = " << first_loss << ", step 99 = " << last_loss);
  CHECK(first_loss == Approx(std::log(264.0)).margin(0.2));  // ~uniform at init
  CHECK(last_loss < first_loss / 20);
}

TEST_CASE("parameter report matches a hand count", "[model][params]") {
  ModelSection m;
  m.vocab_size = 264;
  m.d_model = 16;
  m.num_layers = 3;
  m.num_heads = 4;  // head_dim 4
  m.num_kv_heads = 2;
  m.d_ff = 24;
  MoeSection e;
  e.num_experts = 4;
  e.top_k = 2;
  e.d_expert = 8;
  e.shared_experts = 1;
  e.first_dense_layers = 1;  // layer 0 dense, layers 1-2 MoE

  // By hand:
  //   embedding      264*16                        = 4224   (lm_head the same, untied)
  //   attention      3 * (q 16*16 + k 16*8 + v 16*8 + o 16*16 = 768) = 2304
  //   norms          3 layers * 2 * 16 + final 16   = 112
  //   dense_ffn      1 * 3*16*24                   = 1152
  //   router         2 * 4*16                      = 128
  //   routed         2 * 4 experts * 3*16*8 (=384) = 3072, active 2 * 2 * 384 = 1536
  //   shared         2 * 384                       = 768
  const std::int64_t total = 4224 * 2 + 2304 + 112 + 1152 + 128 + 3072 + 768;  // 15984
  const std::int64_t active = total - 3072 + 1536;                             // 14448
  REQUIRE(total == 15984);

  Policy policy(m, e);
  const auto report = moerl::model::parameter_report(*policy);
  const auto expected = moerl::model::expected_parameter_report(m, e);
  INFO(report.format());
  CHECK(report.total == total);
  CHECK(report.active == active);
  CHECK(expected.total == total);
  CHECK(expected.active == active);
  CHECK(report.component("attention").total == 2304);
  CHECK(report.component("norms").total == 112);
  CHECK(report.component("dense_ffn").total == 1152);
  CHECK(report.component("router").total == 128);
  CHECK(report.component("routed_experts").total == 3072);
  CHECK(report.component("routed_experts").active == 1536);
  CHECK(report.component("shared_experts").total == 768);
  CHECK(report.component("lm_head").total == 4224);
  for (const auto& c : expected.components) {
    INFO("component " << c.component);
    CHECK(report.component(c.component).total == c.total);
    CHECK(report.component(c.component).active == c.active);
  }
  std::int64_t counted = 0;
  for (const auto& p : policy->parameters()) counted += p.numel();
  CHECK(counted == total);
  CHECK(report.format().find("15984") != std::string::npos);

  m.tie_embeddings = true;
  Policy tied(m, e);
  const auto tied_report = moerl::model::parameter_report(*tied);
  CHECK(tied_report.total == total - 4224);
  CHECK(tied_report.component("lm_head").total == 0);
  CHECK(moerl::model::expected_parameter_report(m, e).total == total - 4224);
}

TEST_CASE("initialisation and checkpoint names", "[model][policy]") {
  torch::manual_seed(9);
  ModelSection m = tiny_model();
  m.num_layers = 8;
  m.d_model = 64;
  m.init_std = 0.02;
  MoeSection e = tiny_moe();
  Policy policy(m, e);
  std::map<std::string, torch::Tensor> params;
  for (const auto& item : policy->named_parameters()) params[item.key()] = item.value();

  // Names follow the Llama/Mixtral/Qwen-MoE layout.
  for (const char* name :
       {"embed_tokens.weight", "layers.0.input_layernorm.weight", "layers.0.self_attn.q_proj.weight",
        "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
        "layers.0.post_attention_layernorm.weight", "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight",
        "layers.0.mlp.down_proj.weight", "layers.1.mlp.gate.weight", "layers.1.mlp.experts.down_proj", "norm.weight",
        "lm_head.weight"}) {
    INFO("parameter " << name);
    CHECK(params.count(name) == 1);
  }
  const double residual_std = 0.02 / std::sqrt(16.0);
  auto std_of = [&](const std::string& n) { return params.at(n).std().item<double>(); };
  CHECK(std_of("layers.0.self_attn.q_proj.weight") == Approx(0.02).epsilon(0.1));
  CHECK(std_of("embed_tokens.weight") == Approx(0.02).epsilon(0.1));
  CHECK(std_of("layers.3.self_attn.o_proj.weight") == Approx(residual_std).epsilon(0.1));
  CHECK(std_of("layers.0.mlp.down_proj.weight") == Approx(residual_std).epsilon(0.1));
  CHECK(std_of("layers.2.mlp.experts.down_proj") == Approx(residual_std).epsilon(0.1));
  CHECK(params.at("norm.weight").eq(1.0).all().item<bool>());

  using moerl::model::CheckpointFamily;
  using moerl::model::hf_checkpoint_names;
  CHECK(hf_checkpoint_names("layers.2.self_attn.q_proj.weight", 4, CheckpointFamily::CheckpointMixtral) ==
        std::vector<std::string>{"model.layers.2.self_attn.q_proj.weight"});
  CHECK(hf_checkpoint_names("lm_head.weight", 4, CheckpointFamily::CheckpointQwenMoe) ==
        std::vector<std::string>{"lm_head.weight"});
  CHECK(hf_checkpoint_names("layers.1.mlp.gate.weight", 4, CheckpointFamily::CheckpointMixtral) ==
        std::vector<std::string>{"model.layers.1.block_sparse_moe.gate.weight"});
  const auto experts = hf_checkpoint_names("layers.1.mlp.experts.down_proj", 4, CheckpointFamily::CheckpointMixtral);
  REQUIRE(experts.size() == 4);
  CHECK(experts[3] == "model.layers.1.block_sparse_moe.experts.3.w2.weight");
  const auto qwen = hf_checkpoint_names("layers.1.mlp.experts.up_proj", 4, CheckpointFamily::CheckpointQwenMoe);
  CHECK(qwen[0] == "model.layers.1.mlp.experts.0.up_proj.weight");
  CHECK(hf_checkpoint_names("layers.1.mlp.shared_expert.up_proj.weight", 4, CheckpointFamily::CheckpointQwenMoe) ==
        std::vector<std::string>{"model.layers.1.mlp.shared_expert.up_proj.weight"});
}

// Hidden (run with "[.bench]"): CPU throughput of the default-size policy.
TEST_CASE("policy throughput on CPU (default config)", "[.bench][policy_bench]") {
  torch::manual_seed(1);
  const ModelSection model;  // defaults
  const MoeSection moe;
  Policy policy(model, moe);
  torch::NoGradGuard no_grad;
  const std::int64_t B = 32;
  std::vector<std::vector<std::int64_t>> prompts;
  for (std::int64_t b = 0; b < B; ++b) prompts.push_back(random_tokens(64 + (b * 37) % 64, 264));
  auto [tokens, lengths] = pad_rows(prompts, 258);
  KVCache cache = policy->make_cache(B, 256);
  std::vector<SequenceId> ids;
  for (std::int64_t b = 0; b < B; ++b) ids.push_back(cache.add_sequence());
  const auto t0 = std::chrono::steady_clock::now();
  auto out = policy->forward_cached(tokens, lengths, cache, ids);
  const auto t1 = std::chrono::steady_clock::now();
  const std::int64_t steps = 64;
  for (std::int64_t s = 0; s < steps; ++s) {
    const torch::Tensor next = out.next_token_logits().argmax(-1).unsqueeze(1);  // [B, 1]
    out = policy->forward_cached(next, torch::Tensor(), cache, ids);
  }
  const auto t2 = std::chrono::steady_clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  const std::int64_t prefill_tokens = lengths.sum().item<std::int64_t>();
  WARN("prefill " << prefill_tokens << " tokens in " << prefill_s << " s (" << prefill_tokens / prefill_s
                  << " tok/s); decode " << B * steps << " tokens in " << decode_s << " s (" << B * steps / decode_s
                  << " tok/s, " << 1e3 * decode_s / steps << " ms/step)");
  CHECK(cache.length(ids[0]) == static_cast<std::int64_t>(prompts[0].size()) + steps);
}

TEST_CASE("policy rejects malformed inputs with errors that say why", "[model][policy]") {
  ModelSection m = tiny_model();
  m.max_seq_len = 8;
  Policy policy(m, tiny_moe());
  torch::NoGradGuard no_grad;
  const torch::Tensor tokens = torch::zeros({2, 4}, torch::kLong);
  auto message_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("<no exception>");
  };
  CHECK_THAT(message_of([&] {
               policy(tokens, torch::tensor({4, 0}, torch::kLong));
             }),
             Catch::Contains("row 1 has length 0"));
  CHECK_THAT(message_of([&] {
               policy(tokens, torch::tensor({4, 5}, torch::kLong));
             }),
             Catch::Contains("row 1 has length 5"));
  CHECK_THAT(message_of([&] {
               policy(torch::full({1, 3}, 264, torch::kLong));
             }),
             Catch::Contains("outside the vocabulary"));
  CHECK_THAT(message_of([&] { policy(torch::zeros({1, 9}, torch::kLong)); }), Catch::Contains("max_seq_len"));
  CHECK_THAT(message_of([&] { policy(tokens.to(torch::kInt)); }), Catch::Contains("int64"));

  KVCache cache = policy->make_cache();
  const SequenceId id = cache.add_sequence();
  policy->forward_cached(torch::zeros({1, 6}, torch::kLong), torch::Tensor(), cache, {id});
  CHECK_THAT(message_of([&] {
               policy->forward_cached(torch::zeros({1, 3}, torch::kLong), torch::Tensor(), cache, {id});
             }),
             Catch::Contains("max_seq_len"));
  CHECK(cache.length(id) == 6);  // a failed step leaves the cache unchanged
  CHECK_THAT(message_of([&] {
               policy->forward_cached(torch::zeros({1, 1}, torch::kLong), torch::Tensor(), cache, {id + 1});
             }),
             Catch::Contains("unknown sequence"));
  CHECK_THAT(message_of([&] { policy->forward_cached(tokens, torch::Tensor(), cache, {id}); }),
             Catch::Contains("2 token rows but 1 sequence ids"));
}
