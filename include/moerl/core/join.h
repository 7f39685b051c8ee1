#pragma once
// Joins strings with a separator: the lists of names, tags and reasons that
// messages and tables print on one line.

#include <string>
#include <string_view>

namespace moerl {

// "a, b, c" from {"a", "b", "c"} and ", "; "" from an empty range. Any range
// of strings (a vector, a set).
template <typename Strings>
std::string join(const Strings& parts, std::string_view separator) {
  std::string text;
  bool first = true;
  for (const auto& part : parts) {
    if (!first) text += separator;
    text += part;
    first = false;
  }
  return text;
}

}  // namespace moerl
