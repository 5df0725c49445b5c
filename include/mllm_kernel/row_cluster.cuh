/*!
 * \file mllm_kernel/row_cluster.cuh
 * \brief A row split over a thread-block cluster (sm_90; one block before): the launch plan for
 *        few long rows (decode-time logits), this block's slice of its row, and reductions of
 *        one value per block over the cluster through distributed shared memory.
 *
 * Block r of a row's cluster owns elements [r * slice, (r + 1) * slice) of it. The plan depends
 * on the shape and device only (CUDA-graph safe): enough blocks per row that every SM gets work,
 * more while a slice would not fit the caller's shared-memory budget.
 */
#ifndef MLLM_KERNEL_ROW_CLUSTER_CUH_
#define MLLM_KERNEL_ROW_CLUSTER_CUH_

#include <mllm_kernel/cuda/cluster.cuh>
#include <mllm_kernel/cuda/launch.cuh>
#include <mllm_kernel/cuda/vec.cuh>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace mllm_kernel::device {

/*! \brief This block's part of its row: elements [begin, begin + n). */
struct RowSlice {
  int64_t begin, n;
};

/*! \brief The slice of this block (cluster rank r): [r * slice, (r + 1) * slice) within vocab. */
__device__ __forceinline__ RowSlice row_slice(int64_t vocab, int64_t slice) {
  const int64_t begin = min(vocab, static_cast<int64_t>(cluster_rank()) * slice);
  return {begin, min(vocab - begin, slice)};
}

/*!
 * \brief op over one value per block of the cluster, in rank order (deterministic); every
 *        thread gets it. `value` must be the same in all of the block's threads and all threads
 *        must call. Two slots alternate (parity) so that a slot is rewritten only after a later
 *        cluster barrier, which every reader of its previous value has passed.
 */
template <typename V, typename Op>
__device__ __forceinline__ V cluster_all_reduce(V value, Op op, V (&slots)[2], unsigned& parity) {
  const unsigned par = parity;  // read before the barrier: faster threads flip it after
  if (threadIdx.x == 0) slots[par] = value;
  cluster_sync();
  V acc{};
  for_each_peer(&slots[par], [&](unsigned r, const V& v) { acc = r == 0 ? v : op(acc, v); });
  parity = par ^ 1u;
  return acc;
}

}  // namespace mllm_kernel::device

namespace mllm_kernel::host {

/*! \brief Clusters of `cluster` blocks of `threads` threads, one cluster per row, `slice`
 *         elements per block; `fits`: a slice fits the caller's shared-memory budget. */
struct RowClusterPlan {
  unsigned cluster, threads;
  int64_t slice;
  bool fits;
};

/*!
 * \brief How many clusters of 16 blocks of kKernel (non-portable; 0 where none fit, 8 always
 *        do) \p device runs at once with 1024 threads and \p smem_bytes each, asked once per
 *        kernel and device.
 */
template <auto kKernel>
inline int active_clusters16(int device, int64_t smem_bytes) {
  constexpr int kMaxCachedDevices = 64;
  static std::atomic<int> cache[kMaxCachedDevices] = {};  // the count + 1; 0: not asked
  if (device >= 0 && device < kMaxCachedDevices) {
    if (const int v = cache[device].load(std::memory_order_relaxed); v != 0) return v - 1;
  }
  const int clusters = MaxActiveClusters(kKernel, device, 16, 1024, smem_bytes);
  if (device >= 0 && device < kMaxCachedDevices) cache[device].store(clusters + 1, std::memory_order_relaxed);
  return clusters;
}

/*! \brief Elements a block of 8 must exceed before a few-pass kernel fills the GPU with 16. */
inline constexpr int64_t kWideFillSlice = 8192;

/*!
 * \brief The plan for `rows` rows of `vocab` elements of `elem_bytes`: blocks per row doubled
 *        (up to 8 on sm_90, 1 before) while the grid stays within one block per SM, then (up
 *        to 16) while a slice exceeds `slice_bytes` (if copy_slices); slices are whole
 *        `align_elems` units; about 8 elements per thread, 256 to 1024 threads (512 once the
 *        grid has more blocks than SMs). kKernel is asked whether 16 fit, where 8 is too few.
 *        `few_passes`: the kernel reads its slice once or twice (an argmax, a top-k mask), so
 *        long rows take 16 blocks to fill the GPU where every row's cluster runs at once.
 */
template <auto kKernel>
inline RowClusterPlan plan_row_cluster(int64_t rows, int64_t vocab, int64_t elem_bytes, int64_t align_elems,
                                       int64_t slice_bytes, bool copy_slices, int device, bool few_passes = false) {
  const bool hopper = GetComputeCapability(device) >= 90;
  const int64_t sms = MultiProcessorCount(device);
  constexpr int64_t kMaxGrid = 0x7fffffff;
  unsigned cluster = 1;
  auto can_grow = [&](unsigned limit) { return cluster < limit && rows * cluster * 2 <= kMaxGrid; };
  auto slice_for = [&](unsigned c) { return div_ceil(div_ceil(vocab, c), align_elems) * align_elems; };
  // To fill the GPU: clusters of up to 8 blocks. Measured on an H100 (benchmarks/RESULTS.md):
  // clusters of 16 made batch 8 up to 2.1x slower (8 clusters of 16 do not fit at once: two
  // waves) and most ops at batch 1 and 4 up to 35% slower (more blocks in each cluster
  // reduction); one- and two-pass ops over long rows at batch 1-4 were 6-15% faster with 16.
  while (can_grow(hopper ? 8 : 1) && rows * cluster * 2 <= sms) cluster *= 2;
  if (few_passes && cluster == 8 && rows * 16 <= sms && slice_for(8) > kWideFillSlice &&
      rows <= active_clusters16<kKernel>(device, slice_bytes)) {
    cluster = 16;
  }
  // For slices that fit shared memory: up to 16 blocks where clusters of 16 can be scheduled.
  auto max_cluster = [&] {
    return !hopper ? 1u : cluster < 8 || active_clusters16<kKernel>(device, slice_bytes) == 0 ? 8u : 16u;
  };
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

#endif  // MLLM_KERNEL_ROW_CLUSTER_CUH_
