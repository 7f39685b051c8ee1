#pragma once
// Reading JSON: moerl's small typed API over nlohmann-json (Debian's
// nlohmann-json3-dev), which does the parsing. What moerl adds: errors as
// JsonError with moerl's messages ("missing field 'reward'", "expected a
// string, got a number", "invalid JSON at offset 7 (line 1, column 8): ..."),
// nesting bounded to 64 levels, numbers too large for a double read as
// +-infinity (as strtod reads them), and optionally Python's NaN/Infinity.
//
// A JsonValue is a cheap handle into a parsed document: copies, members and
// elements share the document, which lives while any handle to it does.
// Objects iterate in key order; a repeated key keeps its last value.
// nlohmann's header stays out of this one (only its forward declarations).

#include <cstddef>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

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

class JsonArray;
class JsonObject;

class JsonValue {
 public:
  enum class Kind { Null, Boolean, Number, String, Array, Object };

  JsonValue() = default;  // null
  // Throws JsonError with the offset, line and column of the fault.
  static JsonValue parse(const std::string& text, JsonNumbers numbers = JsonNumbers::JsonNumbersStrict);

  Kind kind() const;
  bool is_null() const { return kind() == Kind::Null; }
  bool is_object() const { return kind() == Kind::Object; }

  // Typed access; throw JsonError naming the expected kind. References stay
  // valid while the document lives.
  bool as_bool() const;
  double as_number() const;
  const std::string& as_string() const;
  JsonArray as_array() const;
  JsonObject as_object() const;

  // Object member, or nullopt (also when this is not an object).
  std::optional<JsonValue> find(const std::string& key) const;
  // Object member; throws JsonError "missing field 'key'".
  JsonValue at(const std::string& key) const;

  static const char* kind_name(Kind kind);

 private:
  friend class JsonArray;
  friend class JsonObject;
  explicit JsonValue(std::shared_ptr<const nlohmann::json> node) : node_(std::move(node)) {}
  // Shares ownership of the whole document and points at this value in it;
  // empty for a default-constructed (null) value.
  std::shared_ptr<const nlohmann::json> node_;
};

// An input iterator over a view that hands out its elements by index: an
// array's values, an object's (key, value) pairs.
template <class View, class Element>
class JsonIndexIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = Element;
  using difference_type = std::ptrdiff_t;
  using pointer = void;
  using reference = Element;
  JsonIndexIterator(const View* view, std::size_t index) : view_(view), index_(index) {}
  Element operator*() const { return view_->element(index_); }
  JsonIndexIterator& operator++() {
    ++index_;
    return *this;
  }
  bool operator==(const JsonIndexIterator& other) const { return index_ == other.index_; }
  bool operator!=(const JsonIndexIterator& other) const { return index_ != other.index_; }

 private:
  const View* view_;
  std::size_t index_;
};

// The elements of an array, as JsonValue handles.
class JsonArray {
 public:
  using iterator = JsonIndexIterator<JsonArray, JsonValue>;

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  JsonValue operator[](std::size_t index) const;  // throws JsonError past the end
  iterator begin() const { return iterator(this, 0); }
  iterator end() const { return iterator(this, size_); }

 private:
  friend class JsonValue;
  friend iterator;
  JsonValue element(std::size_t index) const { return (*this)[index]; }
  JsonArray(std::shared_ptr<const nlohmann::json> array, std::size_t size) : array_(std::move(array)), size_(size) {}
  std::shared_ptr<const nlohmann::json> array_;
  std::size_t size_;
};

// The members of an object in key order, as (key, value) pairs:
// `for (const auto& [key, value] : object.as_object())`.
class JsonObject {
  using Member = std::pair<const std::string*, const nlohmann::json*>;

 public:
  using iterator = JsonIndexIterator<JsonObject, std::pair<const std::string&, JsonValue>>;

  std::size_t size() const { return members_.size(); }
  bool empty() const { return members_.empty(); }
  iterator begin() const { return iterator(this, 0); }
  iterator end() const { return iterator(this, members_.size()); }

 private:
  friend class JsonValue;
  friend iterator;
  JsonObject(std::shared_ptr<const nlohmann::json> document, std::vector<Member> members)
      : document_(std::move(document)), members_(std::move(members)) {}
  std::pair<const std::string&, JsonValue> element(std::size_t index) const;
  std::shared_ptr<const nlohmann::json> document_;
  std::vector<Member> members_;
};

}  // namespace moerl
