// `moerl eval --config F`: load the configured policy and continue a prompt.
//
// With [model] source = "hf:DIR" the weights come from DIR's safetensors and
// the text goes through DIR/tokenizer.json (byte-level BPE); a directory
// without tokenizer.json falls back to the byte tokenizer (ids 0..255 are
// bytes), or takes token ids with --tokens. The built-in model uses the byte
// tokenizer and the chat layout (the prompt is one user turn, the policy
// answers as the assistant) with the weights of --init (moerl pretrain's
// output). Both print the prompt's per-token negative log-likelihood under
// the policy, the continuation (greedy unless --temperature > 0) and, for an
// hf: source, how long loading the weights took.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "commands.h"
#include "moerl/config/config.h"
#include "moerl/core/json_value.h"
#include "moerl/model/hf_policy_loader.h"
#include "moerl/learner/pretrain.h"
#include "moerl/setup/config_loading.h"
#include "moerl/text/bpe_tokenizer.h"
#include "moerl/text/tokenizer.h"
#include "moerl/storage/atomic_file.h"

namespace moerl::app {
namespace {

namespace fs = std::filesystem;

// Text <-> ids for whichever tokenizer the model uses.
struct TextCodec {
  std::string name;
  std::optional<text::BpeTokenizer> bpe;
  bool chat_layout = false;        // the built-in model: wrap the prompt as a user turn
  std::vector<std::int64_t> stop;  // ids that end the continuation

  std::vector<std::int64_t> encode(const std::string& text) const {
    if (bpe) return bpe->encode(text);
    if (chat_layout) return text::render_chat({{text::Role::RoleUser, text}}, true).tokens;
    return text::ByteTokenizer().encode(text);
  }
  std::string decode(const std::vector<std::int64_t>& ids) const {
    if (bpe) return bpe->decode(ids);
    return text::ByteTokenizer().decode(ids, /*skip_special=*/!chat_layout);
  }
};

// eos_token_id of generation_config.json, else of config.json (a number or a list).
std::vector<std::int64_t> hf_stop_tokens(const std::string& dir) {
  for (const char* file : {"generation_config.json", "config.json"}) {
    const fs::path path = fs::path(dir) / file;
    if (!fs::exists(path)) continue;
    const JsonValue json = JsonValue::parse(storage::read_whole_file(path.string()));
    const std::optional<JsonValue> eos = json.find("eos_token_id");
    if (!eos || eos->is_null()) continue;
    std::vector<std::int64_t> ids;
    if (eos->kind() == JsonValue::Kind::Number) ids.push_back(static_cast<std::int64_t>(eos->as_number()));
    if (eos->kind() == JsonValue::Kind::Array)
      for (const JsonValue& v : eos->as_array()) ids.push_back(static_cast<std::int64_t>(v.as_number()));
    return ids;
  }
  return {};
}

std::vector<std::int64_t> parse_ids(const std::string& text) {
  std::vector<std::int64_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    std::size_t used = 0;
    const long long v = std::stoll(item, &used);
    if (used != item.size()) throw Error("--tokens: '" + item + "' is not an integer");
    ids.push_back(v);
  }
  return ids;
}

std::string join_ids(const std::vector<std::int64_t>& ids) {
  std::string s;
  for (std::int64_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

// Mean negative log-likelihood (nats) of tokens[1:] given their prefixes.
double prompt_nll(model::PolicyImpl& policy, const std::vector<std::int64_t>& tokens) {
  if (tokens.size() < 2) return std::nan("");
  const torch::Tensor ids = torch::tensor(tokens, torch::kLong).unsqueeze(0);
  const torch::Tensor logits = policy.forward(ids).logits;  // [T, V]
  const auto n = static_cast<std::int64_t>(tokens.size()) - 1;
  const torch::Tensor logp = torch::log_softmax(logits.narrow(0, 0, n).to(torch::kDouble), -1);
  return -logp.gather(1, ids[0].narrow(0, 1, n).unsqueeze(1)).mean().item<double>();
}

std::vector<std::int64_t> generate(model::PolicyImpl& policy, const std::vector<std::int64_t>& prompt,
                                   const EvalOptions& options, const std::vector<std::int64_t>& stop) {
  model::KVCache cache = policy.make_cache(1, static_cast<std::int64_t>(prompt.size()) + options.max_new_tokens);
  const model::SequenceId sequence = cache.add_sequence();
  torch::Tensor tokens = torch::tensor(prompt, torch::kLong).unsqueeze(0);
  std::vector<std::int64_t> out;
  for (std::int64_t step = 0; step < options.max_new_tokens; ++step) {
    if (static_cast<std::int64_t>(prompt.size() + out.size()) >= policy.model_config().max_seq_len) break;
    const auto result = policy.forward_cached(tokens, torch::tensor({tokens.size(1)}, torch::kLong), cache, {sequence});
    const torch::Tensor logits = result.next_token_logits()[0].to(torch::kDouble);
    const std::int64_t next =
        options.temperature > 0
            ? torch::multinomial(torch::softmax(logits / options.temperature, -1), 1).item<std::int64_t>()
            : logits.argmax().item<std::int64_t>();
    out.push_back(next);
    if (!options.ignore_eos && std::find(stop.begin(), stop.end(), next) != stop.end()) break;
    tokens = torch::tensor({{next}}, torch::kLong);
  }
  return out;
}

}  // namespace

int run_eval(const EvalOptions& options) {
  try {
    const config::Config config = setup::load_config_file(options.config_path, options.overrides);
    set_compute_threads(single_process_threads(options.threads));
    torch::manual_seed(static_cast<std::uint64_t>(options.seed));
    torch::NoGradGuard no_grad;
    const std::string dir = hf::hf_directory(config.model.source);
    model::Policy policy{nullptr};
    TextCodec codec;
    if (!dir.empty()) {
      model::HfLoadStats stats;
      policy = model::load_hf_policy(config.model, config.moe, &stats);
      std::printf("loaded %s (%s): %zu tensors, %.2f MiB from %zu file(s) in %.2f ms (%.2f GB/s)\n", dir.c_str(),
                  hf::architecture_class(hf::read_hf_model(dir).architecture), stats.tensors,
                  static_cast<double>(stats.bytes) / (1024.0 * 1024.0), stats.files, stats.seconds * 1e3,
                  static_cast<double>(stats.bytes) / stats.seconds / 1e9);
      const fs::path tokenizer = fs::path(dir) / "tokenizer.json";
      if (fs::exists(tokenizer)) {
        codec.bpe = text::BpeTokenizer::from_file(tokenizer.string());
        codec.name = tokenizer.string();
      } else {
        codec.name = "byte tokenizer (" + dir + " has no tokenizer.json)";
      }
      codec.stop = hf_stop_tokens(dir);
    } else {
      policy = model::Policy(config.model, config.moe);
      if (!options.init_path.empty()) {
        learner::load_policy(policy, options.init_path);
      } else {
        std::fprintf(stderr, "moerl eval: no --init: the built-in model has its random initial weights\n");
      }
      codec.chat_layout = true;
      codec.name = "byte tokenizer, chat layout";
      codec.stop = {text::SpecialTokens::kEndOfTurn, text::SpecialTokens::kEos};
    }
    policy->eval();

    const std::vector<std::int64_t> prompt =
        options.tokens.empty() ? codec.encode(options.prompt) : parse_ids(options.tokens);
    if (prompt.empty()) throw Error("the prompt is empty: give --prompt TEXT or --tokens ID,ID,...");
    std::printf("tokenizer: %s\nprompt: %zu tokens [%s]\n", codec.name.c_str(), prompt.size(),
                join_ids(prompt).c_str());
    const double nll = prompt_nll(*policy, prompt);
    if (std::isfinite(nll)) std::printf("prompt NLL: %.4f nats/token (perplexity %.2f)\n", nll, std::exp(nll));
    const auto start = std::chrono::steady_clock::now();
    const std::vector<std::int64_t> continuation = generate(*policy, prompt, options, codec.stop);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("continuation (%s, %zu tokens, %.1f tokens/s): [%s]\n", options.temperature > 0 ? "sampled" : "greedy",
                continuation.size(), static_cast<double>(continuation.size()) / seconds,
                join_ids(continuation).c_str());
    std::printf("%s\n", codec.decode(continuation).c_str());
    return 0;
  } catch (const config::ConfigError& error) {
    std::cerr << error.what() << "\n";
    return config::kConfigErrorExitStatus;
  } catch (const std::exception& error) {
    std::cerr << "moerl eval: " << error.what() << "\n";
    return 1;
  }
}

}  // namespace moerl::app
