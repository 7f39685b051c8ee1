#include "bpe_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <climits>
#include <cstdint>

#include "moerl/core/check.h"

namespace moerl::text::bpe {

const char* const kGpt2SplitPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Utf8Step utf8_step(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return {1, true};
  // Length and the range of the second byte by lead byte (Unicode table 3-7);
  // the range excludes overlong forms, surrogates and code points > U+10FFFF.
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return {1, false};  // a continuation byte, C0, C1 or F5..FF
  }
  std::size_t k = 1;
  for (; k < length; ++k) {
    if (at + k >= text.size()) return {k, false};
    const unsigned char b = byte(at + k);
    const bool ok = k == 1 ? (b >= low && b <= high) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {k, false};
  }
  return {length, true};
}

std::size_t valid_utf8_run(std::string_view text, std::size_t at) {
  std::size_t i = at;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step step = utf8_step(text, i);
    if (!step.valid) break;
    i += step.length;
  }
  return i - at;
}

bool nfc_normalize(std::string_view text, std::string& out) {
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return false;  // ASCII is its own NFC form
  MOERL_CHECK(text.size() <= static_cast<std::size_t>(INT32_MAX),
              "NFC normalization takes at most 2 GiB of text at once");
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  MOERL_CHECK(U_SUCCESS(status), std::string("ICU has no NFC normalizer: ") + u_errorName(status));
  const icu::StringPiece piece(text.data(), static_cast<std::int32_t>(text.size()));
  const bool normalized = nfc->isNormalizedUTF8(piece, status);
  if (U_SUCCESS(status) && normalized) return false;
  status = U_ZERO_ERROR;
  out.clear();
  icu::StringByteSink<std::string> sink(&out, static_cast<std::int32_t>(text.size()));
  nfc->normalizeUTF8(0, piece, sink, nullptr, status);
  MOERL_CHECK(U_SUCCESS(status), std::string("ICU NFC normalization failed: ") + u_errorName(status));
  return true;
}

std::string translate_oniguruma_pattern(const std::string& pattern) {
  // Unicode's White_Space property, unchanged since Unicode 6.3.
  static const std::string kWhiteSpace =
      R"(\t\n\x{0b}\f\r\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char escaped = pattern[++i];
      if (escaped == 's') {
        out += in_class ? kWhiteSpace : "[" + kWhiteSpace + "]";
      } else if (escaped == 'S' && !in_class) {
        out += "[^" + kWhiteSpace + "]";
      } else {
        out += c;
        out += escaped;
      }
      continue;
    }
    out += c;
    if (c == '[' && !in_class) {
      in_class = true;
      // "[^]..." and "[]...": a ']' right after the opening is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
    } else if (c == ']' && in_class) {
      in_class = false;
    }
  }
  return out;
}

MatchScratch::MatchScratch() : data_(pcre2_match_data_create(1, nullptr)) {
  if (data_ == nullptr) throw std::bad_alloc();
}

MatchScratch::~MatchScratch() { pcre2_match_data_free(data_); }

namespace {
std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}
}  // namespace

Regex::Regex(const std::string& oniguruma_pattern, const std::string& where) : where_(where) {
  const std::string pattern = translate_oniguruma_pattern(oniguruma_pattern);
  int code = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &code,
                        &offset, nullptr);
  if (code_ == nullptr) {
    throw Error(where + ": the regex does not compile (PCRE2: " + pcre2_message(code) + " at offset " +
                std::to_string(offset) + "): " + oniguruma_pattern);
  }
  // JIT is several times faster; where the platform lacks it, the
  // interpreter gives the same matches.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() { pcre2_code_free(code_); }

bool Regex::find(std::string_view subject, std::size_t start, MatchScratch& scratch, std::size_t& begin,
                 std::size_t& end) const {
  // The subject is valid UTF-8 (checked by the caller), so PCRE2's own check is skipped.
  const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), start,
                             PCRE2_NO_UTF_CHECK, scratch.get(), nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) throw Error(where_ + ": matching the regex failed (PCRE2: " + pcre2_message(rc) + ")");
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.get());
  begin = ovector[0];
  end = ovector[1];
  return true;
}

void PreTokenizer::add_split(std::unique_ptr<Regex> regex, SplitBehavior behavior) {
  splits_.push_back({std::move(regex), behavior});
}

void PreTokenizer::set_byte_level(bool add_prefix_space, std::unique_ptr<Regex> gpt2_regex) {
  add_prefix_space_ = add_prefix_space;
  gpt2_regex_ = std::move(gpt2_regex);
}

}  // namespace moerl::text::bpe
