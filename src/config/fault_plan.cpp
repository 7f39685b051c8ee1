#include "moerl/config/fault_plan.h"

#include <cstdlib>
#include <sstream>

#include "moerl/core/error.h"

namespace moerl::config {
namespace {

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw Error("[faults] plan entry \"" + text + "\": " + why +
              " (forms: \"kill|freeze|exit ROLE INDEX at step N\", \"... at S s\", \"slow ROLE INDEX by MS ms at "
              "step N\", \"kill actor INDEX while receiving\", \"corrupt bucket at step N\", \"corrupt message ROLE "
              "INDEX at step N\"; any of them may end with \"on every attempt\")");
}

std::string parse_role(const std::string& text, const std::string& word) {
  if (word == "learner" || word == "actor" || word == "env_worker" || word == "standby_actor") return word;
  bad(text, "unknown role '" + word + "' (learner, actor, env_worker, standby_actor)");
}

double parse_number(const std::string& text, const std::string& word, const char* what) {
  char* end = nullptr;
  const double value = std::strtod(word.c_str(), &end);
  if (word.empty() || *end != '\0' || value < 0) bad(text, std::string("expected ") + what + ", got '" + word + "'");
  return value;
}

// "at step N" | "at S s" | "while receiving", from words[at] on; the words left must be none.
void parse_trigger(const std::string& text, const std::vector<std::string>& words, size_t at, FaultAction& action) {
  const size_t left = words.size() - at;
  if (left == 2 && words[at] == "while" && words[at + 1] == "receiving") {
    action.trigger = FaultTrigger::TriggerReceiving;
    return;
  }
  if (left == 3 && words[at] == "at" && words[at + 1] == "step") {
    action.trigger = FaultTrigger::TriggerStep;
    action.when = parse_number(text, words[at + 2], "a step number");
    return;
  }
  if (left == 3 && words[at] == "at" && words[at + 2] == "s") {
    action.trigger = FaultTrigger::TriggerSeconds;
    action.when = parse_number(text, words[at + 1], "seconds");
    return;
  }
  bad(text, "expected \"at step N\", \"at S s\" or \"while receiving\"");
}

}  // namespace

FaultAction parse_fault(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  if (words.empty()) bad(text, "empty");
  FaultAction action;
  action.text = text;
  if (words.size() > 3 && words[words.size() - 3] == "on" && words[words.size() - 2] == "every" &&
      words.back() == "attempt") {
    action.every_attempt = true;
    words.resize(words.size() - 3);
  }
  const std::string& verb = words[0];
  if (verb == "corrupt") {
    if (words.size() >= 2 && words[1] == "bucket") {
      action.kind = FaultKind::FaultCorruptBucket;
      action.role = "learner";
      parse_trigger(text, words, 2, action);
    } else if (words.size() >= 4 && words[1] == "message") {
      action.kind = FaultKind::FaultCorruptMessage;
      action.role = parse_role(text, words[2]);
      action.index = static_cast<int>(parse_number(text, words[3], "a role index"));
      parse_trigger(text, words, 4, action);
    } else {
      bad(text, "corrupt what? (bucket, message)");
    }
    if (action.trigger == FaultTrigger::TriggerReceiving) bad(text, "\"while receiving\" is for kill only");
    return action;
  }
  if (words.size() < 3) bad(text, "too short");
  if (verb == "kill")
    action.kind = FaultKind::FaultKill;
  else if (verb == "freeze")
    action.kind = FaultKind::FaultFreeze;
  else if (verb == "exit")
    action.kind = FaultKind::FaultExit;
  else if (verb == "slow")
    action.kind = FaultKind::FaultSlow;
  else
    bad(text, "unknown fault '" + verb + "' (kill, freeze, exit, slow, corrupt)");
  action.role = parse_role(text, words[1]);
  action.index = static_cast<int>(parse_number(text, words[2], "a role index"));
  size_t at = 3;
  if (action.kind == FaultKind::FaultSlow) {
    if (words.size() < 6 || words[3] != "by" || words[5] != "ms")
      bad(text, "expected \"slow ROLE INDEX by MS ms ...\"");
    action.slow_ms = parse_number(text, words[4], "milliseconds");
    at = 6;
  }
  parse_trigger(text, words, at, action);
  if (action.trigger == FaultTrigger::TriggerReceiving &&
      (action.kind != FaultKind::FaultKill || (action.role != "actor" && action.role != "standby_actor")))
    bad(text, "\"while receiving\" is for killing an actor");
  return action;
}

std::vector<FaultAction> parse_fault_plan(const std::vector<std::string>& entries) {
  std::vector<FaultAction> plan;
  for (const std::string& entry : entries) plan.push_back(parse_fault(entry));
  return plan;
}

}  // namespace moerl::config
