#pragma once
// MPI for the life of the process: initialised with the thread level moerl
// needs, finalised once. Heartbeat and I/O threads call MPI while compute
// threads run, so MPI_THREAD_MULTIPLE is required and checked.

#include <mpi.h>

#include <memory>

namespace moerl::runtime {

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  int provided_thread_level() const { return provided_; }

  // MPI_Finalize with a deadline, for the end of a job that may have lost
  // ranks. Open MPI 5's ULFM can keep the survivors inside MPI_Finalize for
  // ever after a rank was SIGKILLed, although MPI had reported it dead
  // (seen under load in cli.failover: every survivor spinning in
  // ompi_mpi_finalize). Past `deadline_s` this process ends itself with
  // `status`, after logging why; under ULFM mpirun accepts a rank that ends
  // without MPI_Finalize. The destructor then has nothing left to do.
  void finalize_within(double deadline_s, int status);

 private:
  int rank_ = 0;
  int size_ = 1;
  int provided_ = 0;
  MPI_Comm abort_channel_ = MPI_COMM_NULL;  // a duplicate of the world for abort_job()
};

// An intercommunicator to processes outside this job's world (an env
// worker that joined the running job, runtime/env_join.h). Every one is
// disconnected before MPI_Finalize (finalize_within: within its deadline):
// measured with Open MPI 5.0.11 under ULFM, learner 0 and the actors that
// had spawned a process never returned from MPI_Finalize otherwise.
void remember_intercomm(MPI_Comm intercomm);

// A session when MPI is not initialised yet, else null: for code (such as a
// benchmark) that may run inside or outside a command that started MPI.
std::unique_ptr<MpiSession> start_mpi_unless_running();

// "MPI_THREAD_MULTIPLE" and the like.
const char* thread_level_name(int level);

}  // namespace moerl::runtime
