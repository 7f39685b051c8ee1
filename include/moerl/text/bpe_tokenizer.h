#pragma once
// Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (the
// GPT-2 / Qwen2 / Llama-3 family), giving the same ids as the reference
// implementation (the `tokenizers` package; see tests/parity/).
//
// Encoding, in the reference's order:
//   1. added tokens (special or not) are cut out of the raw text, leftmost
//      first and the longest at a position; with allow_special = false the
//      special ones are left in as plain text (as `encode_special_tokens`),
//   2. each remaining segment is normalized (none or NFC),
//   3. pre-tokenized: the Split regexes (Unicode classes through PCRE2), then
//      ByteLevel (optional prefix space, optional GPT-2 regex),
//   4. each pre-token's bytes are merged by BPE rank into vocabulary ids.
// No post-processor runs: encode never adds BOS/EOS (the chat layout writes
// the tokens a conversation needs).
//
// Bytes that are not valid UTF-8 (which the reference cannot take: its input
// is a Unicode string) are encoded too: each maximal invalid sequence is a
// pre-token of its own and goes through BPE as bytes, so that
// decode(encode(bytes)) == bytes for every byte string.
//
// decode returns the exact bytes of the tokens. The reference returns the
// same bytes passed through Rust's String::from_utf8_lossy; utf8_lossy()
// below reproduces that when the reference's string is wanted.
//
// Differences from the reference, all outside what GPT-2/Qwen2/Llama-3 files
// use: added tokens with lstrip/rstrip/single_word are refused at load;
// added tokens marked "normalized" are matched in the raw text, not the
// normalized one (the same for NFC-stable contents such as ASCII); decode
// throws for unknown ids and encode for a byte without a token (and no
// unk_token), where the reference drops them.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moerl::text {

class BpeTokenizer {
 public:
  // Reads and validates a tokenizer.json. Throws moerl::Error naming the
  // file and the JSON path at fault (e.g. "model.merges[12]"), also for
  // configurations it does not support (other models, normalizers,
  // pre-tokenizers or decoders).
  static BpeTokenizer from_file(const std::string& path);
  // The same from the file's text; `origin` names it in errors.
  static BpeTokenizer from_json(const std::string& json_text, const std::string& origin);

  std::vector<std::int64_t> encode(std::string_view text, bool allow_special = true) const;
  // Throws for an id that is neither in the vocabulary nor an added token
  // (the reference drops such ids silently).
  std::string decode(const std::vector<std::int64_t>& ids, bool skip_special = false) const;

  // The pre-tokens BPE would merge, as raw bytes: the text normalized and
  // split (steps 2-3 above; added tokens are not cut out). For inspection
  // and for the parity tests, which compare them with the reference's.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  // The id of a vocabulary entry (in its byte-level spelling, e.g. "Ġthe")
  // or of an added token ("<|im_end|>").
  std::optional<std::int64_t> token_id(std::string_view token) const;
  bool is_special(std::int64_t id) const;
  // Whether decode takes this id (vocabulary entry or added token); a model's
  // vocabulary may be larger than its tokenizer's, with ids no text maps to.
  bool has_id(std::int64_t id) const;
  // One past the largest id (vocabulary and added tokens).
  std::int64_t vocab_size() const;

  struct Impl;  // defined in bpe_tokenizer.cpp; immutable after loading

 private:
  explicit BpeTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // shared: copies are cheap and thread-safe
};

// Rust's String::from_utf8_lossy: every maximal invalid UTF-8 subsequence
// becomes one U+FFFD; valid text is unchanged.
std::string utf8_lossy(std::string_view bytes);

}  // namespace moerl::text
