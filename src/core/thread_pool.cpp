#include "moerl/core/thread_pool.h"

namespace moerl {

ThreadPool::ThreadPool(int threads) : state_(std::make_shared<State>()) {
  for (int i = 0; i < std::max(1, threads); ++i) add_thread();
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
    state_->tasks.clear();
  }
  state_->wake.notify_all();
  for (std::thread& t : threads_) t.detach();
}

void ThreadPool::work(std::shared_ptr<State> state) {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(state->mutex);
      state->wake.wait(lock, [&] { return state->stopping || !state->tasks.empty(); });
      if (state->stopping) return;
      task = std::move(state->tasks.front());
      state->tasks.pop_front();
    }
    task();
  }
}

void ThreadPool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->tasks.push_back(std::move(task));
  }
  state_->wake.notify_one();
}

void ThreadPool::add_thread() {
  std::lock_guard<std::mutex> lock(threads_mutex_);
  threads_.emplace_back(&ThreadPool::work, state_);
}

int ThreadPool::threads() const {
  std::lock_guard<std::mutex> lock(threads_mutex_);
  return static_cast<int>(threads_.size());
}

}  // namespace moerl
