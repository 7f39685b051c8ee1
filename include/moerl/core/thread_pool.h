#pragma once
// A pool of worker threads for blocking work (environment steps). It can
// grow: when the env worker abandons a step that overran its timeout, that
// step keeps its thread until it returns, so the pool adds a thread to keep
// the configured number free for new work.

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace moerl {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  // Stops taking work. Threads still running a task are detached and exit
  // when it returns (a hung environment step must not hang shutdown).
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void submit(std::function<void()> task);
  // Adds one thread; called when a running task is given up on.
  void add_thread();
  int threads() const;

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<std::function<void()>> tasks;
    bool stopping = false;
  };
  static void work(std::shared_ptr<State> state);

  std::shared_ptr<State> state_;
  std::vector<std::thread> threads_;
  mutable std::mutex threads_mutex_;
};

}  // namespace moerl
