// Recursive-descent evaluation of integer expressions for the `calc` tool.
//
//   expr    := term (('+' | '-') term)*
//   term    := unary (('*' | '/') unary)*
//   unary   := ('-' | '+') unary | primary
//   primary := number | '(' expr ')'
//
// Failures unwind through a small internal exception that never leaves this
// file: the public function turns it into CalcResult::error.

#include "moerl/env/calculator.h"

#include <limits>

namespace moerl::env {
namespace {

struct CalcFailure {
  std::string message;
};

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  std::int64_t parse_all() {
    skip_space();
    if (at_end()) fail("empty expression");
    const std::int64_t value = expr();
    skip_space();
    if (!at_end()) fail_unexpected();
    return value;
  }

 private:
  using Limits = std::numeric_limits<std::int64_t>;

  std::int64_t expr() {
    std::int64_t value = term();
    for (;;) {
      skip_space();
      if (at_end()) return value;
      const char op = text_[pos_];
      if (op != '+' && op != '-') return value;
      ++pos_;
      const std::int64_t rhs = term();
      std::int64_t out = 0;
      const bool overflow =
          op == '+' ? __builtin_add_overflow(value, rhs, &out) : __builtin_sub_overflow(value, rhs, &out);
      if (overflow) fail("overflow");
      value = out;
    }
  }

  std::int64_t term() {
    std::int64_t value = unary();
    for (;;) {
      skip_space();
      if (at_end()) return value;
      const char op = text_[pos_];
      if (op != '*' && op != '/') return value;
      ++pos_;
      const std::int64_t rhs = unary();
      if (op == '*') {
        std::int64_t out = 0;
        if (__builtin_mul_overflow(value, rhs, &out)) fail("overflow");
        value = out;
      } else {
        if (rhs == 0) fail("division by zero");
        if (value == Limits::min() && rhs == -1) fail("overflow");
        value /= rhs;
      }
    }
  }

  std::int64_t unary() {
    skip_space();
    if (at_end()) fail("expression ends early");
    const char c = text_[pos_];
    if (c == '-' || c == '+') {
      ++pos_;
      enter();
      const std::int64_t operand = unary();
      leave();
      if (c == '+') return operand;
      if (operand == Limits::min()) fail("overflow");
      return -operand;
    }
    return primary();
  }

  std::int64_t primary() {
    skip_space();
    if (at_end()) fail("expression ends early");
    const char c = text_[pos_];
    if (c == '(') {
      ++pos_;
      enter();
      const std::int64_t value = expr();
      leave();
      skip_space();
      if (at_end()) fail("missing ')'");
      if (text_[pos_] != ')') fail_unexpected();
      ++pos_;
      return value;
    }
    if (c >= '0' && c <= '9') return number();
    fail_unexpected();
  }

  // Literals are read as magnitudes; "-9223372036854775808" is therefore an
  // overflow, which is the safe side for a calculator meant for small values.
  std::int64_t number() {
    std::int64_t value = 0;
    while (!at_end() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const int digit = text_[pos_] - '0';
      if (value > (Limits::max() - digit) / 10) fail("number too large");
      value = value * 10 + digit;
      ++pos_;
    }
    return value;
  }

  void enter() {
    if (++depth_ > kCalcMaxDepth) fail("nesting too deep (max " + std::to_string(kCalcMaxDepth) + ")");
  }
  void leave() { --depth_; }

  void skip_space() {
    while (!at_end() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  bool at_end() const { return pos_ >= text_.size(); }

  [[noreturn]] void fail(const std::string& message) const { throw CalcFailure{message}; }
  [[noreturn]] void fail_unexpected() const {
    const unsigned char c = static_cast<unsigned char>(text_[pos_]);
    std::string shown = (c >= 0x21 && c < 0x7f) ? std::string(1, static_cast<char>(c)) : "?";
    fail("unexpected '" + shown + "' at " + std::to_string(pos_));
  }

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

CalcResult evaluate_integer_expression(std::string_view text) {
  CalcResult result;
  if (text.size() > kCalcMaxLength) {
    result.error = "expression too long (max " + std::to_string(kCalcMaxLength) + " bytes)";
    return result;
  }
  try {
    Parser parser(text);
    result.value = parser.parse_all();
    result.ok = true;
  } catch (const CalcFailure& failure) {
    result.error = failure.message;
  }
  return result;
}

}  // namespace moerl::env
