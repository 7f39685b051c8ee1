#include "moerl/core/json_writer.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "moerl/core/check.h"

namespace moerl {

namespace {

// `text` as a JSON string literal, quotes included.
std::string quoted(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

void JsonWriter::before_value() {
  if (open_.empty()) return;
  Open& container = open_.back();
  if (container.object) {
    MOERL_CHECK(after_key_, "JsonWriter: a value in an object without its key");
    after_key_ = false;
    return;
  }
  if (container.has_elements) out_ += ',';
  container.has_elements = true;
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  out_ += '{';
  open_.push_back({true, false});
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  MOERL_CHECK(!open_.empty() && open_.back().object && !after_key_, "JsonWriter: unbalanced end_object");
  open_.pop_back();
  out_ += '}';
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value();
  out_ += '[';
  open_.push_back({false, false});
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  MOERL_CHECK(!open_.empty() && !open_.back().object, "JsonWriter: unbalanced end_array");
  open_.pop_back();
  out_ += ']';
  return *this;
}

JsonWriter& JsonWriter::key(const std::string& name) {
  MOERL_CHECK(!open_.empty() && open_.back().object && !after_key_, "JsonWriter: key outside an object");
  if (open_.back().has_elements) out_ += ',';
  open_.back().has_elements = true;
  out_ += quoted(name) + ':';
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(const std::string& text) {
  before_value();
  out_ += quoted(text);
  return *this;
}

JsonWriter& JsonWriter::value(const char* text) { return value(std::string(text)); }

JsonWriter& JsonWriter::value(double number) {
  if (!std::isfinite(number)) return null();
  before_value();
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", number);
  out_ += buffer;
  return *this;
}

JsonWriter& JsonWriter::value(std::int64_t number) {
  before_value();
  out_ += std::to_string(number);
  return *this;
}

JsonWriter& JsonWriter::value(bool flag) {
  before_value();
  out_ += flag ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::null() {
  before_value();
  out_ += "null";
  return *this;
}

}  // namespace moerl
