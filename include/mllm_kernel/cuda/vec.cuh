/*!
 * \file mllm_kernel/cuda/vec.cuh
 * \brief 16-byte vector access: kVecBytes / kVecSize, AlignedVector (one load or store
 *        instruction for N elements) and is_aligned to check an address before using it.
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

}  // namespace mllm_kernel::device

#endif  // MLLM_KERNEL_CUDA_VEC_CUH_
