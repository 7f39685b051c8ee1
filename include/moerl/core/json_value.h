#pragma once
// A parsed JSON value and a strict parser for it (RFC 8259: objects, arrays,
// strings with escapes including \uXXXX surrogate pairs, numbers, true,
// false, null). Used to read the external-environment protocol and
// benchmark results; not built for megabyte documents.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moerl/core/error.h"

namespace moerl {

class JsonError : public Error {
 public:
  using Error::Error;
};

// Strict RFC 8259 numbers, or also the NaN, Infinity and -Infinity that
// Python's json module writes by default (so that an environment's non-finite
// reward is reported as such, not as unparsable text).
enum class JsonNumbers { JsonNumbersStrict, JsonNumbersPythonNonFinite };

class JsonValue {
 public:
  enum class Kind { Null, Boolean, Number, String, Array, Object };

  JsonValue() = default;
  // Throws JsonError with the offset.
  static JsonValue parse(const std::string& text, JsonNumbers numbers = JsonNumbers::JsonNumbersStrict);

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_object() const { return kind_ == Kind::Object; }

  // Typed access; throw JsonError naming the expected kind.
  bool as_bool() const;
  double as_number() const;
  const std::string& as_string() const;
  const std::vector<JsonValue>& as_array() const;
  const std::map<std::string, JsonValue>& as_object() const;

  // Object member or nullptr.
  const JsonValue* find(const std::string& key) const;
  // Object member; throws JsonError "missing field 'key'".
  const JsonValue& at(const std::string& key) const;

  static const char* kind_name(Kind kind);

 private:
  friend class JsonParser;
  Kind kind_ = Kind::Null;
  bool boolean_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<JsonValue> array_;
  std::map<std::string, JsonValue> object_;
};

}  // namespace moerl
