#include "moerl/core/json_value.h"

#include <cmath>
#include <cstdlib>

namespace moerl {

class JsonParser {
 public:
  JsonParser(const std::string& text, bool python_non_finite) : text_(text), python_non_finite_(python_non_finite) {}

  JsonValue document() {
    JsonValue value = parse_value(0);
    skip_space();
    if (at_ < text_.size()) fail("unexpected text after the value");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;  // bounds recursion on hostile input

  [[noreturn]] void fail(const std::string& what) const {
    throw JsonError("invalid JSON at offset " + std::to_string(at_) + ": " + what);
  }
  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r')) ++at_;
  }
  bool consume(const char* literal) {
    const std::string word(literal);
    if (text_.compare(at_, word.size(), word) != 0) return false;
    at_ += word.size();
    return true;
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 64 levels");
    skip_space();
    if (at_ >= text_.size()) fail("unexpected end of input");
    JsonValue v;
    const char c = text_[at_];
    if (c == '{') {
      v.kind_ = JsonValue::Kind::Object;
      ++at_;
      skip_space();
      if (at_ < text_.size() && text_[at_] == '}') {
        ++at_;
        return v;
      }
      for (;;) {
        skip_space();
        if (at_ >= text_.size() || text_[at_] != '"') fail("expected a string key");
        std::string key = parse_string();
        skip_space();
        if (at_ >= text_.size() || text_[at_] != ':') fail("expected ':'");
        ++at_;
        v.object_[key] = parse_value(depth + 1);
        skip_space();
        if (at_ < text_.size() && text_[at_] == ',') {
          ++at_;
          continue;
        }
        if (at_ < text_.size() && text_[at_] == '}') {
          ++at_;
          return v;
        }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind_ = JsonValue::Kind::Array;
      ++at_;
      skip_space();
      if (at_ < text_.size() && text_[at_] == ']') {
        ++at_;
        return v;
      }
      for (;;) {
        v.array_.push_back(parse_value(depth + 1));
        skip_space();
        if (at_ < text_.size() && text_[at_] == ',') {
          ++at_;
          continue;
        }
        if (at_ < text_.size() && text_[at_] == ']') {
          ++at_;
          return v;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind_ = JsonValue::Kind::String;
      v.string_ = parse_string();
      return v;
    }
    if (consume("true")) {
      v.kind_ = JsonValue::Kind::Boolean;
      v.boolean_ = true;
      return v;
    }
    if (consume("false")) {
      v.kind_ = JsonValue::Kind::Boolean;
      return v;
    }
    if (consume("null")) return v;
    if (python_non_finite_ && (consume("NaN") || consume("Infinity") || consume("-Infinity"))) {
      v.kind_ = JsonValue::Kind::Number;
      const char last = text_[at_ - 1];
      v.number_ = last == 'N' ? std::nan("") : (c == '-' ? -HUGE_VAL : HUGE_VAL);
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind_ = JsonValue::Kind::Number;
      v.number_ = parse_number();
      return v;
    }
    fail(std::string("unexpected character '") + c + "'");
  }

  double parse_number() {
    const size_t start = at_;
    if (text_[at_] == '-') ++at_;
    auto digits = [this] {
      const size_t from = at_;
      while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
      return at_ - from;
    };
    if (digits() == 0) fail("expected digits");
    if (at_ < text_.size() && text_[at_] == '.') {
      ++at_;
      if (digits() == 0) fail("expected digits after '.'");
    }
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      if (digits() == 0) fail("expected exponent digits");
    }
    return std::strtod(text_.substr(start, at_ - start).c_str(), nullptr);
  }

  unsigned parse_hex4() {
    if (at_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned value = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[at_++];
      value <<= 4;
      if (h >= '0' && h <= '9') value |= h - '0';
      else if (h >= 'a' && h <= 'f') value |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') value |= h - 'A' + 10;
      else fail("bad hex digit in \\u escape");
    }
    return value;
  }

  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  std::string parse_string() {
    ++at_;  // opening quote
    std::string out;
    for (;;) {
      if (at_ >= text_.size()) fail("unterminated string");
      const char c = text_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) fail("unterminated escape");
      const char e = text_[at_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned code = parse_hex4();
          if (code >= 0xD800 && code <= 0xDBFF) {
            if (!consume("\\u")) fail("unpaired surrogate");
            const unsigned low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("bad low surrogate");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          } else if (code >= 0xDC00 && code <= 0xDFFF) {
            fail("unpaired surrogate");
          }
          append_utf8(out, code);
          break;
        }
        default: fail(std::string("unknown escape \\") + e);
      }
    }
  }

  const std::string& text_;
  bool python_non_finite_ = false;
  size_t at_ = 0;
};

JsonValue JsonValue::parse(const std::string& text, JsonNumbers numbers) {
  return JsonParser(text, numbers == JsonNumbers::JsonNumbersPythonNonFinite).document();
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

namespace {
[[noreturn]] void wrong_kind(JsonValue::Kind want, JsonValue::Kind got) {
  throw JsonError(std::string("expected ") + JsonValue::kind_name(want) + ", got " + JsonValue::kind_name(got));
}
}  // namespace

bool JsonValue::as_bool() const {
  if (kind_ != Kind::Boolean) wrong_kind(Kind::Boolean, kind_);
  return boolean_;
}
double JsonValue::as_number() const {
  if (kind_ != Kind::Number) wrong_kind(Kind::Number, kind_);
  return number_;
}
const std::string& JsonValue::as_string() const {
  if (kind_ != Kind::String) wrong_kind(Kind::String, kind_);
  return string_;
}
const std::vector<JsonValue>& JsonValue::as_array() const {
  if (kind_ != Kind::Array) wrong_kind(Kind::Array, kind_);
  return array_;
}
const std::map<std::string, JsonValue>& JsonValue::as_object() const {
  if (kind_ != Kind::Object) wrong_kind(Kind::Object, kind_);
  return object_;
}

const JsonValue* JsonValue::find(const std::string& key) const {
  if (kind_ != Kind::Object) return nullptr;
  const auto it = object_.find(key);
  return it == object_.end() ? nullptr : &it->second;
}

const JsonValue& JsonValue::at(const std::string& key) const {
  const JsonValue* value = find(key);
  if (value == nullptr) throw JsonError("missing field '" + key + "'");
  return *value;
}

}  // namespace moerl
