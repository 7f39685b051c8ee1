// `sort`: sort a list of distinct integers ascending with `swap i j`.
//
// Difficulty d in 1..12 sets the length n (see kLengths: 3 .. 56). The
// expert (selection sort by swaps) needs n - cycles <= n - 1 swaps.
// Default budget: 2n + 4.
//
// Shaped reward (potential-based on the inversion count):
//   r = 0.5 * (inversions_before - inversions_after) / inversions_at_start
// so a swap that makes things worse is penalised as much as the reverse swap
// is rewarded; the shaped part sums to 0.5 on success. Invalid actions get
// kInvalidPenalty; success (the list is sorted) adds 1 and ends the episode.

#include <algorithm>

#include "families.h"
#include "family_common.h"

namespace moerl::env::detail {
namespace {

constexpr int kLengths[kSortMaxDifficulty] = {3, 4, 5, 6, 8, 10, 12, 16, 22, 30, 40, 56};
constexpr int kMaxValue = 99;  // values are distinct, in 1..kMaxValue

class SortSession final : public FamilySession {
 public:
  SortSession() : FamilySession("sort", 1, kSortMaxDifficulty) {}

 protected:
  void generate(Rng& rng) override {
    const int n = kLengths[spec().difficulty - 1];
    std::vector<int> pool(kMaxValue);
    for (int i = 0; i < kMaxValue; ++i) pool[i] = i + 1;
    // Partial Fisher-Yates: the first n entries are a random ordered sample.
    for (int i = 0; i < n; ++i) {
      const int j = i + static_cast<int>(rng.below(static_cast<std::uint64_t>(kMaxValue - i)));
      std::swap(pool[i], pool[j]);
    }
    list_.assign(pool.begin(), pool.begin() + n);
    if (std::is_sorted(list_.begin(), list_.end())) std::reverse(list_.begin(), list_.end());
    sorted_ = list_;
    std::sort(sorted_.begin(), sorted_.end());
    initial_inversions_ = inversions();
  }

  int default_max_turns() const override { return 2 * static_cast<int>(list_.size()) + 4; }

  std::string intro() const override {
    return "sort: sort the list ascending. say `swap i j` (0-based positions). list: " + render();
  }

  Outcome apply(const Action& action) override {
    const std::string usage = "(use: swap i j, i and j in 0.." + std::to_string(list_.size() - 1) + ")";
    if (action.verb.empty()) return invalid("empty " + usage);
    if (action.verb != "swap") return invalid("unknown verb " + quote(action.verb) + " " + usage);
    // Accept "swap 1 2", "swap 1,2" and "swap 1, 2".
    std::vector<std::string> args;
    for (const auto& arg : action.args) {
      size_t start = 0;
      for (size_t k = 0; k <= arg.size(); ++k) {
        if (k == arg.size() || arg[k] == ',') {
          if (k > start) args.push_back(arg.substr(start, k - start));
          start = k + 1;
        }
      }
    }
    if (args.size() != 2) return invalid("usage: swap i j");
    const auto i = parse_int(args[0]);
    const auto j = parse_int(args[1]);
    if (!i) return invalid("not an integer: " + quote(args[0]));
    if (!j) return invalid("not an integer: " + quote(args[1]));
    const std::int64_t n = static_cast<std::int64_t>(list_.size());
    if (*i < 0 || *i >= n || *j < 0 || *j >= n) {
      return invalid("index out of range " + usage);
    }
    if (*i == *j) return invalid("i and j must differ");

    const int before = inversions();
    std::swap(list_[*i], list_[*j]);
    const int after = inversions();
    Outcome outcome;
    outcome.progress_reward = 0.5 * (before - after) / std::max(1, initial_inversions_);
    if (after == 0) {
      outcome.observation = "sorted: " + render();
      outcome.finished = true;
      outcome.success = true;
    } else {
      outcome.observation = "list: " + render();
    }
    return outcome;
  }

  // Selection sort: put the right value at the first wrong position.
  std::string expert_best() const override {
    const int i = first_wrong();
    return "swap " + std::to_string(i) + " " + std::to_string(position_of(sorted_[i]));
  }

  // The first wrong position swapped with some other (wrong) partner.
  std::string expert_mistake(Rng& rng) const override {
    const int n = static_cast<int>(list_.size());
    const int i = first_wrong();
    const int right = position_of(sorted_[i]);
    int j = static_cast<int>(rng.below(static_cast<std::uint64_t>(n)));
    if (j == i || (j == right && n > 2)) j = (j + 1) % n;
    if (j == i) j = (j + 1) % n;
    return "swap " + std::to_string(i) + " " + std::to_string(j);
  }

  void save_state(runtime::ByteWriter& out) const override {
    std::vector<std::int32_t> values(list_.begin(), list_.end());
    out.put_vector(values);
  }

  void load_state(runtime::ByteReader& in) override {
    const auto values = in.get_vector<std::int32_t>();
    std::vector<int> list(values.begin(), values.end());
    std::vector<int> check = list;
    std::sort(check.begin(), check.end());
    snapshot_check(check == sorted_, "the list is not a permutation of the task's list");
    list_ = std::move(list);
  }

 private:
  int inversions() const {
    int count = 0;
    for (size_t a = 0; a < list_.size(); ++a) {
      for (size_t b = a + 1; b < list_.size(); ++b) count += list_[a] > list_[b];
    }
    return count;
  }
  int first_wrong() const {
    for (size_t k = 0; k < list_.size(); ++k) {
      if (list_[k] != sorted_[k]) return static_cast<int>(k);
    }
    return 0;  // unreachable while the session is live: a sorted list ends it
  }
  int position_of(int value) const {
    return static_cast<int>(std::find(list_.begin(), list_.end(), value) - list_.begin());
  }
  std::string render() const {
    std::string out;
    for (size_t k = 0; k < list_.size(); ++k) {
      if (k) out += ' ';
      out += std::to_string(list_[k]);
    }
    return out;
  }

  std::vector<int> list_;    // [n] current order
  std::vector<int> sorted_;  // [n] the goal
  int initial_inversions_ = 0;
};

}  // namespace

std::unique_ptr<Environment> make_sort_session() { return std::make_unique<SortSession>(); }

}  // namespace moerl::env::detail
