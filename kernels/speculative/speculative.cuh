/*!
 * \file kernels/speculative/speculative.cuh
 * \brief CUDA speculative-decoding verification: chain rejection sampling, on torch's current
 * stream.
 *
 * One block per request (grid-stride over the batch). Thread 0 runs the accept tests (n reads);
 * the block then draws the correction or bonus token from one row in two steps:
 *  1. each warp sums the integer weights (speculative.hpp) of its 128-token chunks into shared
 *     memory (coalesced: lane l reads tokens l, l + 32, ... of the chunk);
 *  2. a block scan over the chunk sums finds the chunk where the running sum passes the draw's
 *     target, and one warp scans that chunk alone.
 * So the row is read once, plus one chunk. Integer sums make the token independent of the
 * order of additions: CPU and CUDA agree exactly.
 *
 * A draft id outside [0, vocab) is never read: that position counts as rejected and the id is
 * recorded in `error` (int64 [3]: {flag, flattened index, id}). Uniforms are clamped to [0, 1).
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * mllm_kernel::gpu::chain_speculative_sampling (arguments: speculative.hpp).
 */
#ifndef MLLM_KERNEL_KERNELS_SPECULATIVE_CUH_
#define MLLM_KERNEL_KERNELS_SPECULATIVE_CUH_

#include <mllm_kernel/utils.cuh>

#include "speculative.hpp"

#include <algorithm>
#include <cstdint>

namespace mllm_kernel::gpu {

namespace speculative_detail {

using speculative::ChainArgs;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxChunks = 2048;  // 16 KiB of chunk sums; longer rows get wider chunks

__device__ __forceinline__ uint64_t WarpSum(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ uint64_t WarpInclusiveScan(uint64_t v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t up = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += up;
  }
  return v;
}

/*! \brief Exclusive block scan of one value per thread; also returns the block total. */
__device__ __forceinline__ uint64_t BlockExclusiveScan(uint64_t v, uint64_t* warp_totals, uint64_t& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint64_t inclusive = WarpInclusiveScan(v);
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const uint64_t t = lane < kWarps ? warp_totals[lane] : 0;
    const uint64_t scanned = WarpInclusiveScan(t);
    if (lane < kWarps) warp_totals[lane] = scanned - t;  // exclusive prefix of each warp
    if (lane == 31) warp_totals[kWarps] = scanned;
  }
  __syncthreads();
  total = warp_totals[kWarps];
  const uint64_t result = warp_totals[warp] + inclusive - v;
  __syncthreads();  // warp_totals is reused by the next scan
  return result;
}

/*! \brief One row's weights: the residual max(0, p - q) (q != nullptr) or p itself. */
struct RowWeights {
  const float* p;
  const float* q;
  __device__ __forceinline__ uint64_t operator()(int64_t i) const {
    return q != nullptr ? speculative::ResidualWeight(p[i], q[i]) : speculative::Weight(p[i]);
  }
};

/*!
 * \brief The first token whose running weight exceeds DrawTarget(u, total); -1 if the row has
 * no weight. Called by the whole block.
 */
__device__ int64_t BlockDraw(const RowWeights& w, int64_t vocab, int64_t chunk, int64_t num_chunks, float u,
                             uint64_t* chunk_sums, uint64_t* warp_totals, int64_t* found) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t c = warp; c < num_chunks; c += kWarps) {  // 1. chunk sums
    const int64_t first = c * chunk, last = min(first + chunk, vocab);
    uint64_t sum = 0;
    for (int64_t i = first + lane; i < last; i += 32) sum += w(i);
    sum = WarpSum(sum);
    if (lane == 0) chunk_sums[c] = sum;
  }
  __syncthreads();
  // 2. each thread owns a contiguous run of chunks; a block scan orders the runs.
  const int64_t per_thread = (num_chunks + kThreads - 1) / kThreads;
  const int64_t c0 = threadIdx.x * per_thread, c1 = min(c0 + per_thread, num_chunks);
  uint64_t mine = 0;
  for (int64_t c = c0; c < c1; ++c) mine += chunk_sums[c];
  uint64_t total;
  uint64_t before = BlockExclusiveScan(mine, warp_totals, total);
  if (total == 0) return -1;  // uniform across the block: every thread returns
  const uint64_t target = speculative::DrawTarget(u, total);
  if (threadIdx.x == 0) *found = -1;
  __syncthreads();
  if (before <= target && target < before + mine) {  // exactly one thread
    int64_t c = c0;
    while (before + chunk_sums[c] <= target) before += chunk_sums[c++];
    found[0] = c;
    warp_totals[0] = before;  // the running sum before chunk c
  }
  __syncthreads();
  const int64_t c = found[0];
  const uint64_t start = warp_totals[0];
  __syncthreads();  // everyone read found / warp_totals before they are reused
  if (warp == 0) {  // 3. one warp scans chunk c, 32 tokens at a time
    uint64_t running = start;
    const int64_t last = min((c + 1) * chunk, vocab);
    for (int64_t base = c * chunk; base < last; base += 32) {
      const int64_t i = base + lane;
      const uint64_t inclusive = running + WarpInclusiveScan(i < last ? w(i) : 0);
      const unsigned passed = __ballot_sync(0xffffffffu, i < last && inclusive > target);
      if (passed != 0) {
        if (lane == 0) found[0] = base + __ffs(passed) - 1;
        break;
      }
      running = __shfl_sync(0xffffffffu, inclusive, 31);
    }
  }
  __syncthreads();
  const int64_t token = found[0];
  __syncthreads();
  return token;
}

template <typename IdT, typename AccT>
__global__ void __launch_bounds__(kThreads)
    ChainKernel(IdT* __restrict__ out_tokens, AccT* __restrict__ out_accepted, const float* __restrict__ draft,
                const IdT* __restrict__ ids, const float* __restrict__ target, const float* __restrict__ uniforms,
                ChainArgs a, int64_t chunk, int64_t num_chunks, int64_t* error) {
  __shared__ uint64_t chunk_sums[kMaxChunks];
  __shared__ uint64_t warp_totals[kWarps + 1];
  __shared__ int64_t shared[2];  // the accepted count, then BlockDraw's result slot
  device::pdl_wait_primary();  // the probs come from the previous kernels
  const int64_t n = a.num_draft;
  for (int64_t b = blockIdx.x; b < a.batch; b += gridDim.x) {
    const float* u = uniforms + b * (n + 1);
    IdT* out = out_tokens + b * (n + 1);
    if (threadIdx.x == 0) {
      int64_t j = 0;
      for (; j < n; ++j) {
        const auto x = static_cast<int64_t>(ids[b * a.ids_stride_b + j * a.ids_stride_n]);
        if (x < 0 || x >= a.vocab) {  // never read: record, and count the position as rejected
          device::record_error(error, b * n + j, x);
          break;
        }
        const float p = target[b * a.target_stride_b + j * a.target_stride_n + x];
        const float q = draft[b * a.draft_stride_b + j * a.draft_stride_n + x];
        if (!speculative::Accepts(u[j], p, q)) break;
        out[j] = static_cast<IdT>(x);
      }
      shared[0] = j;
    }
    __syncthreads();
    const int64_t j = shared[0];
    const float* p_row = target + b * a.target_stride_b + j * a.target_stride_n;
    int64_t token = -1;
    if (j < n) {
      const RowWeights residual{p_row, draft + b * a.draft_stride_b + j * a.draft_stride_n};
      token = BlockDraw(residual, a.vocab, chunk, num_chunks, u[n], chunk_sums, warp_totals, &shared[1]);
    }
    if (token < 0) {
      token = BlockDraw(RowWeights{p_row, nullptr}, a.vocab, chunk, num_chunks, u[n], chunk_sums, warp_totals,
                        &shared[1]);
    }
    for (int64_t k = j + threadIdx.x; k <= n; k += kThreads) {
      out[k] = static_cast<IdT>(k == j ? (token < 0 ? 0 : token) : -1);
    }
    if (threadIdx.x == 0) out_accepted[b] = static_cast<AccT>(j);
    __syncthreads();  // shared[0] is rewritten for the next request
  }
  device::pdl_launch_dependents();
}

}  // namespace speculative_detail

/*! \brief Chain speculative sampling (arguments: speculative.hpp). Asynchronous: no host sync. */
inline void chain_speculative_sampling(tvm::ffi::TensorView out_tokens, tvm::ffi::TensorView out_accepted,
                                       tvm::ffi::TensorView draft_probs, tvm::ffi::TensorView draft_token_ids,
                                       tvm::ffi::TensorView target_probs, tvm::ffi::TensorView uniforms,
                                       tvm::ffi::TensorView error) {
  using host::data_ptr;
  using namespace speculative_detail;  // NOLINT(*)
  const auto a = speculative::VerifyChain<kDLCUDA>(out_tokens, out_accepted, draft_probs, draft_token_ids,
                                                   target_probs, uniforms, error);
  if (a.empty()) return;
  const int64_t chunk = std::max<int64_t>(128, host::div_ceil(host::div_ceil(a.vocab, int64_t{kMaxChunks}), 32) * 32);
  const int64_t num_chunks = host::div_ceil(a.vocab, chunk);
  const int64_t grid = std::min<int64_t>(a.batch, int64_t{host::MultiProcessorCount(a.device.device_id)} * 8);
  host::DispatchIndex(a.id_dtype, [&]<typename IdT>() {
    host::DispatchIndex(a.accepted_dtype, [&]<typename AccT>() {
      host::LaunchKernel(grid, kThreads, a.device)
          .enable_pdl(true)(ChainKernel<IdT, AccT>, data_ptr<IdT>(out_tokens), data_ptr<AccT>(out_accepted),
                            data_ptr<const float>(draft_probs), data_ptr<const IdT>(draft_token_ids),
                            data_ptr<const float>(target_probs), data_ptr<const float>(uniforms), a, chunk,
                            num_chunks, data_ptr<int64_t>(error));
    });
  });
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_SPECULATIVE_CUH_
