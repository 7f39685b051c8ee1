#pragma once
// The integer calculator behind the `arithmetic` family's `calc <expr>` tool.
// A recursive-descent parser over 64-bit integers: + - * / and parentheses,
// unary minus/plus, decimal literals. Division truncates toward zero (C++
// semantics). It never throws and never overflows: every failure becomes an
// error text the environment shows to the agent ("division by zero",
// "overflow", "unexpected ')' at 7", ...).

#include <cstdint>
#include <string>
#include <string_view>

namespace moerl::env {

struct CalcResult {
  bool ok = false;
  std::int64_t value = 0;
  std::string error;  // set when !ok, without the "calc error: " prefix
};

// Limits that keep a hostile expression cheap to reject.
inline constexpr size_t kCalcMaxLength = 512;  // bytes of expression text
inline constexpr int kCalcMaxDepth = 64;       // nested parentheses / unary signs

CalcResult evaluate_integer_expression(std::string_view text);

}  // namespace moerl::env
