// `maze`: reach the goal of a perfect maze seen through a 5x5 window.
//
// Difficulty d in 1..10: a (d+2) x (d+2) grid of cells carved by a
// randomised depth-first search (a perfect maze: exactly one path between any
// two cells), drawn as a (2s+1)^2 tile grid ('#' wall, '.' open). The agent
// starts in the top-left cell; the goal G is the cell farthest from it. One
// move goes one cell (two tiles); each observation shows the 5x5 tiles
// around the agent and the goal's offset in cells ("goal 3 down 2 right").
// The expert follows the right-hand wall (turn right if open, else straight,
// else left, else back), which reaches every cell of a perfect maze in at
// most 2 (cells - 1) moves and decides from what a player sees: the walls
// around it and its own last move. (A shortest-path expert used the hidden
// map; bases imitating it solved 0% of 5x5 mazes.)
// Default budget: 2 * cells + 10 moves (a whole wall-following tour; the
// shortest path is ~4 moves at d=1, ~50-100 at d=10).
//
// Shaped reward (potential-based on the true shortest-path distance D to G):
//   r = 0.5 * (D_before - D_after) / D_start
// so walking back undoes the reward of walking forward; the shaped part sums
// to 0.5 on success. Walking into a wall is an invalid action
// (kInvalidPenalty); reaching G adds 1 and ends the episode.

#include <array>
#include <deque>

#include "families.h"
#include "family_common.h"

namespace moerl::env::detail {
namespace {

constexpr int kViewRadius = 2;  // 5x5 tiles

struct Direction {
  const char* name;
  int dr, dc;
};
constexpr std::array<Direction, 4> kDirections = {{{"up", -1, 0}, {"down", 1, 0}, {"left", 0, -1}, {"right", 0, 1}}};

class MazeSession final : public FamilySession {
 public:
  MazeSession() : FamilySession("maze", 2, kMazeMaxDifficulty) {}

 protected:
  void generate(Rng& rng) override {
    cells_ = spec().difficulty + 2;
    side_ = 2 * cells_ + 1;
    tiles_.assign(static_cast<size_t>(side_) * side_, '#');
    // Iterative recursive-backtracker; neighbour order drawn from rng.
    std::vector<char> visited(static_cast<size_t>(cells_) * cells_, 0);
    std::vector<std::pair<int, int>> stack = {{0, 0}};
    visited[0] = 1;
    carve(1, 1) = '.';
    while (!stack.empty()) {
      const auto [r, c] = stack.back();
      std::array<int, 4> options{};
      int count = 0;
      for (int k = 0; k < 4; ++k) {
        const int nr = r + kDirections[k].dr, nc = c + kDirections[k].dc;
        if (nr >= 0 && nr < cells_ && nc >= 0 && nc < cells_ && !visited[nr * cells_ + nc]) options[count++] = k;
      }
      if (count == 0) {
        stack.pop_back();
        continue;
      }
      const Direction& d = kDirections[options[rng.below(static_cast<std::uint64_t>(count))]];
      const int nr = r + d.dr, nc = c + d.dc;
      visited[nr * cells_ + nc] = 1;
      carve(2 * r + 1 + d.dr, 2 * c + 1 + d.dc) = '.';
      carve(2 * nr + 1, 2 * nc + 1) = '.';
      stack.push_back({nr, nc});
    }
    // Goal: the cell farthest from the start (first in row-major order on ties).
    const std::vector<int> from_start = distances_from(0, 0);
    int best = 0;
    for (int k = 0; k < cells_ * cells_; ++k) {
      if (from_start[k] > from_start[best]) best = k;
    }
    goal_r_ = best / cells_;
    goal_c_ = best % cells_;
    to_goal_ = distances_from(goal_r_, goal_c_);
    row_ = 0;
    col_ = 0;
    heading_ = kStartHeading;
    start_distance_ = to_goal_[0];
  }

  int default_max_turns() const override { return 2 * cells_ * cells_ + 10; }

  std::string intro() const override {
    return "maze: reach G. you see 5x5 tiles around you (@ you, # wall, . open); each move goes one cell. "
           "say up|down|left|right. " +
           view();
  }

  std::string hidden_task() const override { return std::string(tiles_.begin(), tiles_.end()); }

  Outcome apply(const Action& action) override {
    const std::string usage = "(use: up|down|left|right)";
    std::string word = action.verb;
    size_t extra = action.args.size();
    if ((word == "move" || word == "go") && !action.args.empty()) {
      word = action.args[0];
      for (char& c : word) {
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      }
      extra -= 1;
    }
    if (word.empty()) return invalid("empty " + usage);
    int k = direction_index(word);
    if (k < 0) return invalid("unknown move " + quote(word) + " " + usage);
    if (extra != 0) return invalid("one direction per move " + usage);
    const Direction& d = kDirections[k];
    if (!passable(k)) {
      return invalid(std::string("wall, cannot move ") + d.name);
    }
    const int before = distance();
    row_ += d.dr;
    col_ += d.dc;
    heading_ = k;
    Outcome outcome;
    outcome.progress_reward = 0.5 * (before - distance()) / std::max(1, start_distance_);
    if (row_ == goal_r_ && col_ == goal_c_) {
      outcome.observation = "reached G";
      outcome.finished = true;
      outcome.success = true;
    } else {
      outcome.observation = view();
    }
    return outcome;
  }

  std::string expert_best() const override { return kDirections[wall_following_direction()].name; }

  // A bump into a wall (the base's commonest failure, and one the tour
  // survives: the position and heading stay), or at a crossing with no wall
  // a turn into another passage than the wall follower's.
  std::string expert_mistake(Rng& rng) const override {
    const int best = wall_following_direction();
    std::array<int, 4> open_ways{}, walls{};
    int n_open = 0, n_walls = 0;
    for (int k = 0; k < 4; ++k) {
      if (!passable(k)) {
        walls[n_walls++] = k;
      } else if (k != best) {
        open_ways[n_open++] = k;
      }
    }
    if (n_walls > 0) return kDirections[walls[rng.below(static_cast<std::uint64_t>(n_walls))]].name;
    return kDirections[open_ways[rng.below(static_cast<std::uint64_t>(n_open))]].name;
  }

  void save_state(runtime::ByteWriter& out) const override {
    out.put<std::int32_t>(row_);
    out.put<std::int32_t>(col_);
    out.put<std::int32_t>(heading_);
  }

  void load_state(runtime::ByteReader& in) override {
    const auto row = in.get<std::int32_t>();
    const auto col = in.get<std::int32_t>();
    const auto heading = in.get<std::int32_t>();
    snapshot_check(row >= 0 && row < cells_ && col >= 0 && col < cells_,
                   "position (" + std::to_string(row) + "," + std::to_string(col) + ") outside the maze");
    snapshot_check(heading >= 0 && heading < 4, "heading " + std::to_string(heading) + " is not a direction");
    row_ = row;
    col_ = col;
    heading_ = heading;
  }

 private:
  char& carve(int r, int c) { return tiles_[static_cast<size_t>(r) * side_ + c]; }
  char tile(int r, int c) const {
    if (r < 0 || r >= side_ || c < 0 || c >= side_) return '#';
    return tiles_[static_cast<size_t>(r) * side_ + c];
  }

  static int direction_index(const std::string& word) {
    if (word == "up" || word == "u" || word == "north" || word == "n") return 0;
    if (word == "down" || word == "d" || word == "south" || word == "s") return 1;
    if (word == "left" || word == "l" || word == "west" || word == "w") return 2;
    if (word == "right" || word == "r" || word == "east" || word == "e") return 3;
    return -1;
  }

  // BFS over cells; mazes are small (at most 12x12 cells).
  std::vector<int> distances_from(int r0, int c0) const {
    std::vector<int> dist(static_cast<size_t>(cells_) * cells_, -1);
    std::deque<int> queue = {r0 * cells_ + c0};
    dist[queue.front()] = 0;
    while (!queue.empty()) {
      const int at = queue.front();
      queue.pop_front();
      const int r = at / cells_, c = at % cells_;
      for (const Direction& d : kDirections) {
        if (tile(2 * r + 1 + d.dr, 2 * c + 1 + d.dc) == '#') continue;
        const int next = (r + d.dr) * cells_ + (c + d.dc);
        if (dist[next] < 0) {
          dist[next] = dist[at] + 1;
          queue.push_back(next);
        }
      }
    }
    return dist;
  }

  int distance() const { return to_goal_[row_ * cells_ + col_]; }

  // No wall between the agent's cell and the next one in direction k.
  bool passable(int k) const { return tile(2 * row_ + 1 + kDirections[k].dr, 2 * col_ + 1 + kDirections[k].dc) != '#'; }

  // Right of, left of and opposite to direction k (indices into kDirections: up, down, left, right).
  static int right_of(int k) { return std::array<int, 4>{3, 2, 0, 1}[static_cast<size_t>(k)]; }
  static int left_of(int k) { return std::array<int, 4>{2, 3, 1, 0}[static_cast<size_t>(k)]; }
  static int behind(int k) { return std::array<int, 4>{1, 0, 3, 2}[static_cast<size_t>(k)]; }

  // The right-hand rule from the current heading; every cell has an open
  // side (the one it was entered from, or a carved passage at the start).
  int wall_following_direction() const {
    for (int k : {right_of(heading_), heading_, left_of(heading_), behind(heading_)})
      if (passable(k)) return k;
    return heading_;  // unreachable: the maze is connected and has more than one cell
  }

  // "goal 3 down 2 right" then the 5x5 window, one row per line.
  std::string view() const {
    std::string out = "goal";
    const int dr = goal_r_ - row_, dc = goal_c_ - col_;
    if (dr != 0) out += " " + std::to_string(dr < 0 ? -dr : dr) + (dr < 0 ? " up" : " down");
    if (dc != 0) out += " " + std::to_string(dc < 0 ? -dc : dc) + (dc < 0 ? " left" : " right");
    const int tr = 2 * row_ + 1, tc = 2 * col_ + 1;
    const int gr = 2 * goal_r_ + 1, gc = 2 * goal_c_ + 1;
    for (int r = tr - kViewRadius; r <= tr + kViewRadius; ++r) {
      out += '\n';
      for (int c = tc - kViewRadius; c <= tc + kViewRadius; ++c) {
        if (r == tr && c == tc) {
          out += '@';
        } else if (r == gr && c == gc) {
          out += 'G';
        } else {
          out += tile(r, c);
        }
      }
    }
    return out;
  }

  int cells_ = 3;             // cells per side
  int side_ = 7;              // tiles per side: 2 * cells_ + 1
  std::vector<char> tiles_;   // [side_ * side_] '#' or '.'
  std::vector<int> to_goal_;  // [cells_ * cells_] shortest moves to G
  int goal_r_ = 0, goal_c_ = 0;
  // Facing down at the start (the top-left corner): the right hand then
  // follows the outer wall on the left, and the tour starts down or right.
  static constexpr int kStartHeading = 1;
  int row_ = 0, col_ = 0;        // the agent's cell
  int heading_ = kStartHeading;  // index of the last move (the wall follower's state)
  int start_distance_ = 1;
};

}  // namespace

std::unique_ptr<Environment> make_maze_session() { return std::make_unique<MazeSession>(); }

}  // namespace moerl::env::detail
