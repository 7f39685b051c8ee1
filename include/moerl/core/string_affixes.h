#pragma once
// std::string::starts_with and ends_with arrived in C++20; moerl builds as
// C++17 against Debian's LibTorch 1.13, so these stand in for them.

#include <string_view>

namespace moerl {

inline bool starts_with(std::string_view s, std::string_view head) {
  return s.size() >= head.size() && s.compare(0, head.size(), head) == 0;
}

inline bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace moerl
