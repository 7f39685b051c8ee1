// A two-rank program for cli.finalize_deadline (tests/cli/test_finalize_deadline.sh):
// rank 1 writes its pid to <dir>/rank-1.pid and idles (the test SIGSTOPs it
// there); rank 0 waits for that file, then ends with
// MpiSession::finalize_within(<deadline>, 7), whose MPI_Finalize cannot
// complete while rank 1 is stopped. Rank 0 must end with status 7 after
// about <deadline> seconds, saying why.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <unistd.h>

#include "moerl/runtime/mpi_session.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: finalize_probe DIR DEADLINE_S\n");
    return 2;
  }
  const std::string dir = argv[1];
  const double deadline_s = std::stod(argv[2]);
  moerl::runtime::MpiSession mpi(&argc, &argv);
  const std::string pid_file = dir + "/rank-1.pid";
  if (mpi.world_rank() == 1) {
    std::ofstream(pid_file + ".tmp") << getpid() << "\n";
    std::filesystem::rename(pid_file + ".tmp", pid_file);
    std::this_thread::sleep_for(std::chrono::seconds(60));  // the test stops this rank here, then kills it
    return 0;
  }
  for (int i = 0; i < 600 && !std::filesystem::exists(pid_file); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::seconds(1));  // time for the test's SIGSTOP
  std::printf("rank 0: finalizing\n");
  std::fflush(stdout);
  mpi.finalize_within(deadline_s, 7);
  std::printf("rank 0: MPI_Finalize returned\n");
  return 0;
}
