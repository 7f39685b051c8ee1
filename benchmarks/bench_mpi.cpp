#include "bench_mpi.h"

#include <mpi.h>

#include <cstdlib>

#include "moerl/core/usable_cores.h"
#include "moerl/runtime/world.h"

namespace moerl::bench {

double max_over_ranks(double value) {
  double max = 0;
  MPI_Allreduce(&value, &max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return max;
}

double mean_over_ranks(double value) {
  double sum = 0;
  int ranks = 1;
  MPI_Allreduce(&value, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  return sum / ranks;
}

int compute_threads(int requested) {
  if (requested > 0) return requested;
  MPI_Comm host = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
  int ranks_on_host = 1;
  MPI_Comm_size(host, &ranks_on_host);
  MPI_Comm_free(&host);
  return runtime::choose_compute_threads(0, std::getenv("MOERL_THREADS_PER_RANK"), usable_cores(), ranks_on_host);
}

}  // namespace moerl::bench
