// Byte-level BPE tokenizer against the reference implementation (Hugging
// Face `tokenizers`): encodings and decodings recorded by
// tests/parity/make_tokenizer_fixtures.py; byte round trips; errors for
// malformed files; the chat layout's tokens and assistant mask.

#include <catch2/catch.hpp>

#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "moerl/core/json_value.h"
#include "moerl/text/bpe_tokenizer.h"
#include "moerl/text/chat_layout.h"
#include "temp_dir.h"

using moerl::JsonValue;
using moerl::text::BpeTokenizer;
using moerl::text::ChatLayout;
using moerl::text::ChatMessage;
using moerl::text::ChatRenderer;
using moerl::text::Role;

namespace {

// random_merges: Qwen2 plus 1500 merges interleaved at random ranks (stresses merge order).
const char* const kFixtures[] = {"qwen2", "gpt2", "llama3", "random_merges"};

std::string fixture_path(const std::string& name, const std::string& file) {
  return std::string(MOERL_SOURCE_DIR) + "/tests/parity/fixtures/tokenizer/" + name + "/" + file;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::int64_t> ids_of(const JsonValue& array) {
  std::vector<std::int64_t> ids;
  for (const JsonValue& v : array.as_array()) ids.push_back(static_cast<std::int64_t>(v.as_number()));
  return ids;
}

// One recorded case: the reference's ids with and without special tokens,
// and its decodings (which are from_utf8_lossy of the bytes).
void check_case(const BpeTokenizer& tokenizer, const JsonValue& recorded) {
  const std::string& text = recorded.at("text").as_string();
  INFO("text: " << text);
  std::vector<std::string> pre_tokens;
  for (const JsonValue& piece : recorded.at("pre_tokens").as_array()) pre_tokens.push_back(piece.as_string());
  CHECK(tokenizer.pre_tokenize(text) == pre_tokens);
  const std::vector<std::int64_t> ids = tokenizer.encode(text);
  CHECK(ids == ids_of(recorded.at("ids")));
  CHECK(tokenizer.encode(text, /*allow_special=*/false) == ids_of(recorded.at("ids_no_special")));
  CHECK(moerl::text::utf8_lossy(tokenizer.decode(ids)) == recorded.at("decoded").as_string());
  CHECK(moerl::text::utf8_lossy(tokenizer.decode(ids, /*skip_special=*/true)) ==
        recorded.at("decoded_skip_special").as_string());
}

std::vector<std::int64_t> concat(std::initializer_list<std::vector<std::int64_t>> parts) {
  std::vector<std::int64_t> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

}  // namespace

TEST_CASE("BPE encodings and decodings match the reference on held-out text", "[bpe]") {
  for (const char* name : kFixtures) {
    INFO("fixture " << name);
    const BpeTokenizer tokenizer = BpeTokenizer::from_file(fixture_path(name, "tokenizer.json"));
    const JsonValue expected = JsonValue::parse(read_text(fixture_path(name, "expected.json")));
    CHECK(tokenizer.vocab_size() == static_cast<std::int64_t>(expected.at("vocab_size").as_number()));
    check_case(tokenizer, expected.at("held_out"));
    CHECK(expected.at("held_out").at("ids").as_array().size() > 200);  // the fixture is not empty
    for (const JsonValue& recorded : expected.at("edge_cases").as_array()) check_case(tokenizer, recorded);
    // Single ids of the held-out text: partial UTF-8 sequences come back as U+FFFD.
    for (const auto& [id, text] : expected.at("single_id_decodes").as_object()) {
      INFO("id " << id);
      CHECK(moerl::text::utf8_lossy(tokenizer.decode({std::stoll(id)})) == text.as_string());
    }
    // A second encode is served from the word cache and must not differ.
    const std::string& held_out = expected.at("held_out").at("text").as_string();
    CHECK(tokenizer.encode(held_out) == ids_of(expected.at("held_out").at("ids")));
  }
}

TEST_CASE("BPE ByteLevel add_prefix_space matches the reference", "[bpe]") {
  // The GPT-2 fixture with one edit; the reference prepends the space to
  // every piece between added tokens.
  std::string json = read_text(fixture_path("gpt2", "tokenizer.json"));
  const std::string from = "\"add_prefix_space\": false";
  REQUIRE(json.find(from) != std::string::npos);
  json.replace(json.find(from), from.size(), "\"add_prefix_space\": true");
  const BpeTokenizer tokenizer = BpeTokenizer::from_json(json, "gpt2 with add_prefix_space");
  const JsonValue expected = JsonValue::parse(read_text(fixture_path("gpt2", "expected.json")));
  for (const JsonValue& recorded : expected.at("with_prefix_space").as_array()) {
    const std::string& text = recorded.at("text").as_string();
    INFO("text: " << text);
    std::vector<std::string> pre_tokens;
    for (const JsonValue& piece : recorded.at("pre_tokens").as_array()) pre_tokens.push_back(piece.as_string());
    CHECK(tokenizer.pre_tokenize(text) == pre_tokens);
    CHECK(tokenizer.encode(text) == ids_of(recorded.at("ids")));
  }
}

TEST_CASE("BPE ignore_merges matches the reference", "[bpe]") {
  // Random merges split some vocabulary words differently from the whole
  // word; with ignore_merges (as Llama-3 sets it) the whole word wins.
  std::string json = read_text(fixture_path("random_merges", "tokenizer.json"));
  const std::string from = "\"ignore_merges\":false";
  REQUIRE(json.find(from) != std::string::npos);
  json.replace(json.find(from), from.size(), "\"ignore_merges\":true");
  const BpeTokenizer tokenizer = BpeTokenizer::from_json(json, "random_merges with ignore_merges");
  const BpeTokenizer merging = BpeTokenizer::from_file(fixture_path("random_merges", "tokenizer.json"));
  const JsonValue expected = JsonValue::parse(read_text(fixture_path("random_merges", "expected.json")));
  int differ = 0;
  for (const JsonValue& recorded : expected.at("with_ignore_merges").as_array()) {
    const std::string& text = recorded.at("text").as_string();
    INFO("text: " << text);
    CHECK(tokenizer.encode(text) == ids_of(recorded.at("ids")));
    differ += tokenizer.encode(text) != merging.encode(text);
  }
  CHECK(differ > 0);  // the setting is exercised
}

TEST_CASE("BPE special and added tokens", "[bpe]") {
  const BpeTokenizer tokenizer = BpeTokenizer::from_file(fixture_path("qwen2", "tokenizer.json"));
  const std::int64_t im_start = tokenizer.token_id("<|im_start|>").value();
  const std::int64_t im_end = tokenizer.token_id("<|im_end|>").value();
  const std::int64_t think = tokenizer.token_id("<think>").value();
  CHECK(tokenizer.is_special(im_start));
  CHECK_FALSE(tokenizer.is_special(think));  // added, not special
  CHECK_FALSE(tokenizer.token_id("<|nope|>").has_value());
  CHECK(tokenizer.token_id("Ġ").has_value());  // vocabulary entries in their byte-level spelling

  // Matched before pre-tokenization, whatever surrounds them.
  const std::string text = "x<|im_start|>y<|im_end|><|im_end|><think>z";
  CHECK(
      tokenizer.encode(text) ==
      concat(
          {tokenizer.encode("x"), {im_start}, tokenizer.encode("y"), {im_end, im_end, think}, tokenizer.encode("z")}));
  // Without specials they are text, while non-special added tokens still match.
  const std::vector<std::int64_t> plain = tokenizer.encode(text, /*allow_special=*/false);
  CHECK(std::count(plain.begin(), plain.end(), im_start) == 0);
  CHECK(std::count(plain.begin(), plain.end(), think) == 1);
  CHECK(tokenizer.decode(plain) == text);
  CHECK(tokenizer.decode(tokenizer.encode(text), /*skip_special=*/true) == "xy<think>z");
  CHECK_THROWS_WITH(tokenizer.decode({tokenizer.vocab_size()}), Catch::Contains("token id 973"));
  CHECK_THROWS_WITH(tokenizer.decode({-1}), Catch::Contains("neither in the vocabulary"));
}

TEST_CASE("BPE round-trips arbitrary bytes, invalid UTF-8 included", "[bpe]") {
  std::mt19937 rng(7);
  for (const char* name : kFixtures) {
    INFO("fixture " << name);
    const BpeTokenizer tokenizer = BpeTokenizer::from_file(fixture_path(name, "tokenizer.json"));
    for (int trial = 0; trial < 200; ++trial) {
      std::string bytes(static_cast<std::size_t>(rng() % 64), '\0');
      // Half the trials over all bytes; half over bytes that often form UTF-8 sequences.
      for (char& c : bytes)
        c = static_cast<char>(trial % 2 ? rng() % 256 : "a \n\xC3\xA4\xE5\xBC\xBA\xF0\x9F\x98\x80"[rng() % 13]);
      INFO("trial " << trial);
      CHECK(tokenizer.decode(tokenizer.encode(bytes, /*allow_special=*/false)) == bytes);
    }
    // The reference cannot take invalid UTF-8 (its input is a Unicode string);
    // here each maximal invalid sequence is a pre-token of its own, so valid
    // text around it encodes exactly as it would alone.
    const std::string word_a = "Hello wörld", word_b = "强化 test";
    const std::string invalid = "\xE5\xBC";  // a cut three-byte sequence
    const std::vector<std::int64_t> ids = tokenizer.encode(word_a + invalid + word_b);
    const std::vector<std::int64_t> alone = tokenizer.encode(invalid);
    CHECK(ids == concat({tokenizer.encode(word_a), alone, tokenizer.encode(word_b)}));
    CHECK(tokenizer.decode(alone) == invalid);
    CHECK(moerl::text::utf8_lossy(tokenizer.decode(ids)) == word_a + "\xEF\xBF\xBD" + word_b);
  }
}

TEST_CASE("BPE encodes the same from several threads and past the word cache's size", "[bpe]") {
  const BpeTokenizer tokenizer = BpeTokenizer::from_file(fixture_path("random_merges", "tokenizer.json"));
  const JsonValue expected = JsonValue::parse(read_text(fixture_path("random_merges", "expected.json")));
  const std::string& text = expected.at("held_out").at("text").as_string();
  const std::vector<std::int64_t> reference = ids_of(expected.at("held_out").at("ids"));
  // 80k distinct words: more than the cache holds, so it is cleared mid-text.
  std::string many_words;
  for (int i = 0; i < 80000; ++i) {
    many_words += ' ';
    for (int v = i; v > 0 || many_words.back() == ' '; v /= 26) many_words += static_cast<char>('a' + v % 26);
  }
  std::vector<int> mismatches(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        if (tokenizer.encode(text) != reference) ++mismatches[t];
        if (round == 10 && t == 0 && tokenizer.decode(tokenizer.encode(many_words)) != many_words) ++mismatches[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(mismatches == std::vector<int>{0, 0});
  CHECK(tokenizer.encode(text) == reference);
}

TEST_CASE("utf8_lossy replaces maximal invalid subsequences like Rust's from_utf8_lossy", "[bpe]") {
  const std::string r = "\xEF\xBF\xBD";
  CHECK(moerl::text::utf8_lossy("ok \xC3\xA4 \xF0\x9F\x98\x80") == "ok \xC3\xA4 \xF0\x9F\x98\x80");
  CHECK(moerl::text::utf8_lossy("a\xE5\xBC"
                                "b") == "a" + r + "b");                 // one cut sequence: one U+FFFD
  CHECK(moerl::text::utf8_lossy("\xF0\x9F\x98") == r);                  // cut four-byte sequence
  CHECK(moerl::text::utf8_lossy("\xC0\xAF") == r + r);                  // overlong: each byte
  CHECK(moerl::text::utf8_lossy("\xED\xA0\x80") == r + r + r);          // a surrogate: each byte
  CHECK(moerl::text::utf8_lossy("\xF4\x90\x80\x80") == r + r + r + r);  // above U+10FFFF
  CHECK(moerl::text::utf8_lossy(std::string("\0\xFF", 2)) == std::string("\0", 1) + r);
}

TEST_CASE("malformed tokenizer.json names the file and the field", "[bpe]") {
  const std::string good = read_text(fixture_path("qwen2", "tokenizer.json"));
  const std::string gpt2 = read_text(fixture_path("gpt2", "tokenizer.json"));
  const auto edit = [](std::string text, const std::string& from, const std::string& to) {
    const std::size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
  };
  const auto fails_with = [](const std::string& text, const std::string& field, const std::string& what) {
    INFO("expected field " << field);
    CHECK_THROWS_WITH(
        BpeTokenizer::from_json(text, "models/broken/tokenizer.json"),
        Catch::Contains("models/broken/tokenizer.json") && Catch::Contains(field) && Catch::Contains(what));
  };
  REQUIRE_NOTHROW(BpeTokenizer::from_json(good, "ok"));
  fails_with(good.substr(0, good.size() / 2), "invalid JSON", "offset");
  fails_with(edit(good, "\"vocab\": {", "\"vocabulary\": {"), "model.vocab", "missing field");
  fails_with(edit(good, "\"Ġ\": 223", "\"Ġ\": -3"), "model.vocab[\"Ġ\"]", "not an integer");
  fails_with(edit(good, "\"merges\": [\n      [\n        \"Ġ\"", "\"merges\": [\n      [\n        \"§§\""),
             "model.merges[0]", "'§§' is not in model.vocab");
  fails_with(edit(gpt2, "\"merges\": [\n   \"Ġ Ġ\"", "\"merges\": [\n   \"Ġ Ġ Ġ\""), "model.merges[0]", "two tokens");
  fails_with(edit(good, "\"type\": \"BPE\"", "\"type\": \"WordPiece\""), "model.type", "not supported");
  fails_with(edit(good, "\"type\": \"NFC\"", "\"type\": \"NFKC\""), "normalizer.type", "'NFKC' is not supported");
  fails_with(edit(good, "\"behavior\": \"Isolated\"", "\"behavior\": \"Contiguous\""),
             "pre_tokenizer.pretokenizers[0].behavior", "'Contiguous' is not supported");
  fails_with(edit(good, "\"Regex\": \"(?i:", "\"Regex\": \"((?i:"), "pre_tokenizer.pretokenizers[0].pattern",
             "does not compile");
  fails_with(edit(good, "\"type\": \"Sequence\"", "\"type\": \"Metaspace\""), "pre_tokenizer.type", "'Metaspace'");
  fails_with(edit(good, "\"decoder\": {\n    \"type\": \"ByteLevel\"", "\"decoder\": {\n    \"type\": \"BPEDecoder\""),
             "decoder.type", "'BPEDecoder' is not supported");
  fails_with(edit(good, "\"lstrip\": false", "\"lstrip\": true"), "added_tokens[0].lstrip", "not supported");
  fails_with(edit(good, "\"content\": \"<|im_end|>\"", "\"content\": 5"), "added_tokens[2].content",
             "expected a string, got a number");

  moerl_test::TempDir dir;
  const std::string path = dir.file("tokenizer.json");
  std::ofstream(path) << edit(good, "\"byte_fallback\": false", "\"byte_fallback\": true");
  CHECK_THROWS_WITH(BpeTokenizer::from_file(path), Catch::Contains(path) && Catch::Contains("model.byte_fallback"));
  CHECK_THROWS_WITH(BpeTokenizer::from_file(dir.file("absent.json")),
                    Catch::Contains("absent.json") && Catch::Contains("cannot open"));
}

TEST_CASE("chat layout renders tokens and the assistant mask", "[bpe][chat]") {
  const BpeTokenizer tokenizer = BpeTokenizer::from_file(fixture_path("qwen2", "tokenizer.json"));
  const ChatRenderer chat(tokenizer, ChatLayout::chatml());
  const std::vector<ChatMessage> messages = {
      {Role::RoleSystem, "Answer briefly."},
      {Role::RoleUser, "Was ist 2+2? Ответь."},
      {Role::RoleAssistant, "4, das ist einfach."},
      {Role::RoleUser, "And <|im_end|> as text?"},  // not a special token inside content
      {Role::RoleAssistant, "Yes 😀"},
  };
  const auto rendered = chat.render(messages, /*add_generation_prompt=*/true);
  REQUIRE(rendered.tokens.size() == rendered.assistant_mask.size());

  // The same tokens as encoding the whole conversation text at once, with
  // the user's "<|im_end|>" kept as text.
  const std::vector<std::int64_t> whole =
      concat({tokenizer.encode("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nWas ist 2+2? Ответь."
                               "<|im_end|>\n<|im_start|>assistant\n4, das ist einfach.<|im_end|>\n<|im_start|>user\n"),
              tokenizer.encode("And <|im_end|> as text?", false),
              tokenizer.encode("<|im_end|>\n<|im_start|>assistant\nYes 😀<|im_end|>\n<|im_start|>assistant\n")});
  CHECK(rendered.tokens == whole);

  // Mask 1 exactly on the assistant contents and their closing <|im_end|>.
  std::vector<std::int64_t> generated, context;
  for (std::size_t i = 0; i < rendered.tokens.size(); ++i) {
    (rendered.assistant_mask[i] ? generated : context).push_back(rendered.tokens[i]);
  }
  const std::int64_t im_end = tokenizer.token_id("<|im_end|>").value();
  CHECK(generated == concat({tokenizer.encode("4, das ist einfach."), {im_end}, tokenizer.encode("Yes 😀"), {im_end}}));
  CHECK(tokenizer.decode(context) ==
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nWas ist 2+2? Ответь.<|im_end|>\n"
        "<|im_start|>assistant\n\n<|im_start|>user\nAnd <|im_end|> as text?<|im_end|>\n<|im_start|>assistant\n\n"
        "<|im_start|>assistant\n");
  CHECK(chat.end_of_turn_id() == im_end);
  CHECK(chat.generation_prompt() == tokenizer.encode("<|im_start|>assistant\n"));
  CHECK(rendered.assistant_mask.back() == 0);  // the generation prompt is context
}

TEST_CASE("chat layout errors name the field", "[bpe][chat]") {
  const BpeTokenizer tokenizer = BpeTokenizer::from_file(fixture_path("qwen2", "tokenizer.json"));
  ChatLayout no_content;
  no_content.message = "<|im_start|>{role}\n<|im_end|>\n";
  CHECK_THROWS_WITH(ChatRenderer(tokenizer, no_content), Catch::Contains("message") && Catch::Contains("{content}"));
  ChatLayout bad_eot;
  bad_eot.end_of_turn = "<|eot_id|>";
  CHECK_THROWS_WITH(ChatRenderer(tokenizer, bad_eot),
                    Catch::Contains("end_of_turn") && Catch::Contains("single token"));
  ChatLayout not_after;
  not_after.message = "<|im_start|>{role}\n{content}\n<|im_end|>";
  CHECK_THROWS_WITH(ChatRenderer(tokenizer, not_after), Catch::Contains("must be followed by"));
  // Llama-3's layout needs its own special tokens, which this tokenizer lacks.
  CHECK_THROWS_WITH(ChatRenderer(tokenizer, ChatLayout::llama3()), Catch::Contains("<|eot_id|>"));
}
