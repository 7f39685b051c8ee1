#include "family_common.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "moerl/core/error.h"

namespace moerl::env::detail {

// ---------------------------------------------------------------- Rng

std::uint64_t Rng::next() {
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t Rng::below(std::uint64_t n) {
  if (n <= 1) return 0;
  // Reject the lowest (2^64 mod n) values so every residue is equally likely.
  const std::uint64_t threshold = (0 - n) % n;
  for (;;) {
    const std::uint64_t r = next();
    if (r >= threshold) return r % n;
  }
}

std::int64_t Rng::range(std::int64_t lo, std::int64_t hi) {
  if (hi <= lo) return lo;
  const std::uint64_t span = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo) + 1;
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(lo) + below(span));
}

double Rng::unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

bool Rng::chance(double p) {
  if (!(p > 0.0)) return false;  // also NaN
  if (p >= 1.0) return true;
  return unit() < p;
}

std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b) {
  Rng rng(a * 0x9e3779b97f4a7c15ULL ^ (b + 0x632be59bd9b4e019ULL));
  rng.next();
  return rng.next();
}

std::uint64_t hash_text(const std::string& text) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// ---------------------------------------------------------------- parsing

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string trim(const std::string& text) {
  size_t b = 0, e = text.size();
  while (b < e && is_space(text[b])) ++b;
  while (e > b && is_space(text[e - 1])) --e;
  return text.substr(b, e - b);
}

}  // namespace

Action parse_action(const std::string& text) {
  Action action;
  const std::string body = trim(text);
  size_t i = 0;
  while (i < body.size() && !is_space(body[i])) ++i;
  action.verb = body.substr(0, i);
  for (char& c : action.verb) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  while (!action.verb.empty() && action.verb.back() == ':') action.verb.pop_back();
  action.rest = trim(body.substr(i));
  size_t j = 0;
  const std::string& rest = action.rest;
  while (j < rest.size()) {
    while (j < rest.size() && is_space(rest[j])) ++j;
    size_t k = j;
    while (k < rest.size() && !is_space(rest[k])) ++k;
    if (k > j) action.args.push_back(rest.substr(j, k - j));
    j = k;
  }
  return action;
}

std::optional<std::int64_t> parse_int(const std::string& text) {
  size_t i = 0;
  bool negative = false;
  if (i < text.size() && (text[i] == '-' || text[i] == '+')) {
    negative = text[i] == '-';
    ++i;
  }
  if (i == text.size()) return std::nullopt;
  // Accumulate negatively so that INT64_MIN parses too.
  std::int64_t value = 0;
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c < '0' || c > '9') return std::nullopt;
    const int digit = c - '0';
    if (value < (kMin + digit) / 10) return std::nullopt;
    value = value * 10 - digit;
  }
  if (!negative) {
    if (value == kMin) return std::nullopt;
    value = -value;
  }
  return value;
}

std::string quote(const std::string& text, size_t max_len) {
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < max_len; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  if (text.size() > max_len) out += "...";
  return out + "'";
}

Outcome invalid(const std::string& why) {
  Outcome outcome;
  outcome.observation = "invalid action: " + why;
  outcome.invalid = true;
  return outcome;
}

// ---------------------------------------------------------------- FamilySession

namespace {

constexpr char kMagic[4] = {'M', 'E', 'N', 'V'};
constexpr std::uint8_t kContainerVersion = 1;

}  // namespace

FamilySession::FamilySession(std::string family, std::uint32_t format_version, int max_difficulty)
    : family_(std::move(family)), format_version_(format_version), max_difficulty_(max_difficulty) {}

std::string FamilySession::open(const TaskSpec& task) {
  if (!task.family.empty() && task.family != family_) {
    throw Error("env: a '" + family_ + "' session cannot open a task of family '" + task.family + "'");
  }
  if (task.difficulty < 1 || task.difficulty > max_difficulty_) {
    throw Error("env " + family_ + ": difficulty " + std::to_string(task.difficulty) + " is out of range 1.." +
                std::to_string(max_difficulty_));
  }
  if (task.max_turns < 0) {
    throw Error("env " + family_ + ": max_turns must be >= 0 (0 = the family default), got " +
                std::to_string(task.max_turns));
  }
  start(task);
  turns_ = 0;
  done_ = false;
  success_ = false;
  max_turns_ = task.max_turns > 0 ? task.max_turns : default_max_turns();
  return intro();
}

void FamilySession::start(const TaskSpec& task) {
  spec_ = task;
  spec_.family = family_;
  Rng rng(mix_seed(mix_seed(hash_text(family_), static_cast<std::uint64_t>(task.difficulty)), task.seed));
  generate(rng);
  task_digest_ = mix_seed(hash_text(intro()), hash_text(hidden_task()));
  opened_ = true;
}

StepResult FamilySession::step(const std::string& action) {
  if (!opened_) throw Error("env " + family_ + ": step() before open()");
  if (done_) throw Error("env " + family_ + ": step() on a finished session (turn " + std::to_string(turns_) + ")");
  ++turns_;
  Outcome outcome;
  if (action.size() > kMaxActionBytes) {
    outcome = invalid("too long (" + std::to_string(action.size()) + " bytes)");
  } else {
    outcome = apply(parse_action(action));
  }

  StepResult result;
  result.observation = std::move(outcome.observation);
  const bool shaped = spec_.shaping == RewardShaping::Shaped;
  if (shaped) result.reward = outcome.invalid ? kInvalidPenalty : outcome.progress_reward;
  if (outcome.finished) {
    done_ = true;
    success_ = outcome.success;
    if (success_) result.reward += kSuccessReward;
  } else if (turns_ >= max_turns_) {
    done_ = true;
    success_ = false;
    result.observation += "\nout of turns";
  }
  result.done = done_;
  if (outcome.invalid) result.info["invalid"] = "1";
  for (auto& [key, value] : outcome.info) result.info[key] = value;
  if (done_) result.info["success"] = success_ ? "1" : "0";
  return result;
}

std::string FamilySession::expert_action(double error_rate, std::uint64_t seed) const {
  if (!opened_) throw Error("env " + family_ + ": expert_action() before open()");
  if (done_) throw Error("env " + family_ + ": expert_action() on a finished session");
  Rng rng(mix_seed(seed, 0x4578706572744163ULL));
  if (rng.chance(error_rate)) return expert_mistake(rng);
  return expert_best();
}

std::vector<std::uint8_t> FamilySession::snapshot() const {
  if (!opened_) throw Error("env " + family_ + ": snapshot() before open()");
  runtime::ByteWriter w;
  w.put_bytes(kMagic, sizeof(kMagic));
  w.put<std::uint8_t>(kContainerVersion);
  w.put_string(family_);
  w.put<std::uint32_t>(format_version_);
  w.put<std::int32_t>(spec_.difficulty);
  w.put<std::uint64_t>(spec_.seed);
  w.put<std::uint8_t>(spec_.shaping == RewardShaping::Shaped ? 1 : 0);
  w.put<std::int32_t>(spec_.max_turns);
  w.put<std::int32_t>(max_turns_);
  w.put<std::int32_t>(turns_);
  w.put<std::uint8_t>(done_ ? 1 : 0);
  w.put<std::uint8_t>(success_ ? 1 : 0);
  w.put<std::uint64_t>(task_digest_);
  save_state(w);
  const std::uint32_t crc = runtime::crc32(w.bytes().data(), w.bytes().size());
  w.put<std::uint32_t>(crc);
  return w.take();
}

void FamilySession::snapshot_error(const std::string& what) const {
  throw Error("env snapshot (" + family_ + " session): " + what);
}

void FamilySession::restore(const std::vector<std::uint8_t>& bytes) {
  // Strong guarantee: a refused snapshot leaves the session as it was.
  std::vector<std::uint8_t> backup;
  if (opened_) backup = snapshot();
  try {
    decode(bytes);
  } catch (...) {
    if (!backup.empty()) {
      decode(backup);
    } else {
      opened_ = false;
    }
    throw;
  }
}

void FamilySession::decode(const std::vector<std::uint8_t>& bytes) {
  constexpr size_t kMinSize = sizeof(kMagic) + 1 + sizeof(std::uint32_t);
  if (bytes.size() < kMinSize) {
    snapshot_error("too short (" + std::to_string(bytes.size()) + " bytes)");
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    snapshot_error("not an environment snapshot (bad magic)");
  }
  const size_t body = bytes.size() - sizeof(std::uint32_t);
  std::uint32_t stored_crc = 0;
  std::memcpy(&stored_crc, bytes.data() + body, sizeof(stored_crc));
  if (runtime::crc32(bytes.data(), body) != stored_crc) {
    snapshot_error("checksum mismatch: the bytes are corrupted");
  }
  try {
    runtime::ByteReader in(bytes.data() + sizeof(kMagic), body - sizeof(kMagic));
    const auto container = in.get<std::uint8_t>();
    snapshot_check(container == kContainerVersion, "container version " + std::to_string(container) +
                                                       " is not supported (expected " +
                                                       std::to_string(kContainerVersion) + ")");
    const std::string family = in.get_string();
    snapshot_check(family == family_, "the snapshot is of family " + quote(family, 32) +
                                          ", it cannot be restored into a '" + family_ + "' session");
    const auto version = in.get<std::uint32_t>();
    snapshot_check(version == format_version_, "format version " + std::to_string(version) +
                                                   " is not supported (expected " + std::to_string(format_version_) +
                                                   ")");
    TaskSpec task;
    task.family = family_;
    task.difficulty = in.get<std::int32_t>();
    task.seed = in.get<std::uint64_t>();
    const auto shaping = in.get<std::uint8_t>();
    task.max_turns = in.get<std::int32_t>();
    const auto max_turns = in.get<std::int32_t>();
    const auto turns = in.get<std::int32_t>();
    const auto done = in.get<std::uint8_t>();
    const auto success = in.get<std::uint8_t>();
    const auto digest = in.get<std::uint64_t>();
    snapshot_check(task.difficulty >= 1 && task.difficulty <= max_difficulty_,
                   "difficulty " + std::to_string(task.difficulty) + " out of range");
    snapshot_check(shaping <= 1, "bad reward shaping code " + std::to_string(shaping));
    task.shaping = shaping ? RewardShaping::Shaped : RewardShaping::Sparse;
    snapshot_check(task.max_turns >= 0 && max_turns > 0, "bad turn budget");
    snapshot_check(turns >= 0 && turns <= max_turns,
                   "turns taken " + std::to_string(turns) + " outside 0.." + std::to_string(max_turns));
    snapshot_check(done <= 1 && success <= 1 && (done || !success), "inconsistent done/success flags");
    snapshot_check(done || turns < max_turns, "a live session cannot have spent its budget");

    start(task);  // regenerates the static task
    snapshot_check(task_digest_ == digest,
                   "task digest mismatch (the task generator differs from the one that wrote it)");
    max_turns_ = max_turns;
    turns_ = turns;
    done_ = done != 0;
    success_ = success != 0;
    load_state(in);
    in.expect_end();
  } catch (const runtime::WireError& e) {
    snapshot_error(std::string("malformed: ") + e.what());
  }
}

}  // namespace moerl::env::detail
