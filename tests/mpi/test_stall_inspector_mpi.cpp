// A collective that times out names the members that are not in it
// (comm/stall_inspector.h), on 3 ranks: members 0 and 1 wait while member 2
// is busy elsewhere or stopped from outside by SIGSTOP; each waiting member
// ends with a message that lists member 2 as missing and the other two as
// waiting, and the group still works afterwards.

#include <catch2/catch.hpp>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include "moerl/comm/mpi_communicator.h"

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
