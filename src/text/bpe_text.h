#pragma once
// Text preparation ahead of byte-level BPE (private to src/model): UTF-8
// scanning, NFC normalization (ICU) and the regex pre-tokenizer (PCRE2).
// Hugging Face's `tokenizers` compiles its split patterns with Oniguruma;
// translate_oniguruma_pattern() bridges the one difference that matters for
// the GPT-2/Qwen2/Llama-3 patterns (see there).

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;

namespace moerl::text::bpe {

// One step of a UTF-8 scan: a valid code point of `length` bytes, or
// (valid = false) the maximal invalid subsequence there, 1-3 bytes: the
// unit that Rust's from_utf8_lossy replaces with one U+FFFD.
struct Utf8Step {
  std::size_t length = 0;
  bool valid = false;
};
Utf8Step utf8_step(std::string_view text, std::size_t at);

// Length of the longest valid UTF-8 prefix of text.substr(at).
std::size_t valid_utf8_run(std::string_view text, std::size_t at);

// Writes the NFC form of valid UTF-8 `text` to `out` and returns true, or
// returns false (leaving `out` alone) when `text` is already NFC.
bool nfc_normalize(std::string_view text, std::string& out);

// Oniguruma, which `tokenizers` uses, takes \s as Unicode White_Space;
// PCRE2 10.42 in UCP mode also counts U+180E (MONGOLIAN VOWEL SEPARATOR,
// White_Space only before Unicode 6.3). The translation spells \s out as the
// White_Space list (inside and outside character classes, and \S outside
// them as its complement). Everything else in the GPT-2/Qwen2/Llama-3
// patterns means the same in both.
std::string translate_oniguruma_pattern(const std::string& pattern);

// Per-call matching scratch (PCRE2 match data): not shared between threads.
class MatchScratch {
 public:
  MatchScratch();
  ~MatchScratch();
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
  pcre2_real_match_data_8* get() const { return data_; }

 private:
  pcre2_real_match_data_8* data_;
};

// A compiled pattern (UTF + Unicode properties, JIT where available).
class Regex {
 public:
  // `where` names the pattern's origin in errors (file and JSON path).
  Regex(const std::string& oniguruma_pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // First match in subject at or after `start` (a code point boundary of
  // valid UTF-8); false when there is none.
  bool find(std::string_view subject, std::size_t start, MatchScratch& scratch, std::size_t& begin,
            std::size_t& end) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
  std::string where_;
};

// The pre-tokenizer: Split steps applied in turn, then ByteLevel.
class PreTokenizer {
 public:
  enum class SplitBehavior { SplitIsolated, SplitRemoved };

  void add_split(std::unique_ptr<Regex> regex, SplitBehavior behavior);
  // ByteLevel: `gpt2_regex` is null when the step does not split itself.
  void set_byte_level(bool add_prefix_space, std::unique_ptr<Regex> gpt2_regex);

  // Calls sink(std::string_view piece) for every non-empty pre-token of
  // valid UTF-8 `text`, in order.
  template <typename Sink>
  void run(std::string_view text, MatchScratch& scratch, Sink&& sink) const {
    run_from(0, text, scratch, sink);
  }

 private:
  struct Split {
    std::unique_ptr<Regex> regex;
    SplitBehavior behavior;
  };

  template <typename Sink>
  void run_from(std::size_t step, std::string_view text, MatchScratch& scratch, Sink& sink) const;
  template <typename Sink>
  void byte_level(std::string_view text, MatchScratch& scratch, Sink& sink) const;
  // Calls piece(begin, end, is_match) for the matches of `regex` and the gaps between them.
  template <typename Piece>
  static void for_each_piece(const Regex& regex, std::string_view text, MatchScratch& scratch, Piece&& piece);

  std::vector<Split> splits_;
  bool add_prefix_space_ = false;
  std::unique_ptr<Regex> gpt2_regex_;
};

// The regex of GPT-2's ByteLevel pre-tokenizer (use_regex = true).
extern const char* const kGpt2SplitPattern;

template <typename Piece>
void PreTokenizer::for_each_piece(const Regex& regex, std::string_view text, MatchScratch& scratch, Piece&& piece) {
  std::size_t done = 0;    // text before this is handed out
  std::size_t search = 0;  // where the next match may start
  std::size_t begin = 0;
  std::size_t end = 0;
  while (search <= text.size() && regex.find(text, search, scratch, begin, end)) {
    if (end == begin) {  // an empty match splits nothing: step over one code point
      search = begin + std::max<std::size_t>(1, utf8_step(text, begin).length);
      continue;
    }
    if (begin > done) piece(done, begin, false);
    piece(begin, end, true);
    done = search = end;
  }
  if (done < text.size()) piece(done, text.size(), false);
}

template <typename Sink>
void PreTokenizer::run_from(std::size_t step, std::string_view text, MatchScratch& scratch, Sink& sink) const {
  if (text.empty()) return;
  if (step == splits_.size()) {
    byte_level(text, scratch, sink);
    return;
  }
  const Split& split = splits_[step];
  for_each_piece(*split.regex, text, scratch, [&](std::size_t begin, std::size_t end, bool is_match) {
    if (is_match && split.behavior == SplitBehavior::SplitRemoved) return;
    run_from(step + 1, text.substr(begin, end - begin), scratch, sink);
  });
}

template <typename Sink>
void PreTokenizer::byte_level(std::string_view text, MatchScratch& scratch, Sink& sink) const {
  std::string prefixed;
  if (add_prefix_space_ && text.front() != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed += ' ';
    prefixed += text;
    text = prefixed;
  }
  if (!gpt2_regex_) {
    sink(text);
    return;
  }
  for_each_piece(*gpt2_regex_, text, scratch,
                 [&](std::size_t begin, std::size_t end, bool) { sink(text.substr(begin, end - begin)); });
}

}  // namespace moerl::text::bpe
