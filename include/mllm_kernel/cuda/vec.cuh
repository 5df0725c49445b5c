/*!
 * \file mllm_kernel/cuda/vec.cuh
 * \brief 16-byte vector access: kVecBytes / kVecSize, AlignedVector (one load or store
 *        instruction for N elements), is_aligned to check an address before using it, and
 *        for_each_vec_in_flight (a block's strided pass with several loads in flight a thread).
 */
#ifndef MLLM_KERNEL_CUDA_VEC_CUH_
#define MLLM_KERNEL_CUDA_VEC_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace mllm_kernel::device {

inline constexpr int kVecBytes = 16;  // widest single load/store instruction
/*! \brief Elements of T per 16-byte vector. */
template <typename T>
inline constexpr int kVecSize = kVecBytes / static_cast<int>(sizeof(T));

/*! \brief True if \p ptr is aligned to \p kBytes. */
template <int kBytes>
__host__ __device__ __forceinline__ bool is_aligned(const void* ptr) {
  static_assert(kBytes > 0 && (kBytes & (kBytes - 1)) == 0, "alignment must be a power of 2");
  return reinterpret_cast<uintptr_t>(ptr) % kBytes == 0;
}

/*!
 * \brief N elements of T moved with one (up to 16-byte) load/store instruction.
 * \note load/store index in units of whole vectors: element offset = vec_idx * N. The address
 *       must be aligned to sizeof(T) * N (check with is_aligned).
 */
template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVector {
  static_assert(N > 0 && ((sizeof(T) * N) & (sizeof(T) * N - 1)) == 0,
                "AlignedVector size must be a power of 2 bytes");
  static_assert(sizeof(T) * N <= kVecBytes, "AlignedVector is at most 16 bytes");
  static constexpr int kSize = N;
  T val[N];

  __device__ __forceinline__ void load(const T* ptr, int64_t vec_idx = 0) {
    *this = reinterpret_cast<const AlignedVector*>(ptr)[vec_idx];
  }
  __device__ __forceinline__ void store(T* ptr, int64_t vec_idx = 0) const {
    reinterpret_cast<AlignedVector*>(ptr)[vec_idx] = *this;
  }
  __device__ __forceinline__ void fill(T value) {
#pragma unroll
    for (int i = 0; i < N; ++i) val[i] = value;
  }
  __device__ __forceinline__ T& operator[](int i) { return val[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return val[i]; }
};

/*!
 * \brief fn(v, vector v of src) for v = threadIdx.x, + blockDim.x, ... < num_vecs, in that order
 *        per thread; each thread issues kLoads loads before using any, so a streaming pass keeps
 *        kLoads * 16 bytes a thread in flight (a load per step keeps one: with two blocks an SM,
 *        about 65% of copy bandwidth on an H100, benchmarks/RESULTS.md).
 */
template <int kLoads, typename Vec, typename T, typename Fn>
__device__ __forceinline__ void for_each_vec_in_flight(const T* src, int64_t num_vecs, Fn&& fn) {
  for (int64_t v0 = threadIdx.x; v0 < num_vecs; v0 += kLoads * static_cast<int64_t>(blockDim.x)) {
    Vec in[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int64_t v = v0 + j * static_cast<int64_t>(blockDim.x);
      if (v < num_vecs) in[j].load(src, v);
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int64_t v = v0 + j * static_cast<int64_t>(blockDim.x);
      if (v >= num_vecs) break;
      fn(v, in[j]);
    }
  }
}

}  // namespace mllm_kernel::device

#endif  // MLLM_KERNEL_CUDA_VEC_CUH_
