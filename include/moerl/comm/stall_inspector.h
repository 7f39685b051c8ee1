#pragma once
// Who is missing from a collective that timed out: the question Horovod's
// stall inspector answers, asked only once a wait has run out.
//
// Every member of a group starts the group's collectives in the same order
// (MPI requires it), so numbering them as they start gives the same number
// to the same collective on every member. A member whose wait ran out asks
// every other member, on a side channel (a duplicate of the group's MPI
// communicator), which collective it is in. Members answer whenever they
// test a request of the group, so one waiting in any collective of the group
// answers within milliseconds; one that is computing, blocked elsewhere,
// stopped (SIGSTOP) or frozen does not answer at all, and one that died
// refuses the question (fault-tolerant MPI). Nothing travels while
// collectives complete in time: the cost is one MPI_Improbe per test.
//
// Written here rather than taken from a library: it is the communicator's
// own bookkeeping (which collective is which), and no MPI library offers it.

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace moerl::comm {

// What one member said when asked.
struct MemberAnswer {
  enum class State { NoAnswer, Died, Answered };
  State state = State::NoAnswer;
  std::int64_t newest = -1;      // the newest collective it has started (-1: none yet)
  bool newest_finished = false;  // ... and whether it has finished its part of it
  std::string newest_what;       // "MPI broadcast of 12 byte from rank 0 in sync group"
};

// The text of a stall report: who waits in collective `number` (started by
// `self`), who is behind (in an older collective, or in none: `answers`
// holds one entry per member, `self` included), who died. Members are named
// by their group rank and their job rank (`world_ranks`).
std::string describe_missing(std::int64_t number, int self, const std::vector<MemberAnswer>& answers,
                             const std::vector<int>& world_ranks, double grace_s);

// How long a member whose wait ran out listens for answers: long enough for
// a loaded host to schedule the members that are waiting, short next to the
// timeout it follows.
double stall_grace_s(double timeout_s);

class StallInspector {
 public:
  // Duplicates `comm` (collective over its members).
  StallInspector(MPI_Comm comm, std::vector<int> world_ranks);
  ~StallInspector();
  StallInspector(const StallInspector&) = delete;
  StallInspector& operator=(const StallInspector&) = delete;

  // A collective this member starts; returns its number.
  std::int64_t started(std::string what);
  void finished(std::int64_t number);
  // Answers the questions other members have sent; cheap when there are none.
  void answer_questions();
  // Asks every other member which collective it is in, listens for up to
  // `grace_s`, and returns describe_missing's text for collective `number`.
  // Never throws: a failure to ask is said in the text.
  std::string missing_from(std::int64_t number, double grace_s);

 private:
  struct PendingSend {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<char> bytes;
  };
  int post(std::vector<char> bytes, int destination, int tag);
  void drop_completed_sends();
  void answer_one(MPI_Message message, const MPI_Status& status);
  std::vector<MemberAnswer> ask_everyone(std::int64_t question, double grace_s);

  std::mutex mutex_;  // requests of one group may be tested from more than one thread
  MPI_Comm side_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;
  std::int64_t newest_ = -1;
  bool newest_finished_ = false;
  std::string newest_what_;
  std::int64_t next_question_ = 0;
  std::deque<PendingSend> sends_;
};

}  // namespace moerl::comm
