// The CPU worker pool's cost per job (include/mllm_kernel/cpu/parallel.hpp): jobs of `items`
// busy-wait items of `item_us` each over `workers` workers, `gap_us` of the caller's own work
// between jobs (Python between two ops). Prints the median, p10 and p90 of a job's time and the
// ideal (items * item_us / workers, for workers <= cores).
//
//   bazel run -c opt //benchmarks:bench_pool -- [workers=2] [items=8] [item_us=20] [gap_us=30]
#include "mllm_kernel/cpu/parallel.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// Keeps a core busy for about `us` (no sleep, no memory traffic).
void Busy(double us) {
  static thread_local volatile double sink = 0;
  const auto start = Clock::now();
  double x = 1.0;
  while (MicrosSince(start) < us) x = std::sqrt(x + 1.0);
  sink = sink + x;
}

}  // namespace

int main(int argc, char** argv) {
  const int workers = argc > 1 ? std::atoi(argv[1]) : 2;
  const int items = argc > 2 ? std::atoi(argv[2]) : 8;
  const double item_us = argc > 3 ? std::atof(argv[3]) : 20.0;
  const double gap_us = argc > 4 ? std::atof(argv[4]) : 30.0;
  if (workers < 1 || items < 0 || item_us < 0 || gap_us < 0) {
    std::fprintf(stderr, "usage: bench_pool [workers>=1] [items>=0] [item_us>=0] [gap_us>=0]\n");
    return 2;
  }
  constexpr int kWarmup = 100, kJobs = 3000;
  std::vector<double> times;
  times.reserve(kJobs);
  for (int job = 0; job < kWarmup + kJobs; ++job) {
    const auto start = Clock::now();
    mllm_kernel::cpu::ParallelFor(items, workers, 1, [&](int64_t, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) Busy(item_us);
    });
    if (job >= kWarmup) times.push_back(MicrosSince(start));
    Busy(gap_us);
  }
  std::sort(times.begin(), times.end());
  std::printf("workers %d, %d items x %.0f us, gap %.0f us: median %.1f us, p10 %.1f, p90 %.1f (ideal %.1f)\n",
              workers, items, item_us, gap_us, times[kJobs / 2], times[kJobs / 10], times[kJobs * 9 / 10],
              items * item_us / workers);
  return 0;
}
