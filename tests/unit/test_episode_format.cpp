// Episode formats (text/episode_format.h): an episode built turn by turn as
// the actor builds it (prompt_turn, then the policy's action and its
// end-of-turn token) is exactly the rendering of the same conversation,
// tokens and assistant mask: render_chat() for the byte layout,
// ChatRenderer::render() for ChatML on the qwen2_moe fixture's tokenizer.
// Then the [chat] configuration: presets, overrides, and errors that name
// the key and the files.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <functional>

#include "moerl/config/config.h"
#include "moerl/setup/config_loading.h"
#include "moerl/text/episode_format.h"
#include "temp_dir.h"

using moerl::text::BpeTokenizer;
using moerl::text::ChatLayout;
using moerl::text::ChatMessage;
using moerl::text::ChatRenderer;
using moerl::text::EpisodeFormat;
using moerl::text::EpisodeFormatError;
using moerl::text::make_episode_format;
using moerl::text::RenderedChat;
using moerl::text::Role;
using moerl::text::SpecialTokens;

namespace {

const std::string kQwen = std::string(MOERL_SOURCE_DIR) + "/tests/parity/fixtures/qwen2_moe";
const std::string kMixtral = std::string(MOERL_SOURCE_DIR) + "/tests/parity/fixtures/mixtral";

using Encode = std::function<std::vector<std::int64_t>(const std::string&)>;

// The actor's bookkeeping: for each (observation, action) pair, the prompt
// it feeds (mask 0), then what the policy generates (mask 1): the action's
// tokens and, unless the turn is cut off, the end-of-turn token.
RenderedChat build_episode(const EpisodeFormat& format, const std::vector<ChatMessage>& messages, const Encode& encode,
                           int cut_turn = -1) {
  RenderedChat episode;
  bool cut = false;
  for (std::size_t m = 0; m + 1 < messages.size(); m += 2) {
    REQUIRE(messages[m].role == Role::RoleUser);
    REQUIRE(messages[m + 1].role == Role::RoleAssistant);
    for (std::int64_t id : format.prompt_turn(messages[m].content, m == 0, cut)) {
      episode.tokens.push_back(id);
      episode.assistant_mask.push_back(0);
    }
    std::vector<std::int64_t> generated = encode(messages[m + 1].content);
    cut = static_cast<int>(m / 2) == cut_turn;
    if (!cut) generated.push_back(format.end_of_turn_id());
    CHECK(format.action_text(generated) == messages[m + 1].content);  // what the env worker receives
    for (std::int64_t id : generated) {
      episode.tokens.push_back(id);
      episode.assistant_mask.push_back(1);
    }
  }
  return episode;
}

const std::vector<ChatMessage> kConversation = {
    {Role::RoleUser, "sort: sort the list ascending. list: 86 62 57"},
    {Role::RoleAssistant, "swap 0 2"},
    {Role::RoleUser, "sorted: 57 62 86 <|im_end|> (as text) \xff bytes"},
    {Role::RoleAssistant, "done <|eot|>?"},
    {Role::RoleUser, "Ответь: 2+2"},
    {Role::RoleAssistant, "4"},
};

std::vector<std::int64_t> bytes_of(const std::string& text) { return moerl::text::ByteTokenizer().encode(text); }

BpeTokenizer qwen_tokenizer() { return BpeTokenizer::from_file(kQwen + "/tokenizer.json"); }

moerl::config::Config config_of(const std::string& text) { return moerl::setup::load_config_text(text, "run.toml"); }

std::vector<moerl::config::ConfigIssue> issues_of(const std::string& text) {
  try {
    config_of(text);
  } catch (const moerl::config::ConfigError& error) {
    return error.issues();
  }
  FAIL("configuration loaded without errors:\n" << text);
  return {};
}

std::string hf_model(const std::string& dir) { return "[model]\nsource = \"hf:" + dir + "\"\n"; }

}  // namespace

TEST_CASE("byte layout: the actor's episode is render_chat of its messages", "[episode_format]") {
  const EpisodeFormat format;
  CHECK(format.is_byte());
  const std::vector<ChatMessage> messages(kConversation.begin(), kConversation.end());
  const RenderedChat expected = moerl::text::render_chat(messages);
  const RenderedChat episode = build_episode(format, messages, bytes_of);
  CHECK(episode.tokens == expected.tokens);
  CHECK(episode.assistant_mask == expected.assistant_mask);
  CHECK(format.end_of_turn_id() == SpecialTokens::kEndOfTurn);
  CHECK(format.pad_id() == SpecialTokens::kPad);
  CHECK(format.vocab_size() == 264);
  // Today's first prompt, token for token.
  CHECK(format.prompt_turn("hi", true, false) == std::vector<std::int64_t>{SpecialTokens::kBos, SpecialTokens::kUser,
                                                                           'h', 'i', SpecialTokens::kEndOfTurn,
                                                                           SpecialTokens::kAssistant});
}

TEST_CASE("chatml layout: the actor's episode is ChatRenderer::render of its messages", "[episode_format]") {
  const BpeTokenizer tokenizer = qwen_tokenizer();
  const ChatRenderer chat(tokenizer, ChatLayout::chatml());
  const EpisodeFormat format(chat);
  CHECK_FALSE(format.is_byte());
  const auto encode = [&](const std::string& text) { return tokenizer.encode(text, /*allow_special=*/false); };
  for (std::size_t turns : {2, 3}) {
    INFO(turns << " turns");
    const std::vector<ChatMessage> messages(kConversation.begin(), kConversation.begin() + 2 * turns);
    const RenderedChat rendered = chat.render(messages);
    const RenderedChat episode = build_episode(format, messages, encode);
    // The episode ends at the last action's <|im_end|>: render()'s closing "\n" is never fed.
    const std::vector<std::int64_t>& trailer = chat.trailer(Role::RoleAssistant);
    CHECK(trailer == tokenizer.encode("\n"));
    REQUIRE(rendered.tokens.size() == episode.tokens.size() + trailer.size());
    CHECK(std::vector<std::int64_t>(rendered.tokens.end() - trailer.size(), rendered.tokens.end()) == trailer);
    CHECK(episode.tokens == std::vector<std::int64_t>(rendered.tokens.begin(), rendered.tokens.end() - trailer.size()));
    CHECK(episode.assistant_mask ==
          std::vector<std::uint8_t>(rendered.assistant_mask.begin(), rendered.assistant_mask.end() - trailer.size()));
  }
  const std::int64_t im_end = tokenizer.token_id("<|im_end|>").value();
  CHECK(format.end_of_turn_id() == im_end);
  CHECK(format.pad_id() == im_end);
  CHECK(format.vocab_size() == 973);
  CHECK(format.prompt_turn("hi", true, false) ==
        tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
}

TEST_CASE("a turn cut off before its end-of-turn is closed as context", "[episode_format]") {
  const BpeTokenizer tokenizer = qwen_tokenizer();
  const ChatRenderer chat(tokenizer, ChatLayout::chatml());
  const auto bpe = [&](const std::string& text) { return tokenizer.encode(text, /*allow_special=*/false); };
  const std::vector<ChatMessage> messages(kConversation.begin(), kConversation.begin() + 6);
  struct Case {
    EpisodeFormat format;
    RenderedChat rendered;
    Encode encode;
  };
  for (const Case& c : {Case{EpisodeFormat(), moerl::text::render_chat(messages), bytes_of},
                        Case{EpisodeFormat(chat), chat.render(messages), bpe}}) {
    INFO(c.format.description());
    const RenderedChat episode = build_episode(c.format, messages, c.encode, /*cut_turn=*/1);
    // Same tokens as the full rendering (up to the last trailer); the mask
    // differs only at the second action's end-of-turn, which the actor fed.
    REQUIRE(episode.tokens.size() <= c.rendered.tokens.size());
    CHECK(episode.tokens ==
          std::vector<std::int64_t>(c.rendered.tokens.begin(), c.rendered.tokens.begin() + episode.tokens.size()));
    std::vector<std::size_t> differ;
    for (std::size_t i = 0; i < episode.tokens.size(); ++i)
      if (episode.assistant_mask[i] != c.rendered.assistant_mask[i]) differ.push_back(i);
    REQUIRE(differ.size() == 1);
    CHECK(episode.tokens[differ[0]] == c.format.end_of_turn_id());
    CHECK(episode.assistant_mask[differ[0]] == 0);
    CHECK(episode.assistant_mask[differ[0] - 1] == 1);  // the action's last token
  }
}

TEST_CASE("action text, stop-string bytes and the debug dump", "[episode_format]") {
  const BpeTokenizer tokenizer = qwen_tokenizer();
  const EpisodeFormat chatml(ChatRenderer(tokenizer, ChatLayout::chatml()));
  const std::int64_t im_start = tokenizer.token_id("<|im_start|>").value();
  const std::int64_t im_end = tokenizer.token_id("<|im_end|>").value();
  const std::int64_t think = tokenizer.token_id("<think>").value();  // added, not special: text
  std::vector<std::int64_t> ids = {im_start};
  for (std::int64_t id : tokenizer.encode(" answer 42")) ids.push_back(id);
  ids.push_back(think);
  ids.push_back(973);  // in a larger model vocabulary, not in the tokenizer's
  ids.push_back(im_end);
  CHECK(chatml.action_text(ids) == " answer 42<think>");
  CHECK(chatml.token_bytes(im_end).empty());
  CHECK(chatml.token_bytes(973).empty());
  CHECK(chatml.token_bytes(tokenizer.encode("x").at(0)) == "x");
  const std::vector<std::int32_t> dump(ids.begin(), ids.end());
  CHECK(chatml.debug_text(dump) == "<|im_start|> answer 42<think><|id 973|><|im_end|>");

  const EpisodeFormat byte;
  CHECK(byte.action_text({'o', 'k', SpecialTokens::kEndOfTurn}) == "ok");
  CHECK(byte.token_bytes(0) == std::string(1, '\0'));
  CHECK(byte.token_bytes(SpecialTokens::kUser).empty());
  CHECK(byte.debug_text({SpecialTokens::kUser, 'o', 'k', SpecialTokens::kEndOfTurn, 300}) ==
        "<|user|>ok<|eot|><|id 300|>");
}

TEST_CASE("truncation keeps the first user message and cuts at message headers", "[episode_format]") {
  const BpeTokenizer tokenizer = qwen_tokenizer();
  const ChatRenderer chat(tokenizer, ChatLayout::chatml());
  const EpisodeFormat chatml(chat);
  const std::vector<ChatMessage> messages = {
      {Role::RoleSystem, "Be brief."}, {Role::RoleUser, "task"}, {Role::RoleAssistant, "act"}, {Role::RoleUser, "obs"}};
  const RenderedChat rendered = chat.render(messages);
  // Head: everything up to the first user message's <|im_end|> and its "\n".
  const auto head = tokenizer.encode("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\ntask<|im_end|>\n");
  CHECK(chatml.head_length(rendered.tokens) == static_cast<std::int64_t>(head.size()));
  CHECK(chatml.head_length(tokenizer.encode("<|im_start|>user\ntask")) == 0);  // not closed yet
  CHECK(chatml.starts_message(tokenizer.token_id("<|im_start|>").value()));
  CHECK_FALSE(chatml.starts_message(tokenizer.token_id("<|im_end|>").value()));

  const EpisodeFormat byte;
  const RenderedChat bytes = moerl::text::render_chat(messages);
  CHECK(byte.head_length(bytes.tokens) == 1 + 1 + 9 + 1 + 1 + 4 + 1);  // <bos> system msg, user msg
  for (std::int64_t role : {SpecialTokens::kSystem, SpecialTokens::kUser, SpecialTokens::kAssistant})
    CHECK(byte.starts_message(role));
  CHECK_FALSE(byte.starts_message(SpecialTokens::kEndOfTurn));
  CHECK_FALSE(byte.starts_message('a'));
}

TEST_CASE("[chat] auto is byte for the built-in model and chatml for an hf: source", "[episode_format][config]") {
  const moerl::config::Config builtin = config_of("");
  CHECK(make_episode_format(builtin.model, builtin.chat).is_byte());

  const moerl::config::Config hf = config_of(hf_model(kQwen));
  const EpisodeFormat format = make_episode_format(hf.model, hf.chat);
  CHECK_FALSE(format.is_byte());
  CHECK(format.end_of_turn_id() == 2);
  CHECK_THAT(format.description(), Catch::Contains(kQwen + "/tokenizer.json") && Catch::Contains("<|im_start|>"));

  // Overrides of the preset's fields: other role names, another template.
  const moerl::config::Config custom = config_of(hf_model(kQwen) +
                                                 "[chat]\nuser_role = \"environment\"\nassistant_role = \"policy\"\n"
                                                 "message = \"<|im_start|>{role}: {content}<|im_end|>\"\n");
  const BpeTokenizer tokenizer = qwen_tokenizer();
  // Header, content and end-of-turn are encoded apart, as generation sees them.
  std::vector<std::int64_t> expected = tokenizer.encode("<|im_start|>environment: ");
  for (std::int64_t id : tokenizer.encode("obs")) expected.push_back(id);
  expected.push_back(tokenizer.token_id("<|im_end|>").value());
  for (std::int64_t id : tokenizer.encode("<|im_start|>policy: ")) expected.push_back(id);
  CHECK(make_episode_format(custom.model, custom.chat).prompt_turn("obs", true, false) == expected);

  // An hf: directory without tokenizer.json loads (eval --tokens needs no
  // layout), but has no episode format.
  const moerl::config::Config mixtral = config_of(hf_model(kMixtral));
  try {
    make_episode_format(mixtral.model, mixtral.chat);
    FAIL("an hf: source without tokenizer.json has no episode format");
  } catch (const EpisodeFormatError& error) {
    CHECK(error.key() == "chat.layout");
    CHECK_THAT(error.what(), Catch::Contains("no tokenizer.json") && Catch::Contains(kMixtral));
  }
}

TEST_CASE("[chat] errors name the key and the files", "[episode_format][config]") {
  auto issues = issues_of("[chat]\nlayout = \"chatml\"\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "chat.layout");
  CHECK(issues[0].line == 2);
  CHECK_THAT(issues[0].message, Catch::Contains("needs a tokenizer"));

  issues = issues_of(hf_model(kQwen) + "[chat]\nend_of_turn = \"<|eot_id|>\"\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "chat.end_of_turn");
  CHECK_THAT(issues[0].message, Catch::Contains("not a single token") && Catch::Contains(kQwen + "/tokenizer.json"));

  issues = issues_of(hf_model(kQwen) + "[chat]\nlayout = \"llama3\"\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "chat.end_of_turn");
  CHECK_THAT(issues[0].message, Catch::Contains("<|eot_id|>") && Catch::Contains("llama3"));

  issues = issues_of(hf_model(kQwen) + "[chat]\nmessage = \"{role} {content}\"\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "chat.message");
  CHECK_THAT(issues[0].message, Catch::Contains("must be followed by"));

  issues = issues_of("[chat]\nmessage = \"{role}: {content}\"\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "chat.message");
  CHECK_THAT(issues[0].message, Catch::Contains("byte layout is fixed"));

  issues = issues_of(hf_model(kQwen) + "[chat]\ntokenizer = \"/nonexistent/tokenizer.json\"\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "chat.tokenizer");
  CHECK_THAT(issues[0].message, Catch::Contains("/nonexistent/tokenizer.json"));

  issues = issues_of("[model]\nvocab_size = 200\n");
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "model.vocab_size");
  CHECK_THAT(issues[0].message, Catch::Contains("at least 264"));

  // The tokenizer's ids must fit the model's vocabulary: both files named.
  moerl_test::TempDir dir;
  std::filesystem::copy_file(kQwen + "/tokenizer.json", dir.file("tokenizer.json"));
  std::ifstream in(kQwen + "/config.json");
  std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string from = "\"vocab_size\": 973";
  REQUIRE(json.find(from) != std::string::npos);
  json.replace(json.find(from), from.size(), "\"vocab_size\": 900");
  std::ofstream(dir.file("config.json")) << json;
  issues = issues_of(hf_model(dir.path.string()));
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].key == "model.source");
  CHECK_THAT(issues[0].message, Catch::Contains(dir.file("tokenizer.json")) &&
                                    Catch::Contains(dir.file("config.json")) && Catch::Contains("972") &&
                                    Catch::Contains("900"));
}
