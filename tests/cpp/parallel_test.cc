// Stress test of include/mllm_kernel/cpu/parallel.hpp: every item is done exactly once for any
// worker count, jobs back to back and from several caller threads at once (a busy pool makes a
// caller run alone), exceptions reach the caller, and a forked child gets a working pool.
#include "mllm_kernel/cpu/parallel.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

int failures = 0;

void Expect(bool ok, const char* what, long detail) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s (%ld)\n", what, detail);
    ++failures;
  }
}

// Runs count items over `workers` workers; every item must be seen exactly once.
void CheckOnce(int64_t count, int64_t workers, int64_t grain) {
  std::vector<std::atomic<int>> seen(static_cast<size_t>(count));
  std::atomic<int64_t> max_worker{0};
  mllm_kernel::cpu::ParallelFor(count, workers, grain, [&](int64_t worker, int64_t begin, int64_t end) {
    int64_t m = max_worker.load();
    while (worker > m && !max_worker.compare_exchange_weak(m, worker)) {
    }
    for (int64_t i = begin; i < end; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < count; ++i) Expect(seen[static_cast<size_t>(i)].load() == 1, "item done once", i);
  Expect(max_worker.load() < workers, "worker index below the worker count", max_worker.load());
}

}  // namespace

int main() {
  using mllm_kernel::cpu::RunWorkers;
  for (int64_t workers : {1, 2, 3, 8, 17}) {
    for (int64_t count : {0, 1, 5, 64, 1000}) CheckOnce(count, workers, count % 7 + 1);
  }
  for (int round = 0; round < 2000; ++round) CheckOnce(37, 1 + round % 6, 1);  // jobs back to back

  // Every wanted worker runs, each once (the pool has the threads).
  std::vector<std::atomic<int>> ran(8);
  RunWorkers(8, [&](int64_t w) { ran[static_cast<size_t>(w)].fetch_add(1); });
  for (int w = 0; w < 8; ++w) Expect(ran[w].load() == 1, "each worker runs once", w);

  // Several callers at once: all items done, whoever runs them.
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([] {
      for (int round = 0; round < 300; ++round) CheckOnce(101, 4, 3);
    });
  }
  for (auto& t : callers) t.join();

  // An exception in a pool worker reaches the caller; the pool keeps working afterwards.
  bool caught = false;
  try {
    RunWorkers(4, [](int64_t w) {
      if (w == 3) throw std::runtime_error("worker 3");
    });
  } catch (const std::runtime_error&) {
    caught = true;
  }
  Expect(caught, "a worker's exception is rethrown", 0);
  CheckOnce(500, 4, 1);

  // A forked child (no pool threads there) gets a pool of its own.
  const pid_t child = fork();
  if (child == 0) {
    CheckOnce(1000, 6, 1);
    std::_Exit(failures == 0 ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  Expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the forked child's jobs", status);

  if (failures == 0) std::printf("parallel_test: ok\n");
  return failures == 0 ? 0 : 1;
}
