// at::parallel_for in moerl's own code runs on several threads. It is inline,
// and with LibTorch's OpenMP backend it splits work only where the caller was
// compiled with OpenMP; moerl's operators once ran on one thread at every
// thread count because of that (CMakeLists.txt, moerl_flags).

#include <catch2/catch.hpp>

#include <ATen/Parallel.h>

#include <mutex>
#include <set>
#include <thread>

TEST_CASE("at::parallel_for in moerl's code uses the threads it is given", "[model][threads]") {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  std::mutex mutex;
  std::set<std::thread::id> threads;
  at::parallel_for(0, 64, 1, [&](std::int64_t, std::int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(std::this_thread::get_id());
  });
  at::set_num_threads(before);
  CHECK(threads.size() == 2);
}
