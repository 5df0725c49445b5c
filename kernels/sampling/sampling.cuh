/*!
 * \file kernels/sampling/sampling.cuh
 * \brief CUDA token sampling: greedy (argmax), top-k/top-p and min-p by inverse CDF, on
 *        torch's current stream. Same selection rules as sampling.cpp (see its file comment).
 *
 * One block per row, no sort of the vocab:
 *  - greedy: one pass, block-wide (value, index) argmax.
 *  - top-k / top-p: a max pass, then a search on the order-preserving uint32 key of the logit:
 *    top-k finds the k-th largest key with block-wide counts, top-p the largest key whose kept
 *    mass reaches top_p with block-wide sums of exp. Each pass tries kWays = 8 thresholds, so
 *    the bracket shrinks 9-fold per pass; a search stops once its bracket holds a single
 *    token, else after at most 11 passes (exact). Every pass reads the row (L2-resident for
 *    decode batch sizes).
 *  - min-p: a max pass, then the threshold is known.
 *  - sampling: each thread sums the kept weights of its contiguous chunk, a block exclusive
 *    scan gives the chunk offsets, and the thread whose chunk crosses u * total finds the token.
 * Reductions read 16 bytes per access when the row start is 16-byte aligned (checked per row),
 * with a scalar tail; 64-bit index math throughout.
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * mllm_kernel::gpu::{greedy_sample, top_k_top_p_sample, min_p_sample} (arguments: sampling.hpp).
 */
#ifndef MLLM_KERNEL_KERNELS_SAMPLING_CUH_
#define MLLM_KERNEL_KERNELS_SAMPLING_CUH_

#include <mllm_kernel/utils.cuh>

#include "sampling.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace mllm_kernel::gpu {

namespace sampling_detail {

using device::AlignedVector;
using device::kFullMask;
using device::kWarpThreads;

// fn(index, value) for every element of the row, strided over the block's threads.
template <typename T, typename Fn>
__device__ __forceinline__ void ForEach(const T* row, int64_t n, Fn&& fn) {
  constexpr int kVec = device::kVecSize<T>;
  int64_t start = 0;
  if (device::is_aligned<16>(row)) {
    using Vec = AlignedVector<T, kVec>;
    const int64_t num_vecs = n / kVec;
    for (int64_t v = threadIdx.x; v < num_vecs; v += blockDim.x) {
      Vec a;
      a.load(row, v);
#pragma unroll
      for (int k = 0; k < kVec; ++k) fn(v * kVec + k, device::to_float(a[k]));
    }
    start = num_vecs * kVec;
  }
  for (int64_t i = start + threadIdx.x; i < n; i += blockDim.x) fn(i, device::to_float(row[i]));
}

// Order-preserving map float -> uint32 (for non-NaN); -0 and +0 map to the same key.
__device__ __forceinline__ uint32_t Key(float f) {
  if (f == 0.0f) f = 0.0f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum over the block in thread order; *total gets the block sum.
// Block size: a multiple of 32, at most 1024.
__device__ __forceinline__ float BlockExclusiveScan(float value, float* total) {
  __shared__ float warp_sums[kWarpThreads];
  const unsigned lane = threadIdx.x % kWarpThreads, warp = threadIdx.x / kWarpThreads;
  const unsigned num_warps = blockDim.x / kWarpThreads;
  float incl = value;
#pragma unroll
  for (int offset = 1; offset < kWarpThreads; offset <<= 1) {
    const float t = __shfl_up_sync(kFullMask, incl, offset);
    if (lane >= static_cast<unsigned>(offset)) incl += t;
  }
  float excl = __shfl_up_sync(kFullMask, incl, 1);
  if (lane == 0) excl = 0.0f;
  __syncthreads();  // earlier users of warp_sums are done
  if (lane == kWarpThreads - 1) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    float s = lane < num_warps ? warp_sums[lane] : 0.0f;
#pragma unroll
    for (int offset = 1; offset < kWarpThreads; offset <<= 1) {
      const float t = __shfl_up_sync(kFullMask, s, offset);
      if (lane >= static_cast<unsigned>(offset)) s += t;
    }
    warp_sums[lane] = s;  // inclusive over warps
  }
  __syncthreads();
  const float warp_offset = warp == 0 ? 0.0f : warp_sums[warp - 1];
  *total = warp_sums[num_warps - 1];
  __syncthreads();  // keep warp_sums until everyone has read it
  return warp_offset + excl;
}

// Inverse CDF over w(i, x) (0 for dropped tokens) in index order: the first i whose running
// sum exceeds u * sum(w). Each thread owns a contiguous chunk so index order = thread order.
template <typename T, typename WeightFn>
__device__ __forceinline__ int64_t SampleIndex(const T* row, int64_t n, float u, WeightFn&& w) {
  const int64_t chunk = (n + blockDim.x - 1) / blockDim.x;
  const int64_t begin = min(n, static_cast<int64_t>(threadIdx.x) * chunk);
  const int64_t end = min(n, begin + chunk);
  float local = 0.0f;
  int64_t last_kept = -1;
  for (int64_t i = begin; i < end; ++i) {
    const float wi = w(device::to_float(row[i]));
    local += wi;
    if (wi > 0.0f) last_kept = i;
  }
  float total = 0.0f;
  const float excl = BlockExclusiveScan(local, &total);
  const float target = u * total;
  int64_t found = INT64_MAX;
  if (excl + local > target) {  // this chunk may hold the token: walk it again
    float cum = excl;
    for (int64_t i = begin; i < end; ++i) {
      const float wi = w(device::to_float(row[i]));
      if (wi <= 0.0f) continue;
      cum += wi;
      if (cum > target) {
        found = i;
        break;
      }
    }
  }
  // First hit over the block (max of the negation = min); several chunks can claim one only
  // through rounding, and the earliest wins.
  found = -device::block_reduce_max(-found);
  if (found >= n) {  // u * total rounded past the sum: take the last kept token
    found = device::block_reduce_max(last_kept);
    if (found < 0) found = 0;  // nothing kept (all weights 0)
  }
  return found;
}

// true if (va, ia) is preferred to (vb, ib) as argmax: NaN first (like torch), then the larger
// value, then the smaller index.
__device__ __forceinline__ bool Better(float va, int64_t ia, float vb, int64_t ib) {
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

template <typename T>
__global__ void GreedyKernel(int64_t* __restrict__ out, const T* __restrict__ logits,
                             int64_t vocab, int64_t stride) {
  __shared__ float part_v[kWarpThreads];
  __shared__ int64_t part_i[kWarpThreads];
  device::pdl_wait_primary();
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * stride;
  float best_v = -INFINITY;
  int64_t best_i = INT64_MAX;
  ForEach(row, vocab, [&](int64_t i, float v) {
    if (Better(v, i, best_v, best_i)) {
      best_v = v;
      best_i = i;
    }
  });
  // Warp, then block, reduction of the (value, index) pairs.
#pragma unroll
  for (int offset = kWarpThreads / 2; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(kFullMask, best_v, offset);
    const int64_t i = __shfl_xor_sync(kFullMask, best_i, offset);
    if (Better(v, i, best_v, best_i)) {
      best_v = v;
      best_i = i;
    }
  }
  const unsigned lane = threadIdx.x % kWarpThreads, warp = threadIdx.x / kWarpThreads;
  if (lane == 0) {
    part_v[warp] = best_v;
    part_i[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    const bool valid = lane < blockDim.x / kWarpThreads;
    best_v = valid ? part_v[lane] : -INFINITY;
    best_i = valid ? part_i[lane] : INT64_MAX;
#pragma unroll
    for (int offset = kWarpThreads / 2; offset > 0; offset >>= 1) {
      const float v = __shfl_xor_sync(kFullMask, best_v, offset);
      const int64_t i = __shfl_xor_sync(kFullMask, best_i, offset);
      if (Better(v, i, best_v, best_i)) {
        best_v = v;
        best_i = i;
      }
    }
    if (lane == 0) out[blockIdx.x] = best_i;
  }
  device::pdl_launch_dependents();
}

template <typename T>
__device__ __forceinline__ float RowMax(const T* row, int64_t n) {
  float m = -INFINITY;
  ForEach(row, n, [&](int64_t, float v) { m = fmaxf(m, v); });
  return device::block_reduce_max(m);
}

// Thresholds tried per pass of the top-k / top-p searches: each pass narrows the key bracket
// (up to 2^32 wide) 9-fold instead of 2-fold, so a search takes at most 11 passes, not 32.
inline constexpr int kWays = 8;

// Block sums of kWays values per thread, in a fixed order (deterministic); every thread gets
// them. Warp j adds up slot j of the warp partials. Block size: a multiple of 32, <= 1024.
template <typename V>
__device__ __forceinline__ void BlockSums(V (&v)[kWays]) {
  __shared__ V partials[kWays][kWarpThreads];
  __shared__ V sums[kWays];
  const unsigned lane = threadIdx.x % kWarpThreads, warp = threadIdx.x / kWarpThreads;
  const unsigned num_warps = blockDim.x / kWarpThreads;
#pragma unroll
  for (int j = 0; j < kWays; ++j) v[j] = device::warp_reduce_sum(v[j]);
  __syncthreads();  // the previous call may still be reading partials and sums
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < kWays; ++j) partials[j][warp] = v[j];
  }
  __syncthreads();
  for (unsigned j = warp; j < kWays; j += num_warps) {
    const V sum = device::warp_reduce_sum(lane < num_warps ? partials[j][lane] : V{});
    if (lane == 0) sums[j] = sum;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kWays; ++j) v[j] = sums[j];
}

// The kWays thresholds that split [lo, hi) into kWays + 1 near-equal parts, ascending. Once
// hi - lo <= kWays + 1 they cover every key in (lo, hi), so the next step closes the bracket.
__device__ __forceinline__ void SplitBracket(uint64_t lo, uint64_t hi, uint32_t (&mids)[kWays]) {
#pragma unroll
  for (int j = 0; j < kWays; ++j) {
    mids[j] = static_cast<uint32_t>(lo + (hi - lo) * (j + 1) / (kWays + 1));
  }
}

// Moves the bracket to the last threshold that still satisfies the search and the first that
// does not (ok[j] is true for a prefix of the thresholds). Conditional moves with constant
// indices only: an index variable would send mids and counts to local memory.
__device__ __forceinline__ void NarrowBracket(const uint32_t (&mids)[kWays],
                                              const int32_t (&counts)[kWays],
                                              const bool (&ok)[kWays], uint64_t& lo,
                                              int64_t& c_lo, uint64_t& hi, int64_t& c_hi) {
#pragma unroll
  for (int j = 0; j < kWays; ++j) {
    lo = ok[j] ? mids[j] : lo;
    c_lo = ok[j] ? counts[j] : c_lo;
  }
#pragma unroll
  for (int j = kWays - 1; j >= 0; --j) {
    hi = ok[j] ? hi : mids[j];
    c_hi = ok[j] ? c_hi : counts[j];
  }
}

// Per-element work of a search pass (functors with forced inlining, unlike lambdas, so the
// per-threshold arrays stay in registers).
struct CountAbove {  // counts[j] += key >= mids[j]
  const uint32_t (&mids)[kWays];
  int32_t (&counts)[kWays];
  __device__ __forceinline__ void operator()(int64_t, float v) const {
    const uint32_t key = Key(v);
#pragma unroll
    for (int j = 0; j < kWays; ++j) counts[j] += key >= mids[j];
  }
};

struct MassAbove {  // mass[j] += exp(v - row_max), counts[j] += 1 where key >= mids[j]
  const uint32_t (&mids)[kWays];
  float (&mass)[kWays];
  int32_t (&counts)[kWays];
  float row_max;
  __device__ __forceinline__ void operator()(int64_t, float v) const {
    const uint32_t key = Key(v);
    if (key < mids[0]) return;  // below every threshold: no exp
    const float e = expf(v - row_max);
#pragma unroll
    for (int j = 0; j < kWays; ++j) {
      const bool in = key >= mids[j];
      mass[j] += in ? e : 0.0f;
      counts[j] += in;
    }
  }
};

template <typename T>
__global__ void __launch_bounds__(1024)  // blocks of up to 1024 threads: at most 64 registers
    TopKTopPKernel(int64_t* __restrict__ out, const T* __restrict__ logits, int64_t vocab,
                   int64_t stride, const float* __restrict__ uniforms,
                   const int64_t* __restrict__ top_k, const float* __restrict__ top_p) {
  device::pdl_wait_primary();
  const int64_t b = blockIdx.x;
  const T* row = logits + b * stride;
  const float row_max = RowMax(row, vocab);
  // Invalid per-row values are clamped here (the host cannot check device data without a sync).
  const int64_t k = top_k[b];
  const float p = fminf(fmaxf(top_p[b], 0.0f), 1.0f);
  const float u = fminf(fmaxf(uniforms[b], 0.0f), 0x1.fffffep-1f);

  // Invariant of both searches: the set {key >= lo} is valid, {key >= hi} is not; c_lo and
  // c_hi are their sizes. Once they differ by at most one token, {key >= lo} is the answer.
  uint64_t lo = 0;
  uint64_t hi = static_cast<uint64_t>(Key(row_max)) + 1;  // empty set
  int64_t c_lo = vocab, c_hi = 0;
  uint32_t mids[kWays];
  int32_t counts[kWays];  // the launcher keeps vocab below 2^31
  if (k > 0 && k < vocab) {  // largest lo with count(key >= lo) >= k
    while (hi - lo > 1 && c_lo - c_hi > 1 && c_lo != k) {
      SplitBracket(lo, hi, mids);
#pragma unroll
      for (int j = 0; j < kWays; ++j) counts[j] = 0;
      ForEach(row, vocab, CountAbove{mids, counts});
      BlockSums(counts);
      bool ok[kWays];
#pragma unroll
      for (int j = 0; j < kWays; ++j) ok[j] = counts[j] >= k;
      NarrowBracket(mids, counts, ok, lo, c_lo, hi, c_hi);
    }
  }
  if (p < 1.0f) {  // largest lo with mass(key >= lo) >= p * mass(top-k set)
    float kept = 0.0f;  // mass of the top-k set
    const uint64_t top_k_lo = lo;
    ForEach(row, vocab, [&](int64_t, float v) {
      if (Key(v) >= top_k_lo) kept += expf(v - row_max);
    });
    const float target = p * device::block_reduce_sum(kept);
    float mass[kWays];
    hi = static_cast<uint64_t>(Key(row_max)) + 1;
    c_hi = 0;
    while (hi - lo > 1 && c_lo - c_hi > 1) {
      SplitBracket(lo, hi, mids);
#pragma unroll
      for (int j = 0; j < kWays; ++j) {
        mass[j] = 0.0f;
        counts[j] = 0;
      }
      ForEach(row, vocab, MassAbove{mids, mass, counts, row_max});
      BlockSums(mass);
      BlockSums(counts);
      bool ok[kWays];
#pragma unroll
      for (int j = 0; j < kWays; ++j) ok[j] = mass[j] >= target;
      NarrowBracket(mids, counts, ok, lo, c_lo, hi, c_hi);
    }
  }
  const uint64_t threshold = lo;
  const int64_t token = SampleIndex(row, vocab, u, [&](float v) {
    return Key(v) >= threshold ? expf(v - row_max) : 0.0f;
  });
  if (threadIdx.x == 0) out[b] = token;
  device::pdl_launch_dependents();
}

template <typename T>
__global__ void MinPKernel(int64_t* __restrict__ out, const T* __restrict__ probs, int64_t vocab,
                           int64_t stride, const float* __restrict__ uniforms,
                           const float* __restrict__ min_p) {
  device::pdl_wait_primary();
  const int64_t b = blockIdx.x;
  const T* row = probs + b * stride;
  const float max_p = RowMax(row, vocab);
  const float threshold = fminf(fmaxf(min_p[b], 0.0f), 1.0f) * max_p;
  const float u = fminf(fmaxf(uniforms[b], 0.0f), 0x1.fffffep-1f);
  const int64_t token =
      SampleIndex(row, vocab, u, [&](float v) { return v >= threshold ? v : 0.0f; });
  if (threadIdx.x == 0) out[b] = token;
  device::pdl_launch_dependents();
}

// Enough threads for the row (a multiple of 32 for the reductions), at most 1024.
inline int ThreadsFor(int64_t vocab) {
  return static_cast<int>(std::clamp<int64_t>(host::div_ceil(vocab, 32) * 32, 32, 1024));
}

// One block per row, ThreadsFor(vocab) threads: kernel(out, rows, vocab, stride, extra...);
// nothing for an empty batch.
template <typename Kernel, typename T, typename... Extra>
inline void LaunchRows(const sampling::SampleArgs& a, Kernel kernel, int64_t* out, const T* rows,
                       Extra... extra) {
  if (a.batch == 0) return;
  host::LaunchKernel(dim3(static_cast<unsigned>(a.batch)), dim3(ThreadsFor(a.vocab)), a.device)
      .enable_pdl(true)(kernel, out, rows, a.vocab, a.stride, extra...);
}

}  // namespace sampling_detail

/*! \brief out[b] = argmax(logits[b]) (first index on ties; a NaN wins, like torch.argmax). */
inline void greedy_sample(tvm::ffi::TensorView out, tvm::ffi::TensorView logits) {
  using host::data_ptr;
  const auto a = mllm_kernel::sampling::VerifyGreedySample<kDLCUDA>(out, logits);
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    sampling_detail::LaunchRows(a, sampling_detail::GreedyKernel<T>, data_ptr<int64_t>(out),
                                data_ptr<const T>(logits));
  });
}

/*!
 * \brief Sample from softmax(logits) restricted by top-k then top-p (rules in sampling.cpp).
 * \param top_k int64 [batch]; <= 0 disables. \param top_p float32 [batch] in (0, 1] (values
 *        outside are clamped: no host check of device data). \param uniforms float32 [batch].
 */
inline void top_k_top_p_sample(tvm::ffi::TensorView out, tvm::ffi::TensorView logits,
                               tvm::ffi::TensorView uniforms, tvm::ffi::TensorView top_k,
                               tvm::ffi::TensorView top_p) {
  using host::data_ptr;
  const auto a =
      mllm_kernel::sampling::VerifyTopKTopPSample<kDLCUDA>(out, logits, uniforms, top_k, top_p);
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    sampling_detail::LaunchRows(a, sampling_detail::TopKTopPKernel<T>, data_ptr<int64_t>(out),
                                data_ptr<const T>(logits), data_ptr<const float>(uniforms),
                                data_ptr<const int64_t>(top_k), data_ptr<const float>(top_p));
  });
}

/*!
 * \brief Sample from probs restricted to p >= min_p * max(p), renormalized.
 * \param min_p float32 [batch] in [0, 1] (clamped). \param uniforms float32 [batch].
 */
inline void min_p_sample(tvm::ffi::TensorView out, tvm::ffi::TensorView probs,
                         tvm::ffi::TensorView uniforms, tvm::ffi::TensorView min_p) {
  using host::data_ptr;
  const auto a = mllm_kernel::sampling::VerifyMinPSample<kDLCUDA>(out, probs, uniforms, min_p);
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    sampling_detail::LaunchRows(a, sampling_detail::MinPKernel<T>, data_ptr<int64_t>(out),
                                data_ptr<const T>(probs), data_ptr<const float>(uniforms),
                                data_ptr<const float>(min_p));
  });
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_SAMPLING_CUH_
