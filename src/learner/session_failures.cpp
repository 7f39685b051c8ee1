#include "moerl/learner/session_failures.h"

#include <sstream>

namespace moerl::learner {

void FailureTally::add(const std::string& family, const std::string& reason, std::int64_t count) {
  counts_[family][reason] += count;
}

void FailureTally::add(const FailureTally& other) {
  for (const auto& [family, reasons] : other.counts_)
    for (const auto& [reason, count] : reasons) add(family, reason, count);
}

std::int64_t FailureTally::total() const {
  std::int64_t sum = 0;
  for (const auto& [family, reasons] : counts_) sum += of(family);
  return sum;
}

std::int64_t FailureTally::of(const std::string& family) const {
  const auto it = counts_.find(family);
  if (it == counts_.end()) return 0;
  std::int64_t sum = 0;
  for (const auto& [reason, count] : it->second) sum += count;
  return sum;
}

void FailureTally::write_json(JsonWriter& json) const {
  json.begin_object();
  for (const auto& [family, reasons] : counts_) {
    json.key(family).begin_object();
    for (const auto& [reason, count] : reasons) json.key(reason).value(count);
    json.end_object();
  }
  json.end_object();
}

FailureTally FailureTally::from_json(const JsonValue& value) {
  FailureTally tally;
  for (const auto& [family, reasons] : value.as_object())
    for (const auto& [reason, count] : reasons.as_object())
      tally.add(family, reason, static_cast<std::int64_t>(count.as_number()));
  return tally;
}

std::string FailureTally::describe() const {
  if (counts_.empty()) return "none";
  std::ostringstream out;
  bool first_family = true;
  for (const auto& [family, reasons] : counts_) {
    out << (first_family ? "" : ", ") << family << " " << of(family) << " (";
    bool first_reason = true;
    for (const auto& [reason, count] : reasons) {
      out << (first_reason ? "" : ", ") << reason << " " << count;
      first_reason = false;
    }
    out << ")";
    first_family = false;
  }
  return out.str();
}

FamilyBreaker::FamilyBreaker(std::int64_t failures_to_pause, double cooldown_s)
    : failures_to_pause_(failures_to_pause), cooldown_s_(cooldown_s) {}

bool FamilyBreaker::on_failure(const std::string& family, std::int32_t streak, const std::string& error, double now) {
  if (failures_to_pause_ <= 0 || streak < failures_to_pause_ || is_paused(family, now)) return false;
  State& state = families_[family];
  state.paused_until = now + cooldown_s_;
  state.error = error;
  ++pauses_;
  return true;
}

bool FamilyBreaker::is_paused(const std::string& family, double now) const {
  const auto it = families_.find(family);
  return it != families_.end() && now < it->second.paused_until;
}

std::set<std::string> FamilyBreaker::paused(double now) const {
  std::set<std::string> out;
  for (const auto& [family, state] : families_)
    if (now < state.paused_until) out.insert(family);
  return out;
}

std::string FamilyBreaker::last_error(const std::string& family) const {
  const auto it = families_.find(family);
  return it == families_.end() ? std::string() : it->second.error;
}

}  // namespace moerl::learner
