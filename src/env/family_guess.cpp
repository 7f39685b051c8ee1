// `guess`: find a hidden integer in 1..N with higher/lower feedback.
//
// Difficulty d in 1..15: N = 10^d, so binary search needs
// bits(N) = ceil(log2(N + 1)) guesses at most (4 at d=1, 50 at d=15).
// Default budget: bits + 2 + bits/2.
//
// Shaped reward (potential-based on the log-size of the interval the
// feedback so far leaves open, size = hi - lo + 1):
//   r = 0.5 * (log2(size_before) - log2(size_after)) / log2(N)
// with size_after = 1 on a correct guess, so the shaped part sums to at most
// 0.5 on success; invalid actions get kInvalidPenalty; success adds 1.

#include <cmath>

#include "families.h"
#include "family_common.h"

namespace moerl::env::detail {
namespace {

class GuessSession final : public FamilySession {
 public:
  GuessSession() : FamilySession("guess", 1, kGuessMaxDifficulty) {}

 protected:
  void generate(Rng& rng) override {
    limit_ = 1;
    for (int i = 0; i < spec().difficulty; ++i) limit_ *= 10;
    bits_ = 0;
    while (bits_ < 62 && ((std::int64_t{1} << bits_) - 1) < limit_) ++bits_;
    target_ = rng.range(1, limit_);
    lo_ = 1;
    hi_ = limit_;
  }

  int default_max_turns() const override { return bits_ + 2 + bits_ / 2; }

  std::string intro() const override {
    return "guess: find the hidden integer in 1.." + std::to_string(limit_) +
           ". say `guess <n>`; I reply higher, lower or correct.";
  }

  std::string hidden_task() const override { return std::to_string(target_); }

  Outcome apply(const Action& action) override {
    std::string number;
    if (action.verb == "guess") {
      if (action.args.size() != 1) return invalid("usage: guess <n>");
      number = action.args[0];
    } else if (action.args.empty() && parse_int(action.verb)) {
      number = action.verb;  // a bare number is a guess
    } else if (action.verb.empty()) {
      return invalid("empty (use: guess <n>)");
    } else {
      return invalid("unknown verb " + quote(action.verb) + " (use: guess <n>)");
    }
    const auto value = parse_int(number);
    if (!value) return invalid("not an integer: " + quote(number));
    const std::int64_t g = *value;
    if (g < 1 || g > limit_) return invalid(std::to_string(g) + " is outside 1.." + std::to_string(limit_));

    const double size_before = static_cast<double>(hi_ - lo_ + 1);
    Outcome outcome;
    if (g == target_) {
      outcome.observation = "correct";
      outcome.finished = true;
      outcome.success = true;
      outcome.progress_reward = progress(size_before, 1.0);
      return outcome;
    }
    if (g < target_) {
      outcome.observation = "higher";
      if (g + 1 > lo_) lo_ = g + 1;
    } else {
      outcome.observation = "lower";
      if (g - 1 < hi_) hi_ = g - 1;
    }
    outcome.progress_reward = progress(size_before, static_cast<double>(hi_ - lo_ + 1));
    return outcome;
  }

  std::string expert_best() const override { return "guess " + std::to_string(midpoint()); }

  // An off-by-one guess: still informative, but a wasted halving.
  std::string expert_mistake(Rng& rng) const override {
    std::int64_t g = midpoint() + (rng.chance(0.5) ? 1 : -1);
    if (g < 1) g = 2;
    if (g > limit_) g = limit_ - 1;
    return "guess " + std::to_string(g);
  }

  void save_state(runtime::ByteWriter& out) const override {
    out.put<std::int64_t>(lo_);
    out.put<std::int64_t>(hi_);
  }

  void load_state(runtime::ByteReader& in) override {
    const auto lo = in.get<std::int64_t>();
    const auto hi = in.get<std::int64_t>();
    snapshot_check(lo >= 1 && hi <= limit_ && lo <= target_ && target_ <= hi,
                   "interval " + std::to_string(lo) + ".." + std::to_string(hi) + " is inconsistent with the task");
    lo_ = lo;
    hi_ = hi;
  }

 private:
  std::int64_t midpoint() const { return lo_ + (hi_ - lo_) / 2; }
  double progress(double size_before, double size_after) const {
    return 0.5 * (std::log2(size_before) - std::log2(size_after)) / std::log2(static_cast<double>(limit_));
  }

  std::int64_t limit_ = 10;  // N: the target is in 1..N
  int bits_ = 4;             // worst-case binary-search guesses
  std::int64_t target_ = 1;
  std::int64_t lo_ = 1, hi_ = 10;  // what the feedback so far leaves open
};

}  // namespace

std::unique_ptr<Environment> make_guess_session() { return std::make_unique<GuessSession>(); }

}  // namespace moerl::env::detail
