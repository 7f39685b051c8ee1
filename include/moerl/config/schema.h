#pragma once
// The binding between TOML keys and the typed section structs: each field
// knows its key, type, documentation, valid range and how to read and write
// its member. Loading, `config show`, `config reference` and the did-you-mean
// suggestions all come from this one table, so a key added here is validated,
// documented and printable without further code. Later modules add their
// sections in src/config/schema.cpp through SectionBuilder.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <toml++/toml.h>

namespace moerl::config {

struct Config;

struct FieldSpec {
  std::string key;
  std::string doc;
  std::string type_name;  // "integer", "float", "boolean", "string", "a | b"
  std::optional<double> minimum, maximum;
  bool minimum_exclusive = false;

  // Reads a TOML value into the section; returns an error message or "".
  std::function<std::string(void* section, const toml::node& value)> assign;
  // The member's value as a TOML literal ("8", "0.01", "true", "\"runs\"").
  std::function<std::string(const void* section)> literal;
  // The member as a number, for range checks; empty for non-numeric fields.
  std::function<double(const void* section)> numeric;

  FieldSpec& at_least(double value) {
    minimum = value;
    minimum_exclusive = false;
    return *this;
  }
  FieldSpec& greater_than(double value) {
    minimum = value;
    minimum_exclusive = true;
    return *this;
  }
  FieldSpec& at_most(double value) {
    maximum = value;
    return *this;
  }
  FieldSpec& between(double low, double high) { return at_least(low).at_most(high); }
  // "" when the value is in range, else "must be >= 1" and the like.
  std::string range_violation(const void* section) const;
};

struct SectionSpec {
  std::string name;
  std::string doc;
  std::vector<FieldSpec> fields;
  std::function<void*(Config&)> locate;
  std::function<const void*(const Config&)> locate_const;

  const FieldSpec* find(const std::string& key) const;
};

std::string toml_string_literal(const std::string& text);
std::string toml_float_literal(double value);

// Builds one SectionSpec for a section struct S that is the member `member` of Config.
template <typename S>
class SectionBuilder {
 public:
  SectionBuilder(SectionSpec& spec, S Config::*member) : spec_(spec) {
    spec_.locate = [member](Config& c) -> void* { return &(c.*member); };
    spec_.locate_const = [member](const Config& c) -> const void* { return &(c.*member); };
  }
  // For sections that are not a direct member of Config (e.g. one entry of a map).
  SectionBuilder(SectionSpec& spec, std::function<S&(Config&)> locate,
                 std::function<const S&(const Config&)> locate_const)
      : spec_(spec) {
    spec_.locate = [locate](Config& c) -> void* { return &locate(c); };
    spec_.locate_const = [locate_const](const Config& c) -> const void* { return &locate_const(c); };
  }

  FieldSpec& field(const char* key, std::int64_t S::*m, const char* doc);
  FieldSpec& field(const char* key, double S::*m, const char* doc);
  FieldSpec& field(const char* key, bool S::*m, const char* doc);
  FieldSpec& field(const char* key, std::string S::*m, const char* doc);
  FieldSpec& field(const char* key, std::vector<std::string> S::*m, const char* doc);

  template <typename E>
  FieldSpec& choice(const char* key, E S::*m, std::vector<std::pair<std::string, E>> names, const char* doc);

 private:
  FieldSpec& add(const char* key, const char* doc, const char* type_name) {
    spec_.fields.push_back(FieldSpec{key, doc, type_name, {}, {}, false, {}, {}, {}});
    return spec_.fields.back();
  }
  static S& self(void* p) { return *static_cast<S*>(p); }
  static const S& self(const void* p) { return *static_cast<const S*>(p); }

  SectionSpec& spec_;
};

// Helpers the template members use; defined in schema.cpp.
namespace detail {
std::string read_integer(const toml::node& value, std::int64_t& out);
std::string read_float(const toml::node& value, double& out);
std::string read_boolean(const toml::node& value, bool& out);
std::string read_string(const toml::node& value, std::string& out);
std::string read_string_list(const toml::node& value, std::vector<std::string>& out);
std::string string_list_literal(const std::vector<std::string>& values);
}  // namespace detail

template <typename S>
FieldSpec& SectionBuilder<S>::field(const char* key, std::int64_t S::*m, const char* doc) {
  FieldSpec& f = add(key, doc, "integer");
  f.assign = [m](void* s, const toml::node& v) { return detail::read_integer(v, self(s).*m); };
  f.literal = [m](const void* s) { return std::to_string(self(s).*m); };
  f.numeric = [m](const void* s) { return static_cast<double>(self(s).*m); };
  return f;
}

template <typename S>
FieldSpec& SectionBuilder<S>::field(const char* key, double S::*m, const char* doc) {
  FieldSpec& f = add(key, doc, "float");
  f.assign = [m](void* s, const toml::node& v) { return detail::read_float(v, self(s).*m); };
  f.literal = [m](const void* s) { return toml_float_literal(self(s).*m); };
  f.numeric = [m](const void* s) { return self(s).*m; };
  return f;
}

template <typename S>
FieldSpec& SectionBuilder<S>::field(const char* key, bool S::*m, const char* doc) {
  FieldSpec& f = add(key, doc, "boolean");
  f.assign = [m](void* s, const toml::node& v) { return detail::read_boolean(v, self(s).*m); };
  f.literal = [m](const void* s) { return std::string(self(s).*m ? "true" : "false"); };
  return f;
}

template <typename S>
FieldSpec& SectionBuilder<S>::field(const char* key, std::string S::*m, const char* doc) {
  FieldSpec& f = add(key, doc, "string");
  f.assign = [m](void* s, const toml::node& v) { return detail::read_string(v, self(s).*m); };
  f.literal = [m](const void* s) { return toml_string_literal(self(s).*m); };
  return f;
}

template <typename S>
FieldSpec& SectionBuilder<S>::field(const char* key, std::vector<std::string> S::*m, const char* doc) {
  FieldSpec& f = add(key, doc, "array of strings");
  f.assign = [m](void* s, const toml::node& v) { return detail::read_string_list(v, self(s).*m); };
  f.literal = [m](const void* s) { return detail::string_list_literal(self(s).*m); };
  return f;
}

template <typename S>
template <typename E>
FieldSpec& SectionBuilder<S>::choice(const char* key, E S::*m, std::vector<std::pair<std::string, E>> names,
                                     const char* doc) {
  std::string type_name;
  for (const auto& [name, value] : names) type_name += (type_name.empty() ? "" : " | ") + name;
  FieldSpec& f = add(key, doc, "");
  f.type_name = type_name;
  f.assign = [m, names, type_name](void* s, const toml::node& v) -> std::string {
    std::string text;
    if (std::string error = detail::read_string(v, text); !error.empty()) return error;
    for (const auto& [name, value] : names) {
      if (name == text) {
        self(s).*m = value;
        return "";
      }
    }
    return "'" + text + "' is not one of: " + type_name;
  };
  f.literal = [m, names](const void* s) -> std::string {
    for (const auto& [name, value] : names)
      if (value == self(s).*m) return toml_string_literal(name);
    return "\"?\"";
  };
  return f;
}

// Every section, in the order `config show` prints them.
const std::vector<SectionSpec>& all_sections();
const SectionSpec* find_section(const std::string& name);

}  // namespace moerl::config
