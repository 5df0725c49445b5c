// Worker threads for the CPU kernels. A process-wide pool (one per module) keeps its threads
// between calls: starting a thread costs tens of microseconds, more than a small op's rows, and
// a thread spins a moment for the next job before it sleeps (kSpin). The
// caller's thread is worker 0. Work is handed out through a shared counter, so results never
// depend on how many workers ran or in which order, and fewer workers (a thread the system
// refused, a pool busy with another caller's op) finish the same work.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
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

// One pause of a spin-wait loop (lets the sibling hyper-thread run).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until done() or for about `limit`; true if done() held. Yields the core now and then,
// so spinning threads do not starve the workers on an oversubscribed machine.
template <typename Done>
bool SpinUntil(Done&& done, std::chrono::nanoseconds limit) {
  const auto start = std::chrono::steady_clock::now();
  for (uint32_t i = 1;; ++i) {
    if (done()) return true;
    CpuRelax();
    if (i % 256 == 0) {
      if (std::chrono::steady_clock::now() - start > limit) return false;
      std::this_thread::yield();
    }
  }
}

// Waking a sleeping thread takes several microseconds, and the threads woke one by one: eight
// threads made an 8-row op 30-40 us slower than torch's spinning OpenMP pool. So a thread spins
// this long for the next job (and the caller for its helpers) before it sleeps.
inline constexpr std::chrono::microseconds kSpin{200};

// The pool. Its threads wait for a job (a generation number packed with its worker count, so
// a thread reads both at once), run work(their index) if the job wants that many workers, and
// report back; one job at a time (a second caller meanwhile runs its work alone). A job's
// participants all report before the next job is posted, so the job they read stays in place.
// Never destroyed: detached threads outlive static destructors at exit. After fork() the child
// has no pool threads, so a child makes a new pool (the parent's is leaked).
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
    const int64_t helpers = Grow(workers - 1);
    call_ = [](void* w, int64_t index) { (*static_cast<Work*>(w))(index); };
    work_ = &work;
    error_ = nullptr;
    finished_.store(0);
    const uint64_t job_state = ((Generation(state_.load()) + 1) << kWantedBits) | static_cast<uint64_t>(helpers);
    state_.store(job_state);  // seq_cst: ordered before the sleepers_ check (see Loop)
    if (sleepers_.load() > 0) {
      { std::lock_guard<std::mutex> lock(state_mutex_); }  // a thread between its check and wait is waiting now
      wake_.notify_all();
    }
    std::exception_ptr own;
    try {
      work(int64_t{0});
    } catch (...) {
      own = std::current_exception();
    }
    auto all_done = [&] { return finished_.load() == helpers; };
    if (!SpinUntil(all_done, kSpin)) {
      std::unique_lock<std::mutex> lock(state_mutex_);
      caller_waits_.store(true);
      done_.wait(lock, all_done);
      caller_waits_.store(false);
    }
    inside_ = false;
    if (own) std::rethrow_exception(own);
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  static constexpr int kWantedBits = 20;  // workers per job < 2^20
  static uint64_t Generation(uint64_t state) { return state >> kWantedBits; }
  static int64_t Wanted(uint64_t state) { return static_cast<int64_t>(state & ((uint64_t{1} << kWantedBits) - 1)); }

  Pool() : pid_(getpid()) {}

  // At least `count` threads if the system gives them (job_ held); how many take part. A new
  // thread starts at the current generation, so it takes the job about to be posted.
  int64_t Grow(int64_t count) {
    count = std::min<int64_t>(count, (int64_t{1} << kWantedBits) - 1);
    while (threads_ < count) {
      try {
        std::thread([this, index = threads_ + 1, seen = Generation(state_.load())] { Loop(index, seen); }).detach();
      } catch (const std::system_error&) {
        break;  // no more threads to be had: the shared counter lets fewer workers finish
      }
      ++threads_;
    }
    return std::min(count, threads_);
  }

  void Loop(int64_t index, uint64_t seen) {
    for (;;) {
      uint64_t state = state_.load();
      auto posted = [&] {
        state = state_.load();
        return Generation(state) != seen;
      };
      if (!SpinUntil(posted, kSpin)) {
        std::unique_lock<std::mutex> lock(state_mutex_);
        sleepers_.fetch_add(1);  // seq_cst: before posted() reads state_ (see TryRun)
        wake_.wait(lock, posted);
        sleepers_.fetch_sub(1);
      }
      seen = Generation(state);
      if (index > Wanted(state)) continue;  // this job wants fewer workers
      try {
        call_(work_, index);
      } catch (...) {
        std::lock_guard<std::mutex> lock(state_mutex_);
        if (!error_) error_ = std::current_exception();
      }
      finished_.fetch_add(1);  // seq_cst: before caller_waits_ is read (see TryRun)
      if (caller_waits_.load()) {
        { std::lock_guard<std::mutex> lock(state_mutex_); }
        done_.notify_one();
      }
    }
  }

  static inline thread_local bool inside_ = false;  // this thread runs a job's worker 0
  const pid_t pid_;
  std::mutex job_;  // one job at a time; guards threads_ and the job's call_, work_
  int64_t threads_ = 0;
  void (*call_)(void*, int64_t) = nullptr;
  void* work_ = nullptr;
  std::atomic<uint64_t> state_{0};  // generation << kWantedBits | workers wanted besides the caller
  std::atomic<int64_t> finished_{0}, sleepers_{0};
  std::atomic<bool> caller_waits_{false};
  std::mutex state_mutex_;  // the sleeping side of wake_ / done_, and error_
  std::condition_variable wake_, done_;
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
