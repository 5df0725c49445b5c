/*!
 * \file mllm_kernel/cuda/reduce.cuh
 * \brief Warp and block reductions (sum, max) and the warp argmax: every participating thread
 * gets the result.
 */
#ifndef MLLM_KERNEL_CUDA_REDUCE_CUH_
#define MLLM_KERNEL_CUDA_REDUCE_CUH_

#include <mllm_kernel/cuda/types.cuh>

#include <cstdint>
#include <type_traits>

namespace mllm_kernel::device {

inline constexpr int kWarpThreads = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

/*! \brief max(a, b): the hardware max for float, double, fp16_t and bf16_t. */
template <typename T>
__device__ __forceinline__ T max_of(T a, T b) {
  if constexpr (std::is_same_v<T, float>) {
    return fmaxf(a, b);
  } else if constexpr (std::is_same_v<T, double>) {
    return fmax(a, b);
  } else if constexpr (std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t>) {
    return __hmax(a, b);
  } else {
    return a < b ? b : a;
  }
}

/*! \brief Sum over the 32 lanes of a warp; every lane gets the result. All lanes must call. */
template <typename T>
__device__ __forceinline__ T warp_reduce_sum(T value) {
#pragma unroll
  for (int offset = kWarpThreads / 2; offset > 0; offset >>= 1) {
    value = value + __shfl_xor_sync(kFullMask, value, offset);
  }
  return value;
}

/*! \brief Max over the 32 lanes of a warp; every lane gets the result. All lanes must call. */
template <typename T>
__device__ __forceinline__ T warp_reduce_max(T value) {
#pragma unroll
  for (int offset = kWarpThreads / 2; offset > 0; offset >>= 1) {
    value = max_of(value, __shfl_xor_sync(kFullMask, value, offset));
  }
  return value;
}

namespace detail {
// Shared by block_reduce_sum/max: reduce per warp, then reduce the warp partials in warp 0.
// Block size: a multiple of 32, at most 1024 (threads are linearized over x, y, z).
template <bool kMax, typename T>
__device__ __forceinline__ T warp_reduce(T value) {
  if constexpr (kMax) {
    return warp_reduce_max(value);
  } else {
    return warp_reduce_sum(value);
  }
}

template <bool kMax, typename T>
__device__ __forceinline__ T block_reduce(T value) {
  // Raw storage: __shared__ forbids element types with constructors.
  // kWarpThreads warp partials, then the result in a slot of its own (no barrier needed between
  // warp 0's reads of the partials and the result's write).
  __shared__ alignas(T) unsigned char storage[(kWarpThreads + 1) * sizeof(T)];
  T* partials = reinterpret_cast<T*>(storage);
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned lane = tid % kWarpThreads;
  const unsigned warp = tid / kWarpThreads;
  const unsigned num_warps = blockDim.x * blockDim.y * blockDim.z / kWarpThreads;
  value = warp_reduce<kMax>(value);
  __syncthreads();  // a previous call may still be reading the result
  if (lane == 0) partials[warp] = value;
  __syncthreads();
  if (warp == 0) {
    // Lanes past num_warps re-read partial 0: a neutral element for max, zeroed for sum.
    value = partials[lane < num_warps ? lane : 0];
    if (!kMax && lane >= num_warps) value = T{};
    value = warp_reduce<kMax>(value);
    if (lane == 0) partials[kWarpThreads] = value;
  }
  __syncthreads();
  return partials[kWarpThreads];
}
}  // namespace detail

/*! \brief Sum over the whole block; every thread gets the result. All threads must call. */
template <typename T>
__device__ __forceinline__ T block_reduce_sum(T value) {
  return detail::block_reduce<false>(value);
}

/*! \brief Max over the whole block; every thread gets the result. All threads must call. */
template <typename T>
__device__ __forceinline__ T block_reduce_max(T value) {
  return detail::block_reduce<true>(value);
}

/*! \brief An argmax candidate: a value and its index. */
struct ArgMax {
  float v;
  int64_t i;
};

/*! \brief Whether (va, ia) is preferred to (vb, ib) as argmax: NaN first (like torch.argmax), then
 *  the larger value, then the smaller index. */
__device__ __forceinline__ bool argmax_better(float va, int64_t ia, float vb, int64_t ib) {
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

/*! \brief The preferred candidate of a warp (argmax_better); every lane gets it. All lanes must call. */
__device__ __forceinline__ ArgMax warp_argmax(ArgMax a) {
#pragma unroll
  for (int offset = kWarpThreads / 2; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(kFullMask, a.v, offset);
    const int64_t i = __shfl_xor_sync(kFullMask, a.i, offset);
    if (argmax_better(v, i, a.v, a.i)) a = {v, i};
  }
  return a;
}

}  // namespace mllm_kernel::device

#endif  // MLLM_KERNEL_CUDA_REDUCE_CUH_
