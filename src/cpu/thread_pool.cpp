#include "cpu/thread_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "mlakit/threads.hpp"

namespace mlakit::cpu {
namespace {

int threads_from_environment() {
  if (const int n = thread_count_setting(std::getenv("MLAKIT_NUM_THREADS"))) return n;
  if (const int n = thread_count_setting(std::getenv("OMP_NUM_THREADS"))) return n;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) return std::max(1, CPU_COUNT(&allowed));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

thread_local bool inside_loop_body = false;

class ThreadPool {
 public:
  // threads - 1 workers: the calling thread is the last. They live as long as the process.
  explicit ThreadPool(int threads) {
    for (int i = 1; i < threads; ++i) std::thread([this] { work(); }).detach();
    workers_ = threads - 1;
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void run(int64_t begin, int64_t end, LoopBody body) {
    std::unique_lock owner(owner_, std::try_to_lock);
    if (!owner.owns_lock() || inside_loop_body || workers_ == 0) {
      run_serially(begin, end, body);
      return;
    }
    // Wake no more workers than there are items besides the caller's first.
    const int wanted = static_cast<int>(std::min<int64_t>(end - begin - 1, workers_));
    {
      std::lock_guard lock(mutex_);
      body_ = body;
      next_.store(begin, std::memory_order_relaxed);
      end_ = end;
      error_ = nullptr;
      tickets_ = wanted;
    }
    for (int i = 0; i < wanted; ++i) wake_.notify_one();
    take_items();
    std::unique_lock lock(mutex_);
    tickets_ = 0;  // workers still asleep are not needed any more
    done_.wait(lock, [this] { return running_ == 0; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static void run_serially(int64_t begin, int64_t end, LoopBody body) {
    for (int64_t i = begin; i < end; ++i) body.body(body.context, i);
  }

  // Runs items until none is left; the first exception stops the hand-out.
  void take_items() {
    inside_loop_body = true;
    for (int64_t i = next_.fetch_add(1); i < end_; i = next_.fetch_add(1)) {
      try {
        body_.body(body_.context, i);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(end_);
      }
    }
    inside_loop_body = false;
  }

  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return tickets_ > 0; });
      --tickets_;
      ++running_;
      lock.unlock();
      take_items();
      lock.lock();
      if (--running_ == 0) done_.notify_one();
    }
  }

  std::mutex owner_;  // held by the host thread whose loop the pool runs
  std::mutex mutex_;  // guards everything below but next_
  std::condition_variable wake_;
  std::condition_variable done_;
  int workers_ = 0;
  LoopBody body_{};
  std::atomic<int64_t> next_{0};
  int64_t end_ = 0;
  int tickets_ = 0;  // workers the current loop may still take
  int running_ = 0;  // workers inside the current loop
  std::exception_ptr error_;
};

// The process's pool, created at the first parallel loop and never destroyed (a host's static
// destructors may still run loops). A child of fork() has none of its parent's workers, so the
// child forgets the parent's pool (left alone: its mutexes may be held by threads that do not
// exist there) and creates its own at its first loop.
std::atomic<ThreadPool*> current_pool{nullptr};
std::mutex pool_creation;

ThreadPool& pool() {
  if (ThreadPool* p = current_pool.load(std::memory_order_acquire)) return *p;
  std::lock_guard lock(pool_creation);
  if (ThreadPool* p = current_pool.load(std::memory_order_acquire)) return *p;
  static const bool fork_handler = [] {
    return pthread_atfork(nullptr, nullptr, [] { current_pool.store(nullptr); }) == 0;
  }();
  (void)fork_handler;
  auto* created = new ThreadPool(num_threads());  // NOLINT: lives as long as the process
  current_pool.store(created, std::memory_order_release);
  return *created;
}

}  // namespace

int num_threads() {
  static const int threads = threads_from_environment();
  return threads;
}

void run_on_pool(int64_t begin, int64_t end, LoopBody body) { pool().run(begin, end, body); }

}  // namespace mlakit::cpu
