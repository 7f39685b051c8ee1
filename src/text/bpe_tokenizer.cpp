#include "moerl/text/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <mutex>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "bpe_text.h"
#include "moerl/core/error.h"
#include "moerl/core/json_value.h"

namespace moerl::text {

namespace {

// GPT-2's reversible byte <-> character map: printable bytes stand for
// themselves, the other 68 are shifted to U+0100.. so that every token is a
// string of visible characters.
struct ByteLevelAlphabet {
  std::array<std::string, 256> char_of_byte;  // UTF-8 of each byte's character
  std::unordered_map<char32_t, unsigned char> byte_of_char;

  ByteLevelAlphabet() {
    char32_t shifted = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t c = printable ? static_cast<char32_t>(b) : shifted++;
      char_of_byte[b] = utf8_of(c);
      byte_of_char[c] = static_cast<unsigned char>(b);
    }
  }

  static std::string utf8_of(char32_t c) {  // c < U+0800 here
    std::string s;
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else {
      s += static_cast<char>(0xC0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
    return s;
  }

  // The bytes a token stands for, when it is made only of alphabet
  // characters (every token BPE produces is); false otherwise.
  bool bytes_of(const std::string& token, std::string& bytes) const {
    bytes.clear();
    std::size_t at = 0;
    while (at < token.size()) {
      const bpe::Utf8Step step = bpe::utf8_step(token, at);
      if (!step.valid || step.length > 2) return false;
      char32_t c = static_cast<unsigned char>(token[at]);
      if (step.length == 2) c = ((c & 0x1F) << 6) | (static_cast<unsigned char>(token[at + 1]) & 0x3F);
      const auto it = byte_of_char.find(c);
      if (it == byte_of_char.end()) return false;
      bytes += static_cast<char>(it->second);
      at += step.length;
    }
    return true;
  }

  // The reference ByteLevel decoder: a token made only of alphabet characters
  // becomes their bytes; any other token is kept as its own UTF-8.
  std::string decode_token(const std::string& token) const {
    std::string bytes;
    return bytes_of(token, bytes) ? bytes : token;
  }
};

const ByteLevelAlphabet& alphabet() {
  static const ByteLevelAlphabet instance;
  return instance;
}

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false;
};

struct Merge {
  std::int32_t rank = 0;
  std::int32_t id = 0;  // the merged token
};

std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
}

enum class IdKind : std::uint8_t { IdUnused, IdVocab, IdAdded, IdSpecial };

}  // namespace

struct BpeTokenizer::Impl {
  std::string origin;  // the file, for errors

  std::unordered_map<std::string, std::int32_t> token_to_id;  // vocab and added tokens, as spelled in the file
  std::vector<std::string> id_bytes;                          // [vocab_size] what decode writes per id
  std::vector<IdKind> id_kind;                                // [vocab_size]

  std::array<std::int32_t, 256> byte_id{};                // the one-byte token of each byte; -1 if none
  std::unordered_map<std::uint64_t, Merge> merges;        // (left, right) -> rank, merged id
  bool ignore_merges = false;                             // a whole word in the vocab skips the merges
  std::unordered_map<std::string, std::int32_t> word_id;  // raw bytes -> id, for ignore_merges
  std::int32_t unk_id = -1;

  std::vector<AddedToken> added;
  std::array<std::vector<std::int32_t>, 256> added_by_first_byte;  // indices into added, longest first

  bool nfc = false;
  bpe::PreTokenizer pre_tokenizer;

  // Merges of recent pre-tokens. Words repeat (Zipf), so most lookups hit.
  static constexpr std::size_t kCacheEntries = 1 << 16;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache;

  // Calls sink(std::string_view) for each pre-token of a segment without added tokens.
  template <typename Sink>
  void for_each_pre_token(std::string_view text, bpe::MatchScratch& scratch, Sink&& sink) const {
    std::string normalized;
    std::size_t at = 0;
    while (at < text.size()) {
      const std::size_t valid = bpe::valid_utf8_run(text, at);
      if (valid == 0) {  // bytes the reference cannot take: a pre-token of their own
        const std::size_t invalid = bpe::utf8_step(text, at).length;
        sink(text.substr(at, invalid));
        at += invalid;
        continue;
      }
      std::string_view run = text.substr(at, valid);
      if (nfc && bpe::nfc_normalize(run, normalized)) run = normalized;
      pre_tokenizer.run(run, scratch, sink);
      at += valid;
    }
  }
  void encode_segment(std::string_view text, bpe::MatchScratch& scratch, std::vector<std::int64_t>& out) const;
  void encode_word(std::string_view word, std::vector<std::int64_t>& out) const;
  std::vector<std::int32_t> merge_word(std::string_view word) const;
};

// ---------------------------------------------------------------------------
// Loading

namespace {

// Reads tokenizer.json fields, naming the file and the JSON path in errors.
class JsonReader {
 public:
  explicit JsonReader(const std::string& origin) : origin_(origin) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw Error("tokenizer " + origin_ + ": " + path + ": " + what);
  }
  JsonValue member(const JsonValue& object, const std::string& path, const std::string& key) const {
    std::optional<JsonValue> value = object.find(key);
    if (!value) fail(join(path, key), "missing field");
    return std::move(*value);
  }
  std::optional<JsonValue> optional(const JsonValue& object, const std::string& key) const {
    std::optional<JsonValue> value = object.find(key);
    if (value && value->is_null()) return std::nullopt;
    return value;
  }
  const std::string& string(const JsonValue& value, const std::string& path) const {
    expect(value, JsonValue::Kind::String, path);
    return value.as_string();
  }
  bool boolean(const JsonValue& object, const std::string& path, const std::string& key, bool fallback) const {
    const std::optional<JsonValue> value = optional(object, key);
    if (!value) return fallback;
    expect(*value, JsonValue::Kind::Boolean, join(path, key));
    return value->as_bool();
  }
  std::int32_t id(const JsonValue& value, const std::string& path) const {
    expect(value, JsonValue::Kind::Number, path);
    const double number = value.as_number();
    if (!(number >= 0 && number < 2147483647.0) || number != static_cast<double>(static_cast<std::int32_t>(number))) {
      fail(path, "token id " + std::to_string(number) + " is not an integer in [0, 2^31)");
    }
    return static_cast<std::int32_t>(number);
  }
  JsonArray array(const JsonValue& value, const std::string& path) const {
    expect(value, JsonValue::Kind::Array, path);
    return value.as_array();
  }
  std::string type(const JsonValue& object, const std::string& path) const {
    expect(object, JsonValue::Kind::Object, path);
    return string(member(object, path, "type"), join(path, "type"));
  }
  void expect(const JsonValue& value, JsonValue::Kind kind, const std::string& path) const {
    if (value.kind() != kind) {
      fail(path, std::string("expected ") + JsonValue::kind_name(kind) + ", got " + JsonValue::kind_name(value.kind()));
    }
  }
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  static std::string index(const std::string& path, std::size_t i) { return path + "[" + std::to_string(i) + "]"; }
  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
};

void set_id(BpeTokenizer::Impl& impl, const JsonReader& json, const std::string& path, std::int32_t id,
            const std::string& token, IdKind kind) {
  if (static_cast<std::size_t>(id) >= impl.id_kind.size()) {
    impl.id_kind.resize(static_cast<std::size_t>(id) + 1, IdKind::IdUnused);
    impl.id_bytes.resize(static_cast<std::size_t>(id) + 1);
  }
  const auto [it, inserted] = impl.token_to_id.emplace(token, id);
  if (!inserted && it->second != id) {
    json.fail(path, "token '" + token + "' has id " + std::to_string(id) + " but already had id " +
                        std::to_string(it->second));
  }
  if (impl.id_kind[id] == IdKind::IdVocab && kind != IdKind::IdVocab &&
      impl.id_bytes[id] != alphabet().decode_token(token)) {
    json.fail(path, "added token '" + token + "' reuses id " + std::to_string(id) + " of another vocabulary token");
  }
  if (impl.id_kind[id] == IdKind::IdVocab && kind == IdKind::IdVocab) {
    json.fail(path, "id " + std::to_string(id) + " is given to two tokens");
  }
  impl.id_kind[id] = kind;
  impl.id_bytes[id] = alphabet().decode_token(token);
}

void load_model(BpeTokenizer::Impl& impl, const JsonReader& json, const JsonValue& root) {
  const JsonValue model = json.member(root, "", "model");
  json.expect(model, JsonValue::Kind::Object, "model");
  if (const std::optional<JsonValue> type = json.optional(model, "type")) {
    if (json.string(*type, "model.type") != "BPE")
      json.fail("model.type", "'" + type->as_string() + "' is not supported (only BPE)");
  }
  if (const std::optional<JsonValue> dropout = json.optional(model, "dropout")) {
    json.expect(*dropout, JsonValue::Kind::Number, "model.dropout");
    if (dropout->as_number() != 0)
      json.fail("model.dropout", "BPE dropout is not supported (it makes encoding random)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const std::optional<JsonValue> affix = json.optional(model, key)) {
      if (!json.string(*affix, JsonReader::join("model", key)).empty()) {
        json.fail(JsonReader::join("model", key), "subword affixes are not supported in byte-level BPE");
      }
    }
  }
  if (json.boolean(model, "model", "byte_fallback", false))
    json.fail("model.byte_fallback", "byte fallback is not supported");
  impl.ignore_merges = json.boolean(model, "model", "ignore_merges", false);

  const JsonValue vocab = json.member(model, "model", "vocab");
  json.expect(vocab, JsonValue::Kind::Object, "model.vocab");
  for (const auto& [token, value] : vocab.as_object()) {
    const std::string path = "model.vocab[\"" + token + "\"]";
    const std::int32_t id = json.id(value, path);
    set_id(impl, json, path, id, token, IdKind::IdVocab);
    std::string bytes;
    if (impl.ignore_merges && alphabet().bytes_of(token, bytes)) impl.word_id.emplace(bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = impl.token_to_id.find(alphabet().char_of_byte[b]);
    if (it != impl.token_to_id.end()) impl.byte_id[b] = it->second;
  }
  if (const std::optional<JsonValue> unk = json.optional(model, "unk_token")) {
    const auto it = impl.token_to_id.find(json.string(*unk, "model.unk_token"));
    if (it == impl.token_to_id.end()) json.fail("model.unk_token", "'" + unk->as_string() + "' is not in model.vocab");
    impl.unk_id = it->second;
  }

  const JsonArray merges = json.array(json.member(model, "model", "merges"), "model.merges");
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string path = JsonReader::index("model.merges", rank);
    std::string left, right;
    const JsonValue merge = merges[rank];
    if (merge.kind() == JsonValue::Kind::String) {  // "a b" (tokenizers < 0.20)
      const std::string& line = merge.as_string();
      const std::size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        json.fail(path, "expected two tokens separated by one space, got '" + line + "'");
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else {  // ["a", "b"]
      const JsonArray pair = json.array(merge, path);
      if (pair.size() != 2) json.fail(path, "expected a pair of tokens, got " + std::to_string(pair.size()));
      left = json.string(pair[0], JsonReader::index(path, 0));
      right = json.string(pair[1], JsonReader::index(path, 1));
    }
    const auto id_of = [&](const std::string& token) {
      const auto it = impl.token_to_id.find(token);
      if (it == impl.token_to_id.end()) json.fail(path, "token '" + token + "' is not in model.vocab");
      return it->second;
    };
    // Like the reference, a repeated pair keeps its last rank.
    impl.merges[pair_key(id_of(left), id_of(right))] = Merge{static_cast<std::int32_t>(rank), id_of(left + right)};
  }
}

void load_added_tokens(BpeTokenizer::Impl& impl, const JsonReader& json, const JsonValue& root) {
  const std::optional<JsonValue> added = json.optional(root, "added_tokens");
  if (!added) return;
  const JsonArray entries = json.array(*added, "added_tokens");
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::string path = JsonReader::index("added_tokens", i);
    const JsonValue entry = entries[i];
    json.expect(entry, JsonValue::Kind::Object, path);
    AddedToken token;
    token.id = json.id(json.member(entry, path, "id"), JsonReader::join(path, "id"));
    token.content = json.string(json.member(entry, path, "content"), JsonReader::join(path, "content"));
    token.special = json.boolean(entry, path, "special", false);
    if (token.content.empty()) json.fail(JsonReader::join(path, "content"), "an added token cannot be empty");
    for (const char* option : {"single_word", "lstrip", "rstrip"}) {
      if (json.boolean(entry, path, option, false)) {
        json.fail(JsonReader::join(path, option), "true is not supported (only exact matches of added tokens)");
      }
    }
    set_id(impl, json, path, token.id, token.content, token.special ? IdKind::IdSpecial : IdKind::IdAdded);
    impl.added.push_back(token);
  }
  for (std::size_t i = 0; i < impl.added.size(); ++i) {
    impl.added_by_first_byte[static_cast<unsigned char>(impl.added[i].content[0])].push_back(
        static_cast<std::int32_t>(i));
  }
  for (auto& candidates : impl.added_by_first_byte) {
    std::stable_sort(candidates.begin(), candidates.end(), [&](std::int32_t a, std::int32_t b) {
      return impl.added[a].content.size() > impl.added[b].content.size();
    });
  }
}

void load_normalizer(BpeTokenizer::Impl& impl, const JsonReader& json, const JsonValue& node, const std::string& path) {
  const std::string type = json.type(node, path);
  if (type == "NFC") {
    impl.nfc = true;
  } else if (type == "Sequence") {
    const std::string list = JsonReader::join(path, "normalizers");
    const JsonArray steps = json.array(json.member(node, path, "normalizers"), list);
    for (std::size_t i = 0; i < steps.size(); ++i) load_normalizer(impl, json, steps[i], JsonReader::index(list, i));
  } else {
    json.fail(JsonReader::join(path, "type"), "normalizer '" + type + "' is not supported (supported: NFC, none)");
  }
}

std::unique_ptr<bpe::Regex> split_regex(const JsonReader& json, const JsonValue& split, const std::string& path) {
  const std::string pattern_path = JsonReader::join(path, "pattern");
  const JsonValue pattern = json.member(split, path, "pattern");
  json.expect(pattern, JsonValue::Kind::Object, pattern_path);
  const std::string where = "tokenizer " + json.origin() + ": " + pattern_path;
  if (const std::optional<JsonValue> regex = pattern.find("Regex")) {
    return std::make_unique<bpe::Regex>(json.string(*regex, JsonReader::join(pattern_path, "Regex")), where);
  }
  if (const std::optional<JsonValue> literal = pattern.find("String")) {
    const std::string& text = json.string(*literal, JsonReader::join(pattern_path, "String"));
    return std::make_unique<bpe::Regex>("\\Q" + text + "\\E", where);
  }
  json.fail(pattern_path, "expected {\"Regex\": ...} or {\"String\": ...}");
}

void load_pre_tokenizer(BpeTokenizer::Impl& impl, const JsonReader& json, const JsonValue& root) {
  const std::optional<JsonValue> node = json.optional(root, "pre_tokenizer");
  if (!node) json.fail("pre_tokenizer", "missing: a byte-level BPE tokenizer needs a ByteLevel pre-tokenizer");
  std::vector<std::pair<JsonValue, std::string>> steps;
  if (json.type(*node, "pre_tokenizer") == "Sequence") {
    const JsonArray list =
        json.array(json.member(*node, "pre_tokenizer", "pretokenizers"), "pre_tokenizer.pretokenizers");
    for (std::size_t i = 0; i < list.size(); ++i)
      steps.emplace_back(list[i], JsonReader::index("pre_tokenizer.pretokenizers", i));
  } else {
    steps.emplace_back(*node, "pre_tokenizer");
  }
  // Supported: Split* then one ByteLevel, the layout of GPT-2, Qwen2 and Llama-3.
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const auto& [step, path] = steps[i];
    const std::string type = json.type(step, path);
    const bool last = i + 1 == steps.size();
    if (type == "Split" && !last) {
      if (json.boolean(step, path, "invert", false))
        json.fail(JsonReader::join(path, "invert"), "true is not supported");
      const std::string behavior = json.string(json.member(step, path, "behavior"), JsonReader::join(path, "behavior"));
      bpe::PreTokenizer::SplitBehavior mode = bpe::PreTokenizer::SplitBehavior::SplitIsolated;
      if (behavior == "Removed") {
        mode = bpe::PreTokenizer::SplitBehavior::SplitRemoved;
      } else if (behavior != "Isolated") {
        json.fail(JsonReader::join(path, "behavior"),
                  "'" + behavior + "' is not supported (supported: Isolated, Removed)");
      }
      impl.pre_tokenizer.add_split(split_regex(json, step, path), mode);
    } else if (type == "ByteLevel" && last) {
      std::unique_ptr<bpe::Regex> gpt2;
      if (json.boolean(step, path, "use_regex", true)) {
        gpt2 = std::make_unique<bpe::Regex>(bpe::kGpt2SplitPattern, "the GPT-2 pattern of " + path);
      }
      impl.pre_tokenizer.set_byte_level(json.boolean(step, path, "add_prefix_space", true), std::move(gpt2));
    } else {
      json.fail(JsonReader::join(path, "type"),
                "'" + type + "' is not supported here (supported: Split steps followed by one ByteLevel)");
    }
  }
}

void check_decoder(const JsonReader& json, const JsonValue& root) {
  const std::optional<JsonValue> node = json.optional(root, "decoder");
  if (!node) json.fail("decoder", "missing: a byte-level BPE tokenizer needs the ByteLevel decoder");
  const std::string type = json.type(*node, "decoder");
  if (type != "ByteLevel") json.fail("decoder.type", "'" + type + "' is not supported (only ByteLevel)");
}

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error("tokenizer " + path + ": cannot open the file");
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) throw Error("tokenizer " + path + ": reading the file failed");
  return text.str();
}

}  // namespace

BpeTokenizer BpeTokenizer::from_file(const std::string& path) { return from_json(read_file(path), path); }

BpeTokenizer BpeTokenizer::from_json(const std::string& json_text, const std::string& origin) {
  JsonValue root;
  try {
    root = JsonValue::parse(json_text);
  } catch (const JsonError& error) {
    throw Error("tokenizer " + origin + ": " + error.what());
  }
  const JsonReader json(origin);
  json.expect(root, JsonValue::Kind::Object, "(document)");
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;
  impl->byte_id.fill(-1);
  load_model(*impl, json, root);
  load_added_tokens(*impl, json, root);
  if (const std::optional<JsonValue> normalizer = json.optional(root, "normalizer"))
    load_normalizer(*impl, json, *normalizer, "normalizer");
  load_pre_tokenizer(*impl, json, root);
  check_decoder(json, root);
  return BpeTokenizer(std::move(impl));
}

// ---------------------------------------------------------------------------
// Encoding

std::vector<std::int64_t> BpeTokenizer::encode(std::string_view text, bool allow_special) const {
  const Impl& impl = *impl_;
  std::vector<std::int64_t> ids;
  ids.reserve(text.size() / 3 + 4);
  bpe::MatchScratch scratch;
  // Added tokens first: leftmost match, longest at a position.
  std::size_t segment = 0;
  std::size_t at = 0;
  while (at < text.size()) {
    const AddedToken* match = nullptr;
    for (const std::int32_t index : impl.added_by_first_byte[static_cast<unsigned char>(text[at])]) {
      const AddedToken& token = impl.added[index];
      if ((allow_special || !token.special) && text.compare(at, token.content.size(), token.content) == 0) {
        match = &token;
        break;
      }
    }
    if (match == nullptr) {
      ++at;
      continue;
    }
    impl.encode_segment(text.substr(segment, at - segment), scratch, ids);
    ids.push_back(match->id);
    at += match->content.size();
    segment = at;
  }
  impl.encode_segment(text.substr(segment), scratch, ids);
  return ids;
}

std::vector<std::string> BpeTokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> pieces;
  bpe::MatchScratch scratch;
  impl_->for_each_pre_token(text, scratch, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

void BpeTokenizer::Impl::encode_segment(std::string_view text, bpe::MatchScratch& scratch,
                                        std::vector<std::int64_t>& out) const {
  for_each_pre_token(text, scratch, [&](std::string_view word) { encode_word(word, out); });
}

void BpeTokenizer::Impl::encode_word(std::string_view word, std::vector<std::int64_t>& out) const {
  std::string key(word);
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    const auto it = cache.find(key);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<std::int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (cache.size() >= kCacheEntries) cache.clear();  // bounded; a rebuild costs one miss per word
  cache.emplace(std::move(key), std::move(ids));
}

std::vector<std::int32_t> BpeTokenizer::Impl::merge_word(std::string_view word) const {
  if (ignore_merges) {
    const auto whole = word_id.find(std::string(word));
    if (whole != word_id.end()) return {whole->second};
  }
  // Symbols form a linked list over the word's bytes; a merge joins a symbol
  // with its right neighbour. As in the reference, the pair of lowest rank
  // merges first, the leftmost among equals.
  struct Symbol {
    std::int32_t id;
    std::int32_t prev;
    std::int32_t next;
  };
  const auto n = static_cast<std::int32_t>(word.size());
  std::vector<Symbol> symbols(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) {
    std::int32_t id = byte_id[static_cast<unsigned char>(word[i])];
    if (id < 0) id = unk_id;
    if (id < 0) {
      throw Error("tokenizer " + origin + ": byte 0x" + "0123456789abcdef"[(word[i] >> 4) & 0xF] +
                  "0123456789abcdef"[word[i] & 0xF] + " has no token in model.vocab and there is no unk_token");
    }
    symbols[i] = {id, i - 1, i + 1 < n ? i + 1 : -1};
  }
  struct Candidate {
    std::int32_t rank, pos, left, right, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto consider = [&](std::int32_t pos) {
    if (pos < 0 || symbols[pos].next < 0) return;
    const std::int32_t left = symbols[pos].id, right = symbols[symbols[pos].next].id;
    const auto it = merges.find(pair_key(left, right));
    if (it != merges.end()) queue.push({it->second.rank, pos, left, right, it->second.id});
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    // Stale when either side has merged since: merged tokens are longer, so ids never repeat.
    if (left.id != top.left || left.next < 0 || symbols[left.next].id != top.right) continue;
    const std::int32_t gone = left.next;
    left.id = top.merged;
    left.next = symbols[gone].next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    symbols[gone].id = -1;
    consider(left.prev);
    consider(top.pos);
  }
  std::vector<std::int32_t> ids;
  for (std::int32_t i = n > 0 ? 0 : -1; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
  return ids;
}

// ---------------------------------------------------------------------------
// Decoding and lookups

std::string BpeTokenizer::decode(const std::vector<std::int64_t>& ids, bool skip_special) const {
  const Impl& impl = *impl_;
  std::string out;
  out.reserve(ids.size() * 4);
  for (const std::int64_t id : ids) {
    const bool known = id >= 0 && id < vocab_size() && impl.id_kind[id] != IdKind::IdUnused;
    if (!known) {
      throw Error("tokenizer " + impl.origin + ": token id " + std::to_string(id) +
                  " is neither in the vocabulary nor an added token (vocab_size " + std::to_string(vocab_size()) + ")");
    }
    if (skip_special && impl.id_kind[id] == IdKind::IdSpecial) continue;
    out += impl.id_bytes[id];
  }
  return out;
}

std::optional<std::int64_t> BpeTokenizer::token_id(std::string_view token) const {
  const auto it = impl_->token_to_id.find(std::string(token));
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

bool BpeTokenizer::is_special(std::int64_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_kind[id] == IdKind::IdSpecial;
}

bool BpeTokenizer::has_id(std::int64_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_kind[id] != IdKind::IdUnused;
}

std::int64_t BpeTokenizer::vocab_size() const { return static_cast<std::int64_t>(impl_->id_kind.size()); }

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  std::size_t at = 0;
  while (at < bytes.size()) {
    const bpe::Utf8Step step = bpe::utf8_step(bytes, at);
    if (step.valid) {
      out.append(bytes.substr(at, step.length));
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
    }
    at += step.length;
  }
  return out;
}

}  // namespace moerl::text
