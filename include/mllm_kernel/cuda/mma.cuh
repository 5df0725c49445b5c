/*!
 * \file mllm_kernel/cuda/mma.cuh
 * \brief Tensor-core building blocks shared by the attention kernels (sm_80+): cp.async copies
 *        into shared memory, the XOR swizzle of 16-byte chunks that ldmatrix reads without bank
 *        conflicts, ldmatrix, mma.sync m16n8k16 with float32 accumulation, float pairs packed to
 *        16-bit, and a division by a per-launch constant.
 *
 * Fragment layouts are the PTX ISA's for mma.m16n8k16: a lane holds rows lane / 4 and lane / 4
 * + 8, columns 2 (lane % 4) and 2 (lane % 4) + 1 of each 8 columns of the accumulator.
 */
#ifndef MLLM_KERNEL_CUDA_MMA_CUH_
#define MLLM_KERNEL_CUDA_MMA_CUH_

#include <mllm_kernel/cuda/types.cuh>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace mllm_kernel::device {

/*! \brief n / d for a divisor fixed per launch (multiply-high instead of a division; n, d < 2^31). */
struct FastDivmod {
  uint32_t d = 1, mul = 0, shift = 0;
  FastDivmod() = default;
  explicit FastDivmod(uint32_t divisor) : d(divisor) {
    while ((uint64_t{1} << shift) < d) ++shift;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (__umulhi(n, mul) + n) >> shift; }
};

/*! \brief 16 bytes global -> shared, asynchronously; fill = false zero-fills and reads nothing. */
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool fill) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = fill ? 16 : 0;
  // No "memory" clobber: that would keep the compiler from hoisting the next index loads above
  // the copy. cp_async_wait orders shared-memory reads against these writes.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/*! \brief Waits until at most kPending of this thread's commit groups are in flight. */
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/*! \brief 16-bit elements per 16-byte chunk (one cp.async, one ldmatrix row). */
inline constexpr int kChunkElems = 8;

/*! \brief Offset (in 16-byte chunks) of chunk `c` of row `r` in a [rows, D] tile of 16-bit values:
 * chunks are XOR-swizzled by the row so that ldmatrix's 8 row reads hit 8 different bank groups. */
template <int D>
__device__ __forceinline__ int swizzle(int r, int c) {
  return r * (D / kChunkElems) + (c ^ (r & 7));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

/*! \brief c += a (16x16, row) * b (16x8, col), float32 accumulation; T is fp16_t or bf16_t. */
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, fp16_t>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/*! \brief Two floats as one register of T pairs (the lower column in the low half). */
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, fp16_t>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

}  // namespace mllm_kernel::device

#endif  // MLLM_KERNEL_CUDA_MMA_CUH_
