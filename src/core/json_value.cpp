#include "moerl/core/json_value.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace moerl {

using nlohmann::json;

namespace {

constexpr std::size_t kMaxDepth = 64;  // bounds what hostile input makes the code that walks it do

// A non-finite number that nlohmann refuses (Python's NaN, Infinity and
// -Infinity; a number beyond the range of a double) is parsed again as one of
// these strings, which the DOM builder turns back into the number. The NUL
// keeps them apart from any text a program means to send.
const std::string kNanSentinel = std::string(1, '\0') + "moerl:NaN";
const std::string kInfinitySentinel = std::string(1, '\0') + "moerl:Infinity";
const std::string kMinusInfinitySentinel = std::string(1, '\0') + "moerl:-Infinity";

std::string quoted(const std::string& sentinel) { return json(sentinel).dump(); }

std::optional<double> sentinel_number(const std::string& text) {
  if (text.empty() || text[0] != '\0') return std::nullopt;
  if (text == kNanSentinel) return std::nan("");
  if (text == kInfinitySentinel) return HUGE_VAL;
  if (text == kMinusInfinitySentinel) return -HUGE_VAL;
  return std::nullopt;
}

// Why a parse stopped: nlohmann's position (bytes read, the offending one
// included; 0 when unknown) and its message without the "[json.exception...]
// parse error at line L, column C: " prefix.
struct Fault {
  std::size_t position = 0;
  int id = 0;
  std::string last_token;
  std::string description;
};

// Builds the document from nlohmann's SAX events (what json::parse does, plus
// the depth bound, the sentinels and keeping the fault's position).
class DomBuilder final : public nlohmann::json_sax<json> {
 public:
  explicit DomBuilder(bool sentinels) : sentinels_(sentinels) {}

  bool null() override { return insert(json(nullptr)) != nullptr; }
  bool boolean(bool value) override { return insert(json(value)) != nullptr; }
  bool number_integer(number_integer_t value) override { return insert(json(value)) != nullptr; }
  bool number_unsigned(number_unsigned_t value) override { return insert(json(value)) != nullptr; }
  bool number_float(number_float_t value, const string_t& /*text*/) override { return insert(json(value)) != nullptr; }
  bool string(string_t& value) override {
    if (sentinels_) {
      if (const std::optional<double> number = sentinel_number(value)) return insert(json(*number)) != nullptr;
    }
    return insert(json(std::move(value))) != nullptr;
  }
  bool binary(binary_t& /*value*/) override { return false; }  // not produced by JSON text
  bool start_object(std::size_t /*elements*/) override { return open(json::value_t::object); }
  bool key(string_t& key) override {
    key_ = std::move(key);
    return true;
  }
  bool end_object() override {
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*elements*/) override { return open(json::value_t::array); }
  bool end_array() override {
    open_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string& last_token, const json::exception& error) override {
    const std::string what = error.what();
    const std::size_t colon = what.find(": ");
    fault_ = Fault{position, error.id, last_token, colon == std::string::npos ? what : what.substr(colon + 2)};
    return false;
  }

  json take() { return std::move(root_); }
  const Fault& fault() const { return fault_; }

 private:
  json* insert(json&& value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      auto& elements = parent.get_ref<json::array_t&>();
      elements.push_back(std::move(value));
      return &elements.back();
    }
    json& member = parent.get_ref<json::object_t&>()[key_];  // a repeated key keeps its last value
    member = std::move(value);
    return &member;
  }
  bool open(json::value_t type) {
    if (open_.size() >= kMaxDepth) {
      fault_ = Fault{0, 0, "", "nesting deeper than " + std::to_string(kMaxDepth) + " levels"};
      return false;
    }
    // Only the innermost open container grows, so the pointers to the outer ones stay valid.
    open_.push_back(insert(json(type)));
    return true;
  }

  bool sentinels_;
  json root_;
  std::vector<json*> open_;
  std::string key_;
  Fault fault_;
};

// The token to parse again as a sentinel string, when `fault` is a number
// nlohmann refuses but moerl reads: one beyond the range of a double (as
// strtod does, +-infinity), or with `python`, NaN/Infinity/-Infinity in place of a value.
struct Rewrite {
  std::size_t start = 0;
  std::size_t length = 0;
  const std::string* sentinel = nullptr;
};

std::optional<Rewrite> non_finite_token(const std::string& text, const Fault& fault, bool python) {
  constexpr int kNumberOverflow = 406;  // out_of_range.406: the position is just past the number
  constexpr int kSyntaxError = 101;     // parse_error.101: the position is just past the offending byte
  if (fault.id == kNumberOverflow) {
    const std::string& token = fault.last_token;
    if (token.empty() || fault.position < token.size()) return std::nullopt;
    const std::size_t start = fault.position - token.size();
    if (text.compare(start, token.size(), token) != 0) return std::nullopt;
    return Rewrite{start, token.size(), token[0] == '-' ? &kMinusInfinitySentinel : &kInfinitySentinel};
  }
  if (!python || fault.id != kSyntaxError || fault.position == 0 ||
      fault.description.rfind("syntax error while parsing value - ", 0) != 0) {
    return std::nullopt;
  }
  const std::size_t at = fault.position - 1;
  if (text.compare(at, 3, "NaN") == 0) return Rewrite{at, 3, &kNanSentinel};
  if (text.compare(at, 8, "Infinity") == 0) {
    if (at > 0 && text[at - 1] == '-') return Rewrite{at - 1, 9, &kMinusInfinitySentinel};
    return Rewrite{at, 8, &kInfinitySentinel};
  }
  return std::nullopt;
}

[[noreturn]] void fail(const std::string& text, std::size_t offset, const Fault& fault) {
  if (fault.position == 0) throw JsonError("invalid JSON: " + fault.description);
  offset = std::min(offset, text.size());
  const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(offset), '\n');
  const std::size_t line_start = offset == 0 ? std::string::npos : text.rfind('\n', offset - 1);
  const std::size_t column = line_start == std::string::npos ? offset + 1 : offset - line_start;
  throw JsonError("invalid JSON at offset " + std::to_string(offset) + " (line " + std::to_string(line) + ", column " +
                  std::to_string(column) + "): " + fault.description);
}

[[noreturn]] void wrong_kind(JsonValue::Kind want, JsonValue::Kind got) {
  throw JsonError(std::string("expected ") + JsonValue::kind_name(want) + ", got " + JsonValue::kind_name(got));
}

}  // namespace

JsonValue JsonValue::parse(const std::string& text, JsonNumbers numbers) {
  const bool python = numbers == JsonNumbers::JsonNumbersPythonNonFinite;
  // After a rewrite, `patched` is parsed; `changes` says where it differs from
  // `text`, so that an error's offset names a byte of `text`.
  struct Change {
    std::size_t start;      // in `patched`
    std::size_t length;     // of the replacement there
    std::ptrdiff_t growth;  // bytes the replacement added
  };
  std::string patched;
  std::vector<Change> changes;
  for (;;) {
    const std::string& input = changes.empty() ? text : patched;
    DomBuilder builder(!changes.empty());
    if (json::sax_parse(input, &builder)) return JsonValue(std::make_shared<const json>(builder.take()));
    const Fault& fault = builder.fault();
    if (const std::optional<Rewrite> rewrite = non_finite_token(input, fault, python)) {
      const std::string replacement = quoted(*rewrite->sentinel);
      patched = input.substr(0, rewrite->start) + replacement + input.substr(rewrite->start + rewrite->length);
      changes.push_back(
          {rewrite->start, replacement.size(),
           static_cast<std::ptrdiff_t>(replacement.size()) - static_cast<std::ptrdiff_t>(rewrite->length)});
      continue;
    }
    // The byte at which nlohmann stopped, in `text` (each later change is past the earlier ones).
    std::size_t offset = fault.position == 0 ? 0 : fault.position - 1;
    for (auto it = changes.rbegin(); it != changes.rend(); ++it) {
      if (offset >= it->start + it->length) {
        offset = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(offset) - it->growth);
      } else if (offset > it->start) {
        offset = it->start;
      }
    }
    fail(text, offset, fault);
  }
}

JsonValue::Kind JsonValue::kind() const {
  if (!node_) return Kind::Null;
  switch (node_->type()) {
    case json::value_t::boolean: return Kind::Boolean;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return Kind::Number;
    case json::value_t::string: return Kind::String;
    case json::value_t::array: return Kind::Array;
    case json::value_t::object: return Kind::Object;
    default: return Kind::Null;  // null (binary and discarded values are not built)
  }
}

const char* JsonValue::kind_name(Kind kind) {
  switch (kind) {
    case Kind::Null: return "null";
    case Kind::Boolean: return "a boolean";
    case Kind::Number: return "a number";
    case Kind::String: return "a string";
    case Kind::Array: return "an array";
    case Kind::Object: return "an object";
  }
  return "unknown";
}

bool JsonValue::as_bool() const {
  if (kind() != Kind::Boolean) wrong_kind(Kind::Boolean, kind());
  return node_->get<bool>();
}

double JsonValue::as_number() const {
  if (kind() != Kind::Number) wrong_kind(Kind::Number, kind());
  return node_->get<double>();
}

const std::string& JsonValue::as_string() const {
  if (kind() != Kind::String) wrong_kind(Kind::String, kind());
  return node_->get_ref<const std::string&>();
}

JsonArray JsonValue::as_array() const {
  if (kind() != Kind::Array) wrong_kind(Kind::Array, kind());
  return JsonArray(node_, node_->size());
}

JsonObject JsonValue::as_object() const {
  if (kind() != Kind::Object) wrong_kind(Kind::Object, kind());
  const auto& object = node_->get_ref<const json::object_t&>();
  std::vector<JsonObject::Member> members;
  members.reserve(object.size());
  for (const auto& [key, value] : object) members.emplace_back(&key, &value);
  return JsonObject(node_, std::move(members));
}

std::optional<JsonValue> JsonValue::find(const std::string& key) const {
  if (kind() != Kind::Object) return std::nullopt;
  const auto& object = node_->get_ref<const json::object_t&>();
  const auto it = object.find(key);
  if (it == object.end()) return std::nullopt;
  return JsonValue(std::shared_ptr<const json>(node_, &it->second));
}

JsonValue JsonValue::at(const std::string& key) const {
  std::optional<JsonValue> value = find(key);
  if (!value) throw JsonError("missing field '" + key + "'");
  return std::move(*value);
}

JsonValue JsonArray::operator[](std::size_t index) const {
  if (index >= size_) {
    throw JsonError("index " + std::to_string(index) + " past the end of an array of " + std::to_string(size_));
  }
  return JsonValue(std::shared_ptr<const json>(array_, &(*array_)[index]));
}

std::pair<const std::string&, JsonValue> JsonObject::element(std::size_t index) const {
  const auto& [key, value] = members_[index];
  return {*key, JsonValue(std::shared_ptr<const json>(document_, value))};
}

}  // namespace moerl
