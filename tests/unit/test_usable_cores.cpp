// Sizing compute threads by the cores a process may use: cgroup v2 quotas
// read from cpu.max text, and the live answer bounded by the machine and the
// affinity mask.

#include <sched.h>

#include <catch2/catch.hpp>
#include <thread>

#include "moerl/core/usable_cores.h"

using moerl::cores_from_cpu_max;

TEST_CASE("a cgroup v2 cpu.max quota gives whole cores, rounded up", "[cores]") {
  CHECK(cores_from_cpu_max("200000 100000") == 2);
  CHECK(cores_from_cpu_max("150000 100000\n") == 2);  // 1.5 cores: two threads, each busy part of the time
  CHECK(cores_from_cpu_max("50000 100000") == 1);
  CHECK(cores_from_cpu_max("400000 100000") == 4);
  CHECK_FALSE(cores_from_cpu_max("max 100000").has_value());
  CHECK_FALSE(cores_from_cpu_max("").has_value());
  CHECK_FALSE(cores_from_cpu_max("lots 100000").has_value());
  CHECK_FALSE(cores_from_cpu_max("100000").has_value());
}

TEST_CASE("usable cores are within the machine and the affinity mask", "[cores]") {
  const int cores = moerl::usable_cores();
  CHECK(cores >= 1);
  CHECK(cores <= static_cast<int>(std::thread::hardware_concurrency()));
  cpu_set_t mask;
  CPU_ZERO(&mask);
  REQUIRE(sched_getaffinity(0, sizeof(mask), &mask) == 0);
  CHECK(cores <= CPU_COUNT(&mask));
  // Narrowed to one core, the process may use one.
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) {
      CPU_SET(c, &one);
      break;
    }
  REQUIRE(sched_setaffinity(0, sizeof(one), &one) == 0);
  CHECK(moerl::usable_cores() == 1);
  REQUIRE(sched_setaffinity(0, sizeof(mask), &mask) == 0);
}
