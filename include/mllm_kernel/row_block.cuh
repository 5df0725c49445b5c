/*!
 * \file mllm_kernel/row_block.cuh
 * \brief Row-per-block kernels (norms, softmax): a block's threads x cover one row, blockDim.y
 *        rows share a block, and each thread holds kVecs 16-byte vectors of its row in
 *        registers across the row's reductions, so the row is read once and written once.
 *
 * The plan (kVecs and the block shape) is host arithmetic in row_plan.hpp; row_reduce<kMax>
 * reduces over one row's threads.
 */
#ifndef MLLM_KERNEL_ROW_BLOCK_CUH_
#define MLLM_KERNEL_ROW_BLOCK_CUH_

#include <mllm_kernel/cuda/reduce.cuh>
#include <mllm_kernel/row_plan.hpp>

#include <cstdint>

namespace mllm_kernel::device {

static_assert(kWarpThreads == host::kPlanWarpThreads, "row_plan.hpp plans in warps of 32 threads");

/*!
 * \brief Sum (or max) over the blockDim.x threads of one row; every thread gets its row's
 *        result. blockDim.x is a multiple of 32 and the block at most 32 warps. All threads of
 *        the block must call.
 */
template <bool kMax>
__device__ __forceinline__ float row_reduce(float v) {
  __shared__ float partials[kWarpThreads];
  v = kMax ? warp_reduce_max(v) : warp_reduce_sum(v);
  const unsigned warps_per_row = blockDim.x / kWarpThreads;
  const unsigned warp = threadIdx.y * warps_per_row + threadIdx.x / kWarpThreads;
  __syncthreads();  // the previous call may still be reading partials
  if (threadIdx.x % kWarpThreads == 0) partials[warp] = v;
  __syncthreads();
  const float* row_partials = partials + threadIdx.y * warps_per_row;
  float result = row_partials[0];
  for (unsigned i = 1; i < warps_per_row; ++i) {  // shared-memory broadcast
    result = kMax ? fmaxf(result, row_partials[i]) : result + row_partials[i];
  }
  return result;
}

/*!
 * \brief Calls f(row, active) once per group of blockDim.y rows this block takes (grid-stride
 *        over row groups): row is this thread's row, active whether it exists. The loop is
 *        uniform over the block, so f may call row_reduce.
 */
template <typename F>
__device__ __forceinline__ void for_each_row_group(int64_t rows, F&& f) {
  for (int64_t row0 = static_cast<int64_t>(blockIdx.x) * blockDim.y; row0 < rows;
       row0 += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t row = row0 + threadIdx.y;
    f(row, row < rows);
  }
}

/*!
 * \brief Calls f(k, j) for each of this thread's kVecs vectors that lies in its row: vector k
 *        is the row's 16-byte vector j = threadIdx.x + k * blockDim.x (coalesced across the
 *        row's threads). Unrolled, so arrays indexed by k stay in registers.
 */
template <int kVecs, typename F>
__device__ __forceinline__ void for_each_row_vec(int nvec, bool active, F&& f) {
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (active && j < nvec) f(k, j);
  }
}

/*!
 * \brief Launch bound of a row-vector kernel: at least 2 blocks of 512 threads per SM (64
 *        registers per thread), so one block's loads overlap another's reductions; 8 vectors
 *        of 16-bit data spill under that cap (halving the bandwidth on an H200), so they get 1.
 */
template <typename T, int kVecs>
inline constexpr int kRowVecMinBlocks = kVecs == 8 && sizeof(T) == 2 ? 1 : 2;

}  // namespace mllm_kernel::device

#endif  // MLLM_KERNEL_ROW_BLOCK_CUH_
