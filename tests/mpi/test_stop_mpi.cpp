// A SIGTERM delivered to one rank stops every rank cleanly: the signalled
// rank tells learner 0, learner 0 tells everyone, all loops return.

#include <catch2/catch.hpp>
#include <mpi.h>

#include <csignal>

#include "moerl/runtime/job_control.h"

using namespace moerl::runtime;

TEST_CASE("SIGTERM on one rank stops every rank with the reason", "[stop]") {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  {
    Mailbox mailbox(comm, 20.0);
    install_stop_signal_handlers();
    reset_stop_signal();
    StopCoordinator stop(mailbox);
    const int victim = mailbox.size() - 1;
    const double start = monotonic_seconds();
    int iterations = 0;
    while (!stop.should_stop()) {
      ++iterations;
      if (mailbox.rank() == victim && iterations == 50) std::raise(SIGTERM);
      REQUIRE(monotonic_seconds() - start < 20.0);  // a hang fails instead of blocking ctest
      usleep(1000);
    }
    CHECK(stop.reason() == "signal 15 on rank " + std::to_string(victim));
    // Only the victim saw a signal; the others stopped because they were told to.
    CHECK((stop_signal_received() == SIGTERM) == (mailbox.rank() == victim));
    reset_stop_signal();
  }
  MPI_Barrier(comm);
  MPI_Comm_free(&comm);
}
