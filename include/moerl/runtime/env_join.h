#pragma once
// Env workers that join a running job: the environment tier scales back up
// after a release (`moerl ctl add-env`). A new process takes the rank of an
// env worker that left (released or lost), so the job's layout, the actors'
// session placement and every message keep their ranks.
//
// How it joins (measured with the Open MPI 5.0.11 that scripts/setup.sh
// installs, under `mpirun --with-ft ulfm`): MPI_Comm_open_port /
// MPI_Comm_accept / MPI_Comm_connect never completed, while a collective
// MPI_Comm_spawn did, also over a communicator shrunk after a member died.
// So learner 0 and every living actor and standby actor (the ranks that talk
// to env workers; World::join_comm) spawn the new process together, each from
// a thread of its own (EnvJoinService) so that no role's loop waits on it.
// Each then reaches the new rank through the spawn's intercommunicator
// (Mailbox::route_peer); the new process reaches each of them the same way
// (join_parents: every parent says which job rank it is).
//
// Learner 0 decides (learner/coordinator_join.cpp): once its spawn returned,
// the rank lives again (LostRanks::rejoin), its heartbeats are watched anew,
// and every living rank is told (RankRejoined); actors then place sessions
// on it again.

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/wire.h"

namespace moerl::runtime {

// Learner 0 -> actors and standby actors: spawn `rank` anew, together.
struct EnvJoinStart {
  static constexpr MessageType kType = MessageType::EnvJoinStart;
  std::int32_t rank = -1;
  std::string config_path;   // the job's resolved configuration, written by learner 0
  std::int32_t threads = 1;  // the new env worker's compute threads
  void encode(ByteWriter& w) const;
  static EnvJoinStart decode(ByteReader& r);
};

// Learner 0 -> every living rank: `rank` lives again (runtime/lost_ranks.h).
struct RankRejoined {
  static constexpr MessageType kType = MessageType::RankRejoined;
  std::int32_t rank = -1;
  void encode(ByteWriter& w) const;
  static RankRejoined decode(ByteReader& r);
};

// The arguments of `moerl join-env` that spawn a new env worker for `start`
// in a job of `world_size` ranks (argv[0] excluded, as MPI_Comm_spawn wants).
std::vector<std::string> join_env_arguments(const EnvJoinStart& start, int world_size);

// The parents' side, on learner 0 and on every actor and standby actor.
class EnvJoinService {
 public:
  enum class State { Idle, Spawning, Joined, Failed };

  // `join_comm`: learner 0, the actors and standby actors (World::join_comm).
  // On actors, the service's thread takes learner 0's EnvJoinStart itself.
  EnvJoinService(Mailbox& mailbox, MPI_Comm join_comm, int world_size);
  ~EnvJoinService();
  EnvJoinService(const EnvJoinService&) = delete;
  EnvJoinService& operator=(const EnvJoinService&) = delete;

  // Learner 0: spawn for `start` (one join at a time).
  void request(const EnvJoinStart& start);
  State state() const { return state_.load(); }
  std::string error() const;  // why the last join failed
  // The last join's spawn is done or failed: the next may start.
  void reset();

 private:
  void run();
  void spawn(const EnvJoinStart& start);
  void failed(const std::string& why);

  Mailbox& mailbox_;
  MPI_Comm join_comm_;
  int world_size_;
  std::atomic<State> state_{State::Idle};
  std::atomic<bool> stop_{false};
  mutable std::mutex mutex_;
  std::optional<EnvJoinStart> pending_;
  std::string error_;
  std::thread thread_;
};

// The joining process's side: the spawn's parents and their job ranks, in
// the order of the intercommunicator's remote group. Throws when this
// process was not spawned by a job, or a parent does not say who it is
// within `timeout_s`.
struct JoinParents {
  MPI_Comm intercomm = MPI_COMM_NULL;
  std::vector<int> job_ranks;
};
JoinParents join_parents(double timeout_s);

}  // namespace moerl::runtime
