// `moerl bench bpe [-- TOKENIZER_JSON]`: byte-level BPE encode and decode
// speed on the tokenizer parity fixture's held-out text (mixed scripts, code,
// numbers) repeated, against the byte tokenizer on the same text in the same
// run (one id per byte: the floor of any tokenizer's cost). Encode is timed
// with the per-word cache warm (steady state in a rollout, where words
// repeat) and cold (a fresh tokenizer: every distinct word is merged once),
// and once more as one call per 493-byte paragraph (per-call overheads).

#include <algorithm>
#include <chrono>
#include <fstream>

#include "moerl/bench/registry.h"
#include "moerl/bench/timing.h"
#include "moerl/core/error.h"
#include "moerl/core/json_value.h"
#include "moerl/text/bpe_tokenizer.h"
#include "moerl/text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

using moerl::bench::best_seconds;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw moerl::Error("bench bpe: cannot open " + path + " (pass a tokenizer.json after --)");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

moerl::bench::BenchReport run(const moerl::bench::BenchOptions& options) {
  const std::string fixture = std::string(MOERL_SOURCE_DIR) + "/tests/parity/fixtures/tokenizer/qwen2/";
  const std::string tokenizer_path = options.args.empty() ? fixture + "tokenizer.json" : options.args[0];
  const std::string held_out =
      moerl::JsonValue::parse(read_file(fixture + "expected.json")).at("held_out").at("text").as_string();
  const std::size_t target_bytes = options.quick ? (64u << 10) : (4u << 20);
  std::string text;
  while (text.size() < target_bytes) text += held_out;
  const int repetitions = options.quick ? 2 : 5;

  const std::string json = read_file(tokenizer_path);
  double load_seconds = 0;
  std::vector<moerl::text::BpeTokenizer> fresh;  // one per cold repetition, loaded outside the timing
  for (int r = 0; r < repetitions + 1; ++r) {
    const auto start = Clock::now();
    fresh.push_back(moerl::text::BpeTokenizer::from_json(json, tokenizer_path));
    load_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  const moerl::text::BpeTokenizer& bpe = fresh.back();
  const moerl::text::ByteTokenizer bytes_tokenizer;

  std::vector<std::int64_t> ids, byte_ids, paragraph_ids;
  const double byte_encode = best_seconds(repetitions, [&] { byte_ids = bytes_tokenizer.encode(text); });
  ids = bpe.encode(text);  // warms the word cache
  const double warm = best_seconds(repetitions, [&] { ids = bpe.encode(text); });
  // Short texts one call each, as a rollout encodes observations.
  const std::size_t paragraphs = text.size() / held_out.size();
  const double per_paragraph = best_seconds(repetitions, [&] {
    for (std::size_t p = 0; p < paragraphs; ++p) paragraph_ids = bpe.encode(held_out);
  });
  const double byte_per_paragraph = best_seconds(repetitions, [&] {
    for (std::size_t p = 0; p < paragraphs; ++p) paragraph_ids = bytes_tokenizer.encode(held_out);
  });
  int next_fresh = 0;
  const double cold = best_seconds(repetitions, [&] { ids = fresh[next_fresh++].encode(text); });
  std::string decoded, byte_decoded;
  const double byte_decode = best_seconds(repetitions, [&] { byte_decoded = bytes_tokenizer.decode(byte_ids); });
  const double decode = best_seconds(repetitions, [&] { decoded = bpe.decode(ids); });
  if (decoded != text || byte_decoded != text) throw moerl::Error("bench bpe: decode(encode(text)) != text");

  const double megabytes = static_cast<double>(text.size()) / 1e6;
  const auto tokens = static_cast<double>(ids.size());
  moerl::bench::BenchReport report;
  const auto add = [&](const std::string& name, double seconds, double baseline_seconds) {
    moerl::bench::BenchCase c;
    c.name = name;
    c.params = {{"tokenizer", tokenizer_path},
                {"text_bytes", static_cast<std::int64_t>(text.size())},
                {"bpe_tokens", static_cast<std::int64_t>(ids.size())},
                {"load_ms", load_seconds * 1e3}};
    c.metrics = {{"MB_per_s", megabytes / seconds}, {"tokens_per_s", tokens / seconds}};
    c.baseline = {{"MB_per_s", megabytes / baseline_seconds}};
    c.ratio_metric = "MB_per_s";
    report.cases.push_back(c);
  };
  add("encode, word cache warm", warm, byte_encode);
  add("encode, word cache cold", cold, byte_encode);
  add("encode, one call per paragraph",
      per_paragraph * static_cast<double>(text.size()) / static_cast<double>(paragraphs * held_out.size()),
      byte_per_paragraph * static_cast<double>(text.size()) / static_cast<double>(paragraphs * held_out.size()));
  add("decode", decode, byte_decode);
  return report;
}

}  // namespace

MOERL_BENCHMARK("bpe", "byte-level BPE encode/decode MB/s and tokens/s vs the byte tokenizer on the same text", run);
