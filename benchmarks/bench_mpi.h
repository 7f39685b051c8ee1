#pragma once
// What the multi-rank benchmarks (bench ep, bench grads) share: reductions of
// a per-rank measurement over MPI_COMM_WORLD and the compute threads a rank
// uses. Call after MPI is initialised.

namespace moerl::bench {

// The largest value over the ranks: a step waits for its slowest rank.
double max_over_ranks(double value);
double mean_over_ranks(double value);

// The rule the jobs use (runtime/world.h): `requested` when > 0 (--threads),
// else MOERL_THREADS_PER_RANK (launch.sh sets 1 when ranks outnumber cores),
// else this process's cores shared among the ranks on its host.
int compute_threads(int requested);

}  // namespace moerl::bench
