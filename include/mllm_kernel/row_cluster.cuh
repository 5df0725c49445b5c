/*!
 * \file mllm_kernel/row_cluster.cuh
 * \brief A row split over a thread-block cluster (sm_90; one block before): the launch plan for
 *        few long rows (decode-time logits), this block's slice of its row, and reductions of
 *        one value per block over the cluster through distributed shared memory.
 *
 * Block r of a row's cluster owns elements [r * slice, (r + 1) * slice) of it. The plan depends
 * on the shape and device only (CUDA-graph safe): enough blocks per row that every SM gets work,
 * more while a slice would not fit the caller's shared-memory budget. Its arithmetic is
 * plan_row_cluster_on in row_plan.hpp; plan_row_cluster here asks the device.
 */
#ifndef MLLM_KERNEL_ROW_CLUSTER_CUH_
#define MLLM_KERNEL_ROW_CLUSTER_CUH_

#include <mllm_kernel/cuda/cluster.cuh>
#include <mllm_kernel/cuda/launch.cuh>
#include <mllm_kernel/cuda/vec.cuh>
#include <mllm_kernel/row_plan.hpp>

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

/*!
 * \brief plan_row_cluster_on (row_plan.hpp) for kKernel on \p device: its compute capability,
 *        SMs, and (asked once a plan reaches 8 blocks) how many clusters of 16 run at once.
 */
template <auto kKernel>
inline RowClusterPlan plan_row_cluster(int64_t rows, int64_t vocab, int64_t elem_bytes, int64_t align_elems,
                                       int64_t slice_bytes, bool copy_slices, int device, bool few_passes = false) {
  return plan_row_cluster_on({GetComputeCapability(device) >= 90, MultiProcessorCount(device)},
                             [&] { return active_clusters16<kKernel>(device, slice_bytes); }, rows, vocab,
                             elem_bytes, align_elems, slice_bytes, copy_slices, few_passes);
}

}  // namespace mllm_kernel::host

#endif  // MLLM_KERNEL_ROW_CLUSTER_CUH_
