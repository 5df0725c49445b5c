// Worker threads for the CPU kernels. A process-wide pool (one per module) keeps its threads
// between calls: starting a thread costs tens of microseconds, more than a small op's rows. The
// caller's thread is worker 0. Work is handed out through a shared counter, so results never
// depend on how many workers ran or in which order, and fewer workers (a thread the system
// refused, a pool busy with another caller's op) finish the same work.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
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

namespace parallel_detail {

// The pool. Its threads wait for a job (a generation number), run work(their index) if the job
// wants that many workers, and report back; one job at a time (a second caller meanwhile runs
// its work alone). Never destroyed: detached threads outlive static destructors at exit. After
// fork() the child has no pool threads, so a child makes a new pool (the parent's is leaked).
class Pool {
 public:
  static Pool& Get() {
    static std::atomic<Pool*> pool{nullptr};
    static std::mutex creating;
    Pool* current = pool.load(std::memory_order_acquire);
    if (current == nullptr || current->pid_ != getpid()) {
      std::lock_guard<std::mutex> lock(creating);
      current = pool.load(std::memory_order_acquire);
      if (current == nullptr || current->pid_ != getpid()) {
        current = new Pool();
        pool.store(current, std::memory_order_release);
      }
    }
    return *current;
  }

  // Runs work(w) for w in [0, workers) (0 on this thread) and waits; rethrows the first
  // exception a worker threw. Returns false, having run nothing, when another job holds the
  // pool or this thread is already inside a job (no nesting).
  template <typename Work>
  bool TryRun(int64_t workers, Work& work) {
    if (inside_) return false;
    std::unique_lock<std::mutex> job(job_, std::try_to_lock);
    if (!job.owns_lock()) return false;
    inside_ = true;
    int64_t helpers = 0;
    {
      std::lock_guard<std::mutex> lock(state_);
      helpers = Grow(workers - 1);
      call_ = [](void* w, int64_t index) { (*static_cast<Work*>(w))(index); };
      work_ = &work;
      wanted_ = helpers;
      finished_ = 0;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr own;
    try {
      work(int64_t{0});
    } catch (...) {
      own = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(state_);
    done_.wait(lock, [&] { return finished_ == helpers; });
    inside_ = false;
    if (own) std::rethrow_exception(own);
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  Pool() : pid_(getpid()) {}

  // At least `count` threads if the system gives them (state_ held); how many take part. A new
  // thread starts at the current generation, so it takes the job about to be posted.
  int64_t Grow(int64_t count) {
    while (threads_ < count) {
      try {
        std::thread([this, index = threads_ + 1, seen = generation_] { Loop(index, seen); }).detach();
      } catch (const std::system_error&) {
        break;  // no more threads to be had: the shared counter lets fewer workers finish
      }
      ++threads_;
    }
    return std::min(count, threads_);
  }

  void Loop(int64_t index, uint64_t seen) {
    for (;;) {
      void (*call)(void*, int64_t) = nullptr;
      void* work = nullptr;
      {
        std::unique_lock<std::mutex> lock(state_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (index > wanted_) continue;  // this job wants fewer workers
        call = call_;
        work = work_;
      }
      std::exception_ptr error;
      try {
        call(work, index);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(state_);
        if (error && !error_) error_ = error;
        ++finished_;
      }
      done_.notify_one();
    }
  }

  static inline thread_local bool inside_ = false;  // this thread runs a job's worker 0
  const pid_t pid_;
  std::mutex job_;    // one job at a time
  std::mutex state_;  // everything below
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  int64_t threads_ = 0, wanted_ = 0, finished_ = 0;
  void (*call_)(void*, int64_t) = nullptr;
  void* work_ = nullptr;
  std::exception_ptr error_;
};

}  // namespace parallel_detail

/*!
 * \brief Runs work(worker) for `workers` workers (worker 0 on the calling thread) and waits for
 * all of them; an exception a worker throws is rethrown here. `work` must take its items from a
 * shared counter: fewer workers may run (then worker 0 alone does everything).
 */
template <typename Work>
void RunWorkers(int64_t workers, Work&& work) {
  if (workers <= 1 || !parallel_detail::Pool::Get().TryRun(workers, work)) work(int64_t{0});
}

/*!
 * \brief Calls fn(worker, begin, end) over [0, count) in chunks of `grain` items, on `workers`
 * workers (WorkerCount); fn gets its worker's index for per-worker scratch.
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
