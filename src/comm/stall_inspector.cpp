#include "moerl/comm/stall_inspector.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "moerl/core/check.h"
#include "moerl/core/join.h"

namespace moerl::comm {
namespace {

constexpr int kQuestionTag = 1;
constexpr int kAnswerTag = 2;
// An answer's text stays well inside MPI's eager limit, so sending it never
// waits for the asker (which may have stopped listening by then).
constexpr size_t kMaxWhat = 240;

std::string member_name(int member, const std::vector<int>& world_ranks) {
  std::string name = "member " + std::to_string(member);
  if (member < static_cast<int>(world_ranks.size()))
    name += " (job rank " + std::to_string(world_ranks[static_cast<size_t>(member)]) + ")";
  return name;
}

void put_int64(std::vector<char>& bytes, std::int64_t value) {
  const size_t at = bytes.size();
  bytes.resize(at + sizeof value);
  std::memcpy(bytes.data() + at, &value, sizeof value);
}

std::int64_t get_int64(const std::vector<char>& bytes, size_t index) {
  std::int64_t value = 0;
  std::memcpy(&value, bytes.data() + index * sizeof value, sizeof value);
  return value;
}

using Clock = std::chrono::steady_clock;

}  // namespace

std::string describe_missing(std::int64_t number, int self, const std::vector<MemberAnswer>& answers,
                             const std::vector<int>& world_ranks, double grace_s) {
  std::vector<std::string> missing, waiting, done;
  std::ostringstream grace;
  grace.precision(2);
  grace << grace_s;
  for (int m = 0; m < static_cast<int>(answers.size()); ++m) {
    const MemberAnswer& a = answers[static_cast<size_t>(m)];
    const std::string name = member_name(m, world_ranks);
    if (m == self) {
      waiting.push_back(name);
    } else if (a.state == MemberAnswer::State::Died) {
      missing.push_back(name + " died");
    } else if (a.state == MemberAnswer::State::NoAnswer) {
      missing.push_back(name + " did not answer within " + grace.str() +
                        " s (not waiting in any collective of this group: busy elsewhere, stopped or frozen)");
    } else if (a.newest < 0) {
      missing.push_back(name + " has not started any collective of this group");
    } else if (a.newest < number) {
      missing.push_back(name + " is still in collective #" + std::to_string(a.newest) +
                        (a.newest_finished ? " (finished)" : "") + ": " + a.newest_what);
    } else if (a.newest == number && !a.newest_finished) {
      waiting.push_back(name);
    } else {
      done.push_back(name);
    }
  }
  std::string text = "collective #" + std::to_string(number) + " of the group: ";
  if (missing.empty()) {
    text +=
        "every member answered from inside it or past it (the collective itself is stuck: "
        "mismatched collectives or a stalled transport)";
  } else {
    text += "missing " + join(missing, ", ");
  }
  text += "; waiting in it: " + join(waiting, ", ");
  if (!done.empty()) text += "; done with it: " + join(done, ", ");
  return text;
}

double stall_grace_s(double timeout_s) { return std::clamp(0.25 * timeout_s, 1.0, 5.0); }

StallInspector::StallInspector(MPI_Comm comm, std::vector<int> world_ranks) : world_ranks_(std::move(world_ranks)) {
  MOERL_MPI_CHECK(MPI_Comm_dup(comm, &side_));
  MOERL_MPI_CHECK(MPI_Comm_set_errhandler(side_, MPI_ERRORS_RETURN));
  MOERL_MPI_CHECK(MPI_Comm_rank(side_, &rank_));
  MOERL_MPI_CHECK(MPI_Comm_size(side_, &size_));
}

StallInspector::~StallInspector() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  drop_completed_sends();
  // A send still pending is to a member that never took it (stopped, or gone
  // with the job): its request and bytes are left behind, as an abandoned
  // collective's are, because MPI cannot take either back safely.
  for (PendingSend& send : sends_) new std::vector<char>(std::move(send.bytes));
  if (side_ != MPI_COMM_NULL) MPI_Comm_free(&side_);
}

std::int64_t StallInspector::started(std::string what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (what.size() > kMaxWhat) what.resize(kMaxWhat);
  newest_what_ = std::move(what);
  newest_finished_ = false;
  return ++newest_;
}

void StallInspector::finished(std::int64_t number) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (number == newest_) newest_finished_ = true;
}

int StallInspector::post(std::vector<char> bytes, int destination, int tag) {
  sends_.push_back(PendingSend{MPI_REQUEST_NULL, std::move(bytes)});
  PendingSend& send = sends_.back();
  const int code = MPI_Isend(send.bytes.data(), static_cast<int>(send.bytes.size()), MPI_BYTE, destination, tag, side_,
                             &send.request);
  if (code != MPI_SUCCESS) sends_.pop_back();
  return code;
}

void StallInspector::drop_completed_sends() {
  while (!sends_.empty()) {
    int flag = 0;
    if (MPI_Test(&sends_.front().request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 1;
    if (!flag) return;
    sends_.pop_front();
  }
}

void StallInspector::answer_one(MPI_Message message, const MPI_Status& status) {
  std::int64_t question = 0;
  if (MPI_Mrecv(&question, sizeof question, MPI_BYTE, &message, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
  std::vector<char> bytes;
  put_int64(bytes, question);
  put_int64(bytes, newest_);
  put_int64(bytes, newest_finished_ ? 1 : 0);
  bytes.insert(bytes.end(), newest_what_.begin(), newest_what_.end());
  post(std::move(bytes), status.MPI_SOURCE, kAnswerTag);  // an asker that died cannot be told; nothing to do
}

void StallInspector::answer_questions() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (;;) {
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, kQuestionTag, side_, &flag, &message, &status) != MPI_SUCCESS || !flag) break;
    answer_one(message, status);
  }
  drop_completed_sends();
}

std::vector<MemberAnswer> StallInspector::ask_everyone(std::int64_t question, double grace_s) {
  std::vector<MemberAnswer> answers(static_cast<size_t>(size_));
  int open = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int m = 0; m < size_; ++m) {
      if (m == rank_) continue;
      std::vector<char> bytes;
      put_int64(bytes, question);
      if (post(std::move(bytes), m, kQuestionTag) == MPI_SUCCESS) {
        ++open;
      } else {
        answers[static_cast<size_t>(m)].state = MemberAnswer::State::Died;
      }
    }
  }
  const auto deadline = Clock::now() + std::chrono::duration<double>(grace_s);
  while (open > 0 && Clock::now() < deadline) {
    answer_questions();  // the other waiting members are asking too
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, kAnswerTag, side_, &flag, &message, &status) != MPI_SUCCESS) break;
    if (!flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    std::vector<char> bytes(static_cast<size_t>(std::max(count, 0)));
    if (MPI_Mrecv(bytes.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE) != MPI_SUCCESS) continue;
    if (bytes.size() < 3 * sizeof(std::int64_t) || get_int64(bytes, 0) != question) continue;  // an older question's
    MemberAnswer& answer = answers[static_cast<size_t>(status.MPI_SOURCE)];
    if (answer.state == MemberAnswer::State::Answered) continue;
    answer.state = MemberAnswer::State::Answered;
    answer.newest = get_int64(bytes, 1);
    answer.newest_finished = get_int64(bytes, 2) != 0;
    answer.newest_what.assign(bytes.begin() + 3 * sizeof(std::int64_t), bytes.end());
    --open;
  }
  return answers;
}

std::string StallInspector::missing_from(std::int64_t number, double grace_s) {
  try {
    std::int64_t question = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      question = next_question_++;
    }
    return describe_missing(number, rank_, ask_everyone(question, grace_s), world_ranks_, grace_s);
  } catch (const std::exception& e) {
    return std::string("could not ask the other members which collective they are in: ") + e.what();
  }
}

}  // namespace moerl::comm
