// A collective that times out names the members that are not in it
// (comm/stall_inspector.h), on 3 ranks: members 0 and 1 wait while member 2
// is busy elsewhere or stopped from outside by SIGSTOP; each waiting member
// ends with a message that lists member 2 as missing and the other two as
// waiting, and the group still works afterwards. A weight publication that
// one actor does not take names that actor the same way.

#include <catch2/catch.hpp>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include "moerl/comm/mpi_communicator.h"
#include "moerl/sync/weight_sync.h"

using namespace moerl;

namespace {

constexpr double kTimeout = 0.5;  // plus stall_grace_s's 1 s of asking

// Every rank's process id, so that one rank can signal another from outside.
std::vector<int> process_ids() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> pids(static_cast<size_t>(size));
  const int mine = static_cast<int>(getpid());
  MPI_Allgather(&mine, 1, MPI_INT, pids.data(), 1, MPI_INT, MPI_COMM_WORLD);
  return pids;
}

std::string timeout_of_allreduce(comm::Communicator& comm) {
  int value = 1;
  try {
    comm.allreduce_sum(&value, 1, comm::DataType::Byte, kTimeout);
  } catch (const comm::CommTimeout& e) {
    return e.what();
  }
  return "(no timeout)";
}

// Member 2 joins the abandoned all-reduce late, so that it completes before
// the communicator is freed, then every member checks the group still sums.
void rejoin_and_check(comm::Communicator& comm) {
  if (comm.rank() == 2) {
    int value = 1;
    comm.allreduce_sum(&value, 1, comm::DataType::Byte, 30);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::int64_t value = comm.rank() + 1;
  comm.allreduce_sum(&value, 1, comm::DataType::Int64, 30);
  CHECK(value == 6);
}

void check_names_member_2_missing(const std::string& message) {
  INFO(message);
  CHECK_THAT(message, Catch::Contains("MPI all-reduce of 1 byte in stall group did not complete within"));
  CHECK_THAT(message, Catch::Contains("missing member 2 (job rank 2)"));
  CHECK_THAT(message, Catch::Contains("waiting in it: member 0 (job rank 0), member 1 (job rank 1)"));
}

}  // namespace

TEST_CASE("a timed-out collective names the member busy elsewhere", "[stall]") {
  comm::MpiCommunicator comm(MPI_COMM_WORLD, "stall group");
  if (comm.rank() != 2) {
    const std::string message = timeout_of_allreduce(comm);
    check_names_member_2_missing(message);
    CHECK_THAT(message, Catch::Contains("did not answer within 1 s"));
    // Both waiting members ask at about the same time; each answers the other.
    CHECK_THAT(message, !Catch::Contains("member " + std::to_string(1 - comm.rank()) + " (job rank " +
                                         std::to_string(1 - comm.rank()) + ") did not answer"));
  }
  MPI_Barrier(MPI_COMM_WORLD);  // member 2 is here, outside the group, until the others gave up
  rejoin_and_check(comm);
}

TEST_CASE("a timed-out collective names the member stopped by SIGSTOP", "[stall]") {
  comm::MpiCommunicator comm(MPI_COMM_WORLD, "stall group");
  const std::vector<int> pids = process_ids();
  int token = 0;
  if (comm.rank() == 2) {
    // Waits for member 0 outside the group; member 0 stops it meanwhile.
    MPI_Recv(&token, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else {
    if (comm.rank() == 0) REQUIRE(kill(pids[2], SIGSTOP) == 0);
    const std::string message = timeout_of_allreduce(comm);
    check_names_member_2_missing(message);
    CHECK_THAT(message, Catch::Contains("did not answer within 1 s"));
    if (comm.rank() == 0) {
      REQUIRE(kill(pids[2], SIGCONT) == 0);
      MPI_Send(&token, 1, MPI_INT, 2, 7, MPI_COMM_WORLD);
    }
  }
  rejoin_and_check(comm);
}

TEST_CASE("a timed-out weight publication names the actor that does not take it", "[stall]") {
  comm::MpiCommunicator comm(MPI_COMM_WORLD, "stall group");
  std::vector<float> weights(200000, 1.0f);  // 800 kB: past the eager limit, so the root waits for every receiver
  const std::vector<sync::WeightView> views = {{"w", weights.data(), weights.size() * sizeof(float)}};
  sync::SyncOptions options;
  int token = 0;
  if (comm.rank() == 0) {
    options.timeout_s = kTimeout;
    sync::WeightPublisher publisher(comm, views, options);
    publisher.publish(1);
    std::string message = "(no timeout)";
    try {
      publisher.finish();
    } catch (const comm::CommTimeout& e) {
      message = e.what();
    }
    INFO(message);
    CHECK_THAT(message, Catch::Contains("publication of weights version 1 in stall group did not complete"));
    CHECK_THAT(message, Catch::Contains("missing member 2 (job rank 2) did not answer within 1 s"));
    CHECK_THAT(message, !Catch::Contains("member 1 (job rank 1) did not answer"));
    // Member 2 joins now; the abandoned publication completes and closes.
    MPI_Send(&token, 1, MPI_INT, 2, 7, MPI_COMM_WORLD);
    const double deadline = MPI_Wtime() + 30;
    while (publisher.in_flight()) {
      REQUIRE(MPI_Wtime() < deadline);
      try {
        publisher.progress();
      } catch (const comm::CommTimeout&) {
        // still the abandoned version's deadline, until member 2 has taken it
      }
    }
    publisher.close();
  } else {
    // Member 2 is busy outside the group until member 0 has given up.
    if (comm.rank() == 2) MPI_Recv(&token, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    options.timeout_s = 30;
    std::vector<float> received(weights.size(), 0.0f);
    sync::WeightReceiver receiver(comm, {{"w", received.data(), received.size() * sizeof(float)}}, options);
    while (!receiver.closed()) {
      if (receiver.poll()) receiver.apply();
    }
    CHECK(receiver.current_version() == 1);
    CHECK(received == weights);
  }
}
