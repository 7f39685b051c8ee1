// `arithmetic`: evaluate an integer expression with a calculator tool.
//
// Difficulty d in 1..10 sets the number of operators (kOperators: 1 .. 40)
// and the operand range (kMaxOperand: 9 .. 999). Every intermediate value is
// kept within +-kValueBound by construction, so the step-by-step calcs the
// expert issues never overflow. The expert evaluates one operator per `calc`
// in post-order, then answers: ops + 1 turns. Default budget: 2 * ops + 4.
//
// Actions: `calc <expr>` (the env evaluates + - * / and parentheses over
// 64-bit integers; / truncates toward zero; errors answer "calc error: ...",
// a valid action with info["calc_error"]="1"), `answer <n>` (ends the episode).
//
// Shaped reward: 0.5 / ops for each operator node of the task whose value a
// successful calc produces for the first time (nodes matched in post-order),
// so the shaped part sums to at most 0.5; invalid actions get
// kInvalidPenalty; a correct answer adds 1.

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "families.h"
#include "family_common.h"
#include "moerl/env/calculator.h"

namespace moerl::env::detail {
namespace {

constexpr int kOperators[kArithmeticMaxDifficulty] = {1, 2, 3, 4, 6, 9, 13, 19, 28, 40};
constexpr int kMaxOperand[kArithmeticMaxDifficulty] = {9, 9, 20, 20, 50, 50, 99, 99, 999, 999};
constexpr std::int64_t kValueBound = 1000000000;  // |every node value| <= 1e9
constexpr size_t kMaxHistory = 4096;              // remembered calc texts (bounded snapshots)

struct Node {
  char op = 0;  // 0 for a literal, else one of + - * /
  int left = -1, right = -1;
  std::int64_t value = 0;
};

int precedence(char op) { return (op == '*' || op == '/') ? 2 : 1; }

// Calc texts are compared without whitespace: "3 * 4" == "3*4".
std::string normalize(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') out += c;
  }
  return out;
}

std::string operand_text(std::int64_t v) { return v < 0 ? "(" + std::to_string(v) + ")" : std::to_string(v); }

class ArithmeticSession final : public FamilySession {
 public:
  ArithmeticSession() : FamilySession("arithmetic", 1, kArithmeticMaxDifficulty) {}

 protected:
  void generate(Rng& rng) override {
    nodes_.clear();
    const int d = spec().difficulty - 1;
    root_ = build(rng, kOperators[d], kMaxOperand[d]);
    post_order_.clear();
    collect(root_);
    expression_ = render(root_);
    history_.clear();
    credited_.assign(post_order_.size(), 0);
  }

  int default_max_turns() const override { return 2 * static_cast<int>(post_order_.size()) + 4; }

  std::string intro() const override {
    return "arithmetic: compute " + expression_ +
           "\ntools: `calc <expr>` (+ - * / ( ), / is integer division), then `answer <n>`.";
  }

  Outcome apply(const Action& action) override {
    const std::string usage = "(use: calc <expr> | answer <n>)";
    if (action.verb.empty()) return invalid("empty " + usage);
    if (action.verb == "calc") {
      if (action.rest.empty()) return invalid("usage: calc <expr>");
      const CalcResult result = evaluate_integer_expression(action.rest);
      Outcome outcome;
      if (!result.ok) {
        outcome.observation = "calc error: " + result.error;
        outcome.info.emplace_back("calc_error", "1");
        return outcome;
      }
      outcome.observation = "= " + std::to_string(result.value);
      const std::string text = normalize(action.rest);
      if (history_.size() < kMaxHistory && std::find(history_.begin(), history_.end(), text) == history_.end()) {
        history_.push_back(text);
      }
      for (size_t k = 0; k < post_order_.size(); ++k) {
        if (!credited_[k] && nodes_[post_order_[k]].value == result.value) {
          credited_[k] = 1;
          outcome.progress_reward = 0.5 / static_cast<double>(post_order_.size());
          break;
        }
      }
      return outcome;
    }
    if (action.verb == "answer") {
      if (action.args.size() != 1) return invalid("usage: answer <n>");
      const auto value = parse_int(action.args[0]);
      if (!value) return invalid("not an integer: " + quote(action.args[0]));
      Outcome outcome;
      outcome.finished = true;
      outcome.success = *value == nodes_[root_].value;
      outcome.observation = outcome.success ? "correct" : "wrong (it is " + std::to_string(nodes_[root_].value) + ")";
      return outcome;
    }
    return invalid("unknown verb " + quote(action.verb) + " " + usage);
  }

  // One operator per calc, in post-order, with the children's values filled
  // in; then the answer.
  std::string expert_best() const override {
    const int next = next_uncomputed();
    if (next < 0) return "answer " + std::to_string(nodes_[root_].value);
    return "calc " + step_text(next);
  }

  // A calc with an operand off by one (a wasted turn); at the end a repeated
  // calc or an answer off by one (a failed episode).
  std::string expert_mistake(Rng& rng) const override {
    const int next = next_uncomputed();
    const std::int64_t delta = rng.chance(0.5) ? 1 : -1;
    if (next < 0) {
      // At the end, half the mistakes re-check the last step (a wasted turn).
      if (rng.chance(0.5)) return "calc " + step_text(root_);
      return "answer " + std::to_string(nodes_[root_].value + delta);
    }
    const Node& n = nodes_[next];
    const bool left = rng.chance(0.5);
    const std::int64_t a = nodes_[n.left].value + (left ? delta : 0);
    std::int64_t b = nodes_[n.right].value + (left ? 0 : delta);
    if (n.op == '/' && b == 0) b = delta;
    return "calc " + operand_text(a) + " " + n.op + " " + operand_text(b);
  }

  void save_state(runtime::ByteWriter& out) const override {
    out.put<std::uint32_t>(static_cast<std::uint32_t>(history_.size()));
    for (const auto& text : history_) out.put_string(text);
    out.put_vector(credited_);
  }

  void load_state(runtime::ByteReader& in) override {
    const auto count = in.get<std::uint32_t>();
    snapshot_check(count <= kMaxHistory, "calc history of " + std::to_string(count) + " entries is too long");
    std::vector<std::string> history;
    for (std::uint32_t k = 0; k < count; ++k) {
      history.push_back(in.get_string());
      snapshot_check(history.back().size() <= kCalcMaxLength, "calc history entry is too long");
    }
    auto credited = in.get_vector<std::uint8_t>();
    snapshot_check(credited.size() == post_order_.size(), "credited-node list does not match the task");
    for (auto flag : credited) snapshot_check(flag <= 1, "bad credited-node flag");
    history_ = std::move(history);
    credited_ = std::move(credited);
  }

 private:
  // A random expression tree with `ops` operators; returns its node index.
  int build(Rng& rng, int ops, int max_operand) {
    Node node;
    if (ops == 0) {
      node.value = rng.range(1, max_operand);
      nodes_.push_back(node);
      return static_cast<int>(nodes_.size()) - 1;
    }
    const int left_ops = static_cast<int>(rng.below(static_cast<std::uint64_t>(ops)));
    node.op = "+-*/"[rng.below(4)];
    node.left = build(rng, left_ops, max_operand);
    node.right = build(rng, ops - 1 - left_ops, max_operand);
    const std::int64_t a = nodes_[node.left].value;
    if (node.op == '/') make_exact_division(rng, node, max_operand);
    const std::int64_t b = nodes_[node.right].value;
    // Children are within the bound, so none of these overflow int64.
    switch (node.op) {
      case '+': node.value = a + b; break;
      case '-': node.value = a - b; break;
      case '*': node.value = a * b; break;
      default: node.value = a / b; break;  // exact, b != 0 (make_exact_division)
    }
    if (std::llabs(node.value) > kValueBound) {
      // One of a+b, a-b stays within max(|a|, |b|): same signs -> minus, else plus.
      node.op = ((a >= 0) == (b >= 0)) ? '-' : '+';
      node.value = node.op == '-' ? a - b : a + b;
    }
    nodes_.push_back(node);
    return static_cast<int>(nodes_.size()) - 1;
  }

  // Tasks divide exactly (truncation is for the tool, not the puzzle): a
  // literal divisor is redrawn among the divisors of the dividend in
  // 2..max_operand; otherwise, or when none exists, the operator becomes '*'.
  void make_exact_division(Rng& rng, Node& node, int max_operand) {
    const std::int64_t a = nodes_[node.left].value;
    Node& right = nodes_[node.right];
    if (right.op == 0) {
      std::vector<std::int64_t> divisors;
      for (std::int64_t d = 2; d <= max_operand && a != 0; ++d) {
        if (a % d == 0) divisors.push_back(d);
      }
      if (!divisors.empty()) {
        right.value = divisors[rng.below(divisors.size())];
        return;
      }
    } else if (right.value != 0 && right.value != 1 && right.value != -1 && a % right.value == 0) {
      return;
    }
    node.op = '*';
  }

  void collect(int index) {
    const Node& n = nodes_[index];
    if (n.op == 0) return;
    collect(n.left);
    collect(n.right);
    post_order_.push_back(index);
  }

  // Minimal parentheses that keep the tree's meaning under left-to-right
  // evaluation with integer division.
  std::string render(int index) const {
    const Node& n = nodes_[index];
    if (n.op == 0) return std::to_string(n.value);
    const Node& l = nodes_[n.left];
    const Node& r = nodes_[n.right];
    std::string left = render(n.left);
    std::string right = render(n.right);
    if (l.op != 0 && precedence(l.op) < precedence(n.op)) left = "(" + left + ")";
    if (r.op != 0) {
      const bool lower = precedence(r.op) < precedence(n.op);
      const bool same_needs =
          precedence(r.op) == precedence(n.op) && (n.op == '-' || n.op == '/' || (n.op == '*' && r.op == '/'));
      if (lower || same_needs) right = "(" + right + ")";
    }
    return left + " " + n.op + " " + right;
  }

  std::string step_text(int index) const {
    const Node& n = nodes_[index];
    return operand_text(nodes_[n.left].value) + " " + n.op + " " + operand_text(nodes_[n.right].value);
  }

  bool in_history(const std::string& text) const {
    return std::find(history_.begin(), history_.end(), normalize(text)) != history_.end();
  }

  // The first operator (post-order) the expert has not calculated yet, or -1
  // when all are done or the whole expression was calculated at once.
  int next_uncomputed() const {
    if (in_history(expression_)) return -1;
    for (int index : post_order_) {
      if (!in_history(step_text(index))) return index;
    }
    return -1;
  }

  std::vector<Node> nodes_;  // [literals + operators] the expression tree
  int root_ = 0;
  std::vector<int> post_order_;  // [ops] operator nodes, children first
  std::string expression_;
  std::vector<std::string> history_;    // distinct successful calc texts, normalized
  std::vector<std::uint8_t> credited_;  // [ops] shaped reward paid for this node
};

}  // namespace

std::unique_ptr<Environment> make_arithmetic_session() { return std::make_unique<ArithmeticSession>(); }

}  // namespace moerl::env::detail
