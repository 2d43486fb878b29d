// The CPU backend's thread pool (src/cpu/thread_pool.hpp): every item runs exactly once, from any
// number of host threads and from inside a loop body; an exception reaches the caller; a child of
// fork() gets working threads of its own.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/parallel.hpp"
#include "mlakit/threads.hpp"

namespace mlakit::cpu {
namespace {

// Items per loop: several per thread on any machine, so that every worker takes some.
constexpr int64_t kItems = 1000;

// Counts how often each item of [0, n) ran.
std::vector<int> visits_of_loop(int64_t begin, int64_t end) {
  std::vector<std::atomic<int>> visits(static_cast<size_t>(end));
  parallel_for(begin, end, [&](int64_t i) { visits[static_cast<size_t>(i)].fetch_add(1); });
  std::vector<int> counts;
  for (const auto& v : visits) counts.push_back(v.load());
  return counts;
}

TEST(ThreadPool, ThreadCountIsPositiveAndPublic) {
  EXPECT_GE(num_threads(), 1);
  EXPECT_EQ(cpu_num_threads(), num_threads());
}

TEST(ThreadPool, EveryItemRunsExactlyOnce) {
  for (int64_t begin : {int64_t{0}, int64_t{7}}) {
    const std::vector<int> counts = visits_of_loop(begin, kItems);
    for (int64_t i = 0; i < kItems; ++i) EXPECT_EQ(counts[size_t(i)], i >= begin ? 1 : 0) << i;
  }
}

TEST(ThreadPool, EmptyAndSingleItemLoops) {
  int calls = 0;
  parallel_for(5, 5, [&](int64_t) { ++calls; });
  parallel_for(5, 3, [&](int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
  parallel_for(5, 6, [&](int64_t i) { calls += i == 5; });
  EXPECT_EQ(calls, 1);
}

TEST(ThreadPool, NestedLoopsRunEveryInnerItem) {
  constexpr int64_t kOuter = 16, kInner = 64;  // more outer items than threads, inner loops > 1
  std::vector<std::atomic<int>> visits(kOuter * kInner);
  parallel_for(0, kOuter, [&](int64_t o) {
    parallel_for(0, kInner, [&](int64_t i) { visits[size_t(o * kInner + i)].fetch_add(1); });
  });
  for (const auto& v : visits) EXPECT_EQ(v.load(), 1);
}

TEST(ThreadPool, ConcurrentHostThreadsEachRunTheirItems) {
  constexpr int kHosts = 4;  // more host threads than the pool serves at once
  std::vector<std::vector<int>> results(kHosts);
  std::vector<std::thread> hosts;
  for (int h = 0; h < kHosts; ++h) {
    hosts.emplace_back([&results, h] {
      for (int repeat = 0; repeat < 20; ++repeat) results[size_t(h)] = visits_of_loop(0, kItems);
    });
  }
  for (std::thread& t : hosts) t.join();
  for (const auto& counts : results) {
    for (int c : counts) EXPECT_EQ(c, 1);
  }
}

TEST(ThreadPool, ExceptionReachesTheCallerAndThePoolStaysUsable) {
  EXPECT_THROW(parallel_for(0, kItems,
                            [](int64_t i) {
                              if (i == kItems / 2) throw std::runtime_error("item failed");
                            }),
               std::runtime_error);
  const std::vector<int> counts = visits_of_loop(0, kItems);
  for (int c : counts) EXPECT_EQ(c, 1);
}

TEST(ThreadPool, ChildOfForkRunsLoops) {
  (void)visits_of_loop(0, kItems);  // the parent's pool exists before the fork
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::vector<int> counts = visits_of_loop(0, kItems);
    bool all_once = true;
    for (int c : counts) all_once = all_once && c == 1;
    _exit(all_once ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace mlakit::cpu
