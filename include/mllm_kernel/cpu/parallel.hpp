// Worker threads for the CPU kernels: spawned per call (no pool outlives an op), the caller's
// thread being worker 0. Work is handed out through a shared counter, so results never depend
// on how many workers ran or in which order; if the system refuses a thread, fewer workers
// finish the same work.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cpu {

/*!
 * \brief How many workers an op runs for `items` independent items: num_threads (>= 1, checked
 * here with the op's name in the error) but no more than there are items, and at least one.
 */
inline int64_t WorkerCount(const char* op, int64_t num_threads, int64_t items) {
  host::ValueCheck(num_threads >= 1, op, ": num_threads must be >= 1, got ", num_threads);
  return std::max<int64_t>(1, std::min(num_threads, items));
}

/*!
 * \brief Runs work(worker) on `workers` threads (worker 0 on the calling thread) and waits for
 * all of them. `work` must take its items from a shared counter and must not throw (validate
 * before): a worker that was refused a thread simply never runs.
 */
template <typename Work>
void RunWorkers(int64_t workers, Work&& work) {
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(std::max<int64_t>(0, workers - 1)));
  for (int64_t w = 1; w < workers; ++w) {
    try {
      pool.emplace_back([&work, w] { work(w); });
    } catch (const std::system_error&) {
      break;  // no more threads to be had: the shared counter lets fewer workers finish
    }
  }
  work(int64_t{0});
  for (auto& thread : pool) thread.join();
}

/*!
 * \brief Calls fn(worker, begin, end) over [0, count) in chunks of `grain` items, on `workers`
 * workers (WorkerCount); fn gets its worker's index for per-worker scratch made beforehand.
 */
template <typename Fn>
void ParallelFor(int64_t count, int64_t workers, int64_t grain, Fn&& fn) {
  grain = std::max<int64_t>(1, grain);
  std::atomic<int64_t> next{0};
  RunWorkers(workers, [&](int64_t worker) {
    for (int64_t begin = next.fetch_add(grain); begin < count; begin = next.fetch_add(grain)) {
      fn(worker, begin, std::min(count, begin + grain));
    }
  });
}

}  // namespace mllm_kernel::cpu
