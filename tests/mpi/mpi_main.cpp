// Catch2 main for the multi-rank tests: MPI is initialised once around the
// whole session, every rank runs the same tests, and the process's exit code
// is non-zero on any rank whose assertions failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <mpi.h>

#include "moerl/core/blas_kernels.h"

int main(int argc, char** argv) {
  moerl::blas::select_kernels(argv);  // before MPI: it may start the binary afresh
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Catch::Session session;
  // Only rank 0 prints passing summaries; every rank prints its failures.
  const int failures = session.run(argc, argv);
  int any_failed = failures > 0 ? 1 : 0, global = 0;
  MPI_Allreduce(&any_failed, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return global ? 1 : 0;
}
