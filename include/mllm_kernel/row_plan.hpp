/*!
 * \file mllm_kernel/row_plan.hpp
 * \brief The launch plans of the row kernels, as host arithmetic, so that they are tested
 *        without a GPU (tests/cpp/row_plan_test.cc):
 *        - plan_rows: a row per block held in registers (row_block.cuh: norms, softmax): vectors
 *          a thread, threads a row, rows a block, blocks;
 *        - plan_row_cluster_on: a long row split over a cluster of blocks (row_cluster.cuh:
 *          sampling, long-row softmax): blocks a row, threads, the slice.
 *        The numbers behind them are in benchmarks/TUNING.md and RESULTS.md.
 */
#ifndef MLLM_KERNEL_ROW_PLAN_HPP_
#define MLLM_KERNEL_ROW_PLAN_HPP_

#include <mllm_kernel/utils.hpp>

#include <algorithm>
#include <cstdint>

namespace mllm_kernel::device {

// Largest block of a row-vector kernel: one row of up to 512 threads.
inline constexpr int kRowVecMaxThreads = 512;

}  // namespace mllm_kernel::device

namespace mllm_kernel::host {

// Threads are planned in whole warps (device::kWarpThreads; row_block.cuh checks they agree).
inline constexpr int kPlanWarpThreads = 32;

/*! \brief Launch shape of a row kernel. kvecs == 0: the caller's scalar (any-row) kernel. */
struct RowPlan {
  int kvecs = 0;
  unsigned threads_x = 0;
  unsigned rows_per_block = 0;
  unsigned blocks = 0;
};

/*!
 * \brief A fixed number of vectors a thread for grids that run in one wave, for kernels that keep
 *        more state per vector (rms_norm: the vector's weights). vecs 0: not used. The caller
 *        sets max_grid_threads from the device (rms_norm: 1024 an SM).
 */
struct RowWaveOptions {
  int vecs = 0;
  int64_t max_grid_threads = 0;  // the grid's threads (rows x threads a row) at most
};

/*!
 * \brief Plans rows of `width` elements: vectors of `vec_size` elements when `vec_ok` (width
 *        divisible, pointers and row strides 16-byte aligned) and the row fits 8 vectors by
 *        512 threads; otherwise the scalar kernel with up to 256 threads looping over the row.
 *        `wave`: wave.vecs vectors a thread where the row fits 512 threads and the grid
 *        wave.max_grid_threads.
 */
inline RowPlan plan_rows(int64_t rows, int64_t width, int vec_size, bool vec_ok, RowWaveOptions wave = {}) {
  // Scalar kernels and rows of up to 256 threads run 256-thread blocks.
  constexpr int64_t kBlockThreads = 256, kMaxVecThreads = device::kRowVecMaxThreads;
  // Fewer rows than this (about 4 per SM of an H100/H200) plan for latency, not bandwidth.
  constexpr int64_t kManyRows = 512;
  RowPlan plan;
  int64_t threads = std::min<int64_t>(width, kBlockThreads);
  if (vec_ok) {
    const int64_t nvec = width / vec_size;
    // The wave plan where its threads are at least a full warp and at most a block of 512.
    const int64_t wave_threads = wave.vecs > 0 ? div_ceil(nvec, wave.vecs) : 0;
    if (wave_threads >= kPlanWarpThreads && wave_threads <= kMaxVecThreads &&
        rows * div_ceil(wave_threads, kPlanWarpThreads) * kPlanWarpThreads <= wave.max_grid_threads) {
      plan.kvecs = wave.vecs;
    } else if (rows >= kManyRows) {
      // Bandwidth: 4 vectors per thread (4 loads in flight) wherever the row fits 512
      // threads; on an H200, 2 per thread cost up to 25% of the bandwidth on 8K-wide bf16
      // rows. Short rows take fewer so a warp still covers them; 2049-4096 vectors take 8.
      plan.kvecs = nvec <= 128 ? 1 : nvec <= 256 ? 2 : nvec <= 2048 ? 4 : nvec <= 4096 ? 8 : 0;
    } else {
      // Latency (the grid does not fill the GPU): the most threads per row, so each row's
      // loads spread wide; up to 256 threads while the row fits 8 vectors per thread.
      const int64_t max_threads = nvec <= 8 * kBlockThreads ? kBlockThreads : kMaxVecThreads;
      for (int k : {1, 2, 4, 8}) {
        if (div_ceil(nvec, k) <= max_threads) {
          plan.kvecs = k;
          break;
        }
      }
    }
    if (plan.kvecs != 0) threads = div_ceil(nvec, plan.kvecs);
  }
  plan.threads_x = static_cast<unsigned>(div_ceil(threads, kPlanWarpThreads) * kPlanWarpThreads);
  plan.rows_per_block = std::max<unsigned>(1, kBlockThreads / plan.threads_x);
  // Kernels loop over row groups (grid-stride), so the cap loses nothing.
  constexpr int64_t kMaxBlocks = int64_t{1} << 30;
  plan.blocks = static_cast<unsigned>(std::min(div_ceil(rows, plan.rows_per_block), kMaxBlocks));
  return plan;
}

/*! \brief The 1-, 2-, 4- or 8-vector kernel for plan.kvecs (which must not be 0). */
template <typename Kernel>
inline Kernel pick_row_kernel(const RowPlan& plan, Kernel v1, Kernel v2, Kernel v4, Kernel v8) {
  RuntimeCheck(plan.kvecs == 1 || plan.kvecs == 2 || plan.kvecs == 4 || plan.kvecs == 8,
               "pick_row_kernel: no vector kernel for kvecs=", plan.kvecs);
  return plan.kvecs == 1 ? v1 : plan.kvecs == 2 ? v2 : plan.kvecs == 4 ? v4 : v8;
}


/*! \brief What the cluster plan needs of a device: thread-block clusters (sm_90+) and its SMs. */
struct ClusterDevice {
  bool clusters;
  int64_t sms;
};

/*! \brief Clusters of `cluster` blocks of `threads` threads, one cluster per row, `slice`
 *         elements per block; `fits`: a slice fits the caller's shared-memory budget. */
struct RowClusterPlan {
  unsigned cluster, threads;
  int64_t slice;
  bool fits;
};

/*! \brief Elements a block of 8 must exceed before a few-pass kernel fills the GPU with 16. */
inline constexpr int64_t kWideFillSlice = 8192;

/*!
 * \brief The plan for `rows` rows of `vocab` elements of `elem_bytes`: blocks per row doubled
 *        (up to 8 on sm_90, 1 before) while the grid stays within one block per SM, then (up
 *        to 16) while a slice exceeds `slice_bytes` (if copy_slices); slices are whole
 *        `align_elems` units; about 8 elements per thread, 256 to 1024 threads (512 once the
 *        grid has more blocks than SMs). active16() (how many clusters of 16 blocks run at
 *        once; 0: none) is called only once the plan reaches 8 blocks.
 *        `few_passes`: the kernel reads its slice once or twice (an argmax, a top-k mask), so
 *        long rows take 16 blocks to fill the GPU where every row's cluster runs at once.
 */
template <typename Active16>
inline RowClusterPlan plan_row_cluster_on(const ClusterDevice& dev, Active16&& active16, int64_t rows, int64_t vocab,
                                          int64_t elem_bytes, int64_t align_elems, int64_t slice_bytes,
                                          bool copy_slices, bool few_passes) {
  const bool hopper = dev.clusters;
  const int64_t sms = dev.sms;
  constexpr int64_t kMaxGrid = 0x7fffffff;
  unsigned cluster = 1;
  auto can_grow = [&](unsigned limit) { return cluster < limit && rows * cluster * 2 <= kMaxGrid; };
  auto slice_for = [&](unsigned c) { return div_ceil(div_ceil(vocab, c), align_elems) * align_elems; };
  // To fill the GPU: clusters of up to 8 blocks. Measured on an H100 (benchmarks/RESULTS.md):
  // clusters of 16 made batch 8 up to 2.1x slower (8 clusters of 16 do not fit at once: two
  // waves) and most ops at batch 1 and 4 up to 35% slower (more blocks in each cluster
  // reduction); one- and two-pass ops over long rows at batch 1-4 were 6-15% faster with 16.
  while (can_grow(hopper ? 8 : 1) && rows * cluster * 2 <= sms) cluster *= 2;
  if (few_passes && cluster == 8 && rows * 16 <= sms && slice_for(8) > kWideFillSlice && rows <= active16()) {
    cluster = 16;
  }
  // For slices that fit shared memory: up to 16 blocks where clusters of 16 can be scheduled.
  auto max_cluster = [&] { return !hopper ? 1u : cluster < 8 || active16() == 0 ? 8u : 16u; };
  while (copy_slices && can_grow(max_cluster()) && slice_for(cluster) * elem_bytes > slice_bytes) cluster *= 2;
  const int64_t slice = slice_for(cluster);
  // Grids of more blocks than SMs: at most 512 threads, so two blocks share an SM (one loads
  // while the other computes, and one wave holds twice as many); few blocks: up to 1024, to
  // finish each slice sooner.
  const int64_t max_threads = rows * cluster > sms ? 512 : 1024;
  const int64_t threads = std::clamp<int64_t>(div_ceil(slice, 8 * 32) * 32, 256, max_threads);
  return {cluster, static_cast<unsigned>(threads), slice, slice * elem_bytes <= slice_bytes};
}

}  // namespace mllm_kernel::host

#endif  // MLLM_KERNEL_ROW_PLAN_HPP_
