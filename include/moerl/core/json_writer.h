#pragma once
// A small streaming JSON writer for metrics lines and benchmark results.
// Produces compact single-line JSON; keys appear in the order written.

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

  const std::string& str() const { return out_; }

 private:
  void before_value();
  std::string out_;
  // One entry per open container: true once it holds an element.
  std::vector<bool> has_elements_;
  bool after_key_ = false;
};

std::string json_escape(const std::string& text);

}  // namespace moerl
