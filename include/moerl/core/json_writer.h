#pragma once
// A small streaming JSON writer for metrics lines, checkpoint books and
// benchmark results. Produces compact single-line JSON; keys appear in the
// order written. Strings are escaped by nlohmann-json (invalid UTF-8 becomes
// U+FFFD, so that every document moerl writes is one JsonValue can read).
// A double is written with 9 significant digits (%.9g: a float's value
// exactly, a double's to 1e-9), so "7" not "7.0" and "0.300000012", not the
// 17 digits of nlohmann's shortest round trip; non-finite ones as null.

#include <cstdint>
#include <string>
#include <vector>

namespace moerl {

class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(const std::string& name);
  JsonWriter& value(const std::string& text);
  JsonWriter& value(const char* text);
  JsonWriter& value(double number);  // non-finite numbers are written as null
  JsonWriter& value(std::int64_t number);
  JsonWriter& value(int number) { return value(static_cast<std::int64_t>(number)); }
  JsonWriter& value(bool flag);
  JsonWriter& null();
  // Misuse (a key outside an object, a value without its key, an end that
  // does not match) throws moerl::Error.

  const std::string& str() const { return out_; }

 private:
  struct Open {
    bool object;        // else an array
    bool has_elements;  // a comma goes before the next one
  };
  void before_value();
  std::string out_;
  std::vector<Open> open_;
  bool after_key_ = false;
};

}  // namespace moerl
