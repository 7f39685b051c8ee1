// Byte tokenizer and chat layout.

#include <catch2/catch.hpp>

#include <random>

#include "moerl/text/tokenizer.h"

using moerl::text::ByteTokenizer;
using moerl::text::ChatMessage;
using moerl::text::Role;
using moerl::text::SpecialTokens;

TEST_CASE("byte tokenizer round-trips arbitrary bytes", "[model][tokenizer]") {
  ByteTokenizer tok;
  CHECK(tok.vocab_size() == 264);

  // Every byte value, NUL and 0xFF included, plus UTF-8 multibyte text.
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  const std::string utf8 = "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80 \xE6\x97\xA5\xE6\x9C\xAC";  // héllo € 😀 日本
  std::string with_nul("a\0b\0\0c", 6);

  std::mt19937 rng(7);
  std::string random_bytes;
  for (int i = 0; i < 1000; ++i) random_bytes.push_back(static_cast<char>(rng() & 0xFF));

  for (const std::string& text : {all_bytes, utf8, with_nul, random_bytes, std::string()}) {
    const auto ids = tok.encode(text);
    REQUIRE(ids.size() == text.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      INFO("byte " << i);
      REQUIRE(ids[i] == static_cast<std::int64_t>(static_cast<unsigned char>(text[i])));
    }
    const std::string back = tok.decode(ids);
    REQUIRE(back.size() == text.size());
    CHECK(back == text);
  }
  // é is two tokens, € three, 😀 four: byte-level, not code points.
  CHECK(tok.encode("\xC3\xA9").size() == 2);
  CHECK(tok.encode("\xF0\x9F\x98\x80").size() == 4);
}

TEST_CASE("special tokens decode by name or are skipped", "[model][tokenizer]") {
  ByteTokenizer tok;
  const std::vector<std::int64_t> ids{SpecialTokens::kBos, 'h', 'i', SpecialTokens::kEndOfTurn};
  CHECK(tok.decode(ids) == "hi");
  CHECK(tok.decode(ids, /*skip_special=*/false) == "<|bos|>hi<|eot|>");
  for (std::int64_t id = 256; id < 264; ++id) CHECK(ByteTokenizer::is_special(id));
  CHECK_FALSE(ByteTokenizer::is_special(255));
  CHECK_THROWS(tok.decode({264}));
  CHECK_THROWS(tok.decode({-1}));
}

TEST_CASE("chat layout and assistant mask", "[model][tokenizer]") {
  const std::vector<ChatMessage> chat{
      {Role::RoleSystem, "sys"},
      {Role::RoleUser, "obs1"},
      {Role::RoleAssistant, "go"},
      {Role::RoleUser, "o2"},
      {Role::RoleAssistant, std::string("a\0", 2)},
  };
  const auto rendered = moerl::text::render_chat(chat, /*add_generation_prompt=*/true);
  const std::int64_t B = SpecialTokens::kBos, S = SpecialTokens::kSystem, U = SpecialTokens::kUser,
                     A = SpecialTokens::kAssistant, E = SpecialTokens::kEndOfTurn;
  const std::vector<std::int64_t> expected_tokens{B,                         //
                                                  S, 's', 'y', 's', E,       //
                                                  U, 'o', 'b', 's', '1', E,  //
                                                  A, 'g', 'o', E,            //
                                                  U, 'o', '2', E,            //
                                                  A, 'a', 0,   E,            //
                                                  A};                        // generation prompt
  const std::vector<std::uint8_t> expected_mask{0,                           //
                                                0, 0, 0, 0, 0,               //
                                                0, 0, 0, 0, 0, 0,            //
                                                0, 1, 1, 1,                  // header no, content and closing eot yes
                                                0, 0, 0, 0,                  //
                                                0, 1, 1, 1,                  //
                                                0};
  REQUIRE(rendered.tokens.size() == rendered.assistant_mask.size());
  REQUIRE(rendered.tokens.size() == expected_tokens.size());
  for (std::size_t i = 0; i < expected_tokens.size(); ++i) {
    INFO("position " << i);
    CHECK(rendered.tokens[i] == expected_tokens[i]);
    CHECK(int(rendered.assistant_mask[i]) == int(expected_mask[i]));
  }
  // The masked tokens are exactly the assistant contents, each followed by <|eot|>.
  ByteTokenizer tok;
  std::vector<std::int64_t> generated;
  for (std::size_t i = 0; i < rendered.tokens.size(); ++i)
    if (rendered.assistant_mask[i]) generated.push_back(rendered.tokens[i]);
  CHECK(tok.decode(generated, false) == std::string("go<|eot|>a\0<|eot|>", 18));

  const auto no_prompt = moerl::text::render_chat(chat);
  CHECK(no_prompt.tokens.size() == expected_tokens.size() - 1);
  CHECK(no_prompt.tokens.back() == E);
}
