/*!
 * \file kernels/prefill_attention/prefill_attention_sm90.cuh
 * \brief The Hopper (sm_90a) path of prefill attention: wgmma tensor-core products fed by a
 * producer warpgroup (warp specialization), included by prefill_attention.cuh, which picks it on
 * GPUs whose binary has it (HasSm90), at every head_dim (64, 128, 256).
 *
 * Persistent: one CTA per SM, a producer warpgroup and two or three consumer warpgroups (Shape),
 * runs units of work (a work item of PlanKernel for one query head) until none is left, taking
 * each next one from a counter the plan zeroes (greedy, longest items first), so that one unit's
 * loads overlap the last one's tail.
 *  - warpgroup 0 is the producer. Its thread 64 copies each unit's Q tile with TMA; warps 0-1 copy
 *    each K tile of kBlockN keys and warps 2-3 each V tile into rings of kStages (Shape) that run
 *    on across units, on barriers of their own ("full", "empty"). Whole tiles of a request's keys
 *    go by TMA (ragged K/V, or pages of kMinBoxRows rows or more); the rest (a request's
 *    last partial tile, small or odd pages, a bad block id) by cp.async, which zero-fills keys
 *    that must not be read. Paged, the lanes look up their rows' addresses before the stage wait
 *    and keep them, so the copies issue back to back; the copies then arrive on the stage's
 *    barrier by themselves (the producer goes on) and the consumers fence such tiles for wgmma.
 *  - the other warpgroups are consumers of 64 query rows each: S = Q K^T with shared-memory
 *    operands (wgmma m64nkBlockNk16), the online softmax in registers, O += P V with P from
 *    registers and V transposed by the descriptor. O += P V of tile kt - 1 is issued with S of
 *    tile kt and runs during its softmax; the consumers take turns issuing (named barriers, a
 *    ring), so one's products overlap the others' softmax. That softmax is the critical path
 *    (ncu: it outlasts its own P V), so its common case, a tile whole for the warp's rows without
 *    a soft cap, takes a single branch past the masking code.
 * setmaxnreg moves registers from the producer to the consumers.
 *
 * Shared-memory tiles use the 128-byte swizzle that wgmma descriptors name: a [rows, D] tile is
 * stored as D / 64 column blocks of [rows, 64] (128 bytes a row), 16-byte chunk c of row r at
 * chunk c ^ (r % 8) of its row; eight rows form a 1024-byte atom. Masking, clamping, the work
 * list and the epilogue follow the mma.sync kernel (same PrefillParams, same PlanKernel).
 */
#ifndef MLLM_KERNEL_KERNELS_PREFILL_ATTENTION_SM90_CUH_
#define MLLM_KERNEL_KERNELS_PREFILL_ATTENTION_SM90_CUH_

#include <mllm_kernel/utils.cuh>

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

// The wgmma / setmaxnreg code exists only in sm_90a device code; elsewhere the kernel is empty
// and HasSm90 (no static shared memory in it) keeps it from being launched.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLLM_KERNEL_PREFILL_SM90_BODY 1
#endif

namespace mllm_kernel::gpu::prefill_attention_sm90 {

using device::bf16_t;
using device::fp16_t;

// ---------------------------------------------------------------------------- building blocks

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/*!
 * \brief A wgmma shared-memory descriptor for a 128-byte-swizzled operand starting at \p p:
 * \p lbo / \p sbo are the byte strides between column blocks (MN-major operands) and between
 * 8-row atoms.
 */
__device__ __forceinline__ uint64_t sw128_descriptor(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint64_t address = smem_address(p);
  return ((address & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}

/*!
 * \brief Transposes the 4 x 4 words that the 4 lanes of a quad hold (lane q: row q, word k: column
 * k): lane q ends with column q. Two steps (s = 2, then 1) swap the off-diagonal halves: for each
 * pair of words k, k | s, a lane whose bit s is set gives and takes word k, the other word k | s.
 */
__device__ __forceinline__ void transpose_quad(uint32_t (&x)[4], int lane) {
#pragma unroll
  for (int s = 2; s >= 1; s /= 2) {
    const bool set = lane & s;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k & s) continue;
      const uint32_t got = __shfl_xor_sync(device::kFullMask, set ? x[k] : x[k | s], s);
      if (set) {
        x[k] = got;
      } else {
        x[k | s] = got;
      }
    }
  }
}

/*! \brief Byte offset of 16-byte chunk \p c of row \p r in a [rows, D] tile (layout above). */
template <int kRows>
__device__ __forceinline__ int sw128_offset(int r, int c) {
  return (c / 8) * (kRows * 128) + r * 128 + (((c % 8) ^ (r % 8)) << 4);
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
/*! \brief Whether the phase of parity \p parity of \p bar has completed, without waiting. */
__device__ __forceinline__ bool mbarrier_test(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_address(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
/*! \brief Waits until the phase of parity \p parity of \p bar has completed. */
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
/*! \brief Makes \p bar's current phase also wait for this thread's cp.async copies issued so far. */
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
/*! \brief Makes this thread's completed generic-proxy shared-memory writes visible to wgmma. */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/*! \brief An arrival that also expects \p bytes from asynchronous (TMA) copies before the phase completes. */
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
/*! \brief TMA: the box of \p map at coordinates (c0, c1, c2) into shared memory, counted on \p bar. */
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_address(bar))
      : "memory");
}

__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
          smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_address(bar))
      : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
/*! \brief Keeps the compiler from moving accesses of \p r across an asynchronous wgmma region. */
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

template <int kRegs>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

/*! \brief wgmma m64nNk16 with float32 accumulators (generated wrappers: A from shared memory or registers). */
template <typename T, int N>
struct Wgmma;

template <>
struct Wgmma<fp16_t, 64> {
  /*! \brief d (+)= A (smem, K-major) * B (smem, K-major); scale_d = 0 overwrites d. */
  static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(scale_d));
  }
  /*! \brief d (+)= A (registers, the m16n8k16 A layout per warp) * B (smem, MN-major). */
  static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
  }
};

template <>
struct Wgmma<fp16_t, 128> {
  /*! \brief d (+)= A (smem, K-major) * B (smem, K-major); scale_d = 0 overwrites d. */
  static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(scale_d));
  }
  /*! \brief d (+)= A (registers, the m16n8k16 A layout per warp) * B (smem, MN-major). */
  static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
  }
};

template <>
struct Wgmma<bf16_t, 64> {
  /*! \brief d (+)= A (smem, K-major) * B (smem, K-major); scale_d = 0 overwrites d. */
  static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(scale_d));
  }
  /*! \brief d (+)= A (registers, the m16n8k16 A layout per warp) * B (smem, MN-major). */
  static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
  }
};

template <>
struct Wgmma<bf16_t, 128> {
  /*! \brief d (+)= A (smem, K-major) * B (smem, K-major); scale_d = 0 overwrites d. */
  static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(scale_d));
  }
  /*! \brief d (+)= A (registers, the m16n8k16 A layout per warp) * B (smem, MN-major). */
  static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
  }
};

/*! \brief O += P V at head_dim 256 (S there is m64n64): d (+)= A (registers, the m16n8k16 A layout
 * per warp) * B (smem, MN-major). One macro for both 16-bit types, which differ only in the PTX
 * type name. */
#define MLLM_KERNEL_WGMMA_M64N256_RS(T, kPtxType)                                                          \
  template <>                                                                                              \
  struct Wgmma<T, 256> {                                                                                   \
    static __device__ __forceinline__ void rs(float (&d)[128], const uint32_t (&a)[4], uint64_t b, int scale_d) { \
      asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." kPtxType "." kPtxType " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d)); \
    } \
  };
MLLM_KERNEL_WGMMA_M64N256_RS(fp16_t, "f16")
MLLM_KERNEL_WGMMA_M64N256_RS(bf16_t, "bf16")
#undef MLLM_KERNEL_WGMMA_M64N256_RS

/*!
 * \brief The frame a row's exponentials are taken in (log2 units; P = 2^(x - frame)) after a
 * tile whose largest logit is \p x_max: it moves to x_max only when x_max reaches frame +
 * kFrameSlack. P may then reach about 2^8, which float32 sums and 16-bit P hold as precisely
 * as 1, and O is rescaled only when a row's max jumps that far past the frame (rarely after a
 * row's first tile), not each time it grows. A frame of -inf (no key yet) moves to any x_max;
 * an x_max of -inf (a masked tile) keeps the frame. Past |frame| 2^28, frame + kFrameSlack
 * rounds to frame and the slack is 0 (moving up is always safe).
 */
constexpr float kFrameSlack = 8.f;
__device__ __forceinline__ float NextFrame(float frame, float x_max) {
  return x_max >= frame + kFrameSlack ? x_max : frame;
}
/*! \brief Below this |frame|, s * scale - frame in one FFMA (the product not rounded first) is within 1/16 of
 * x - frame wherever P is not 0 (x within a few hundred of the frame). */
constexpr float kFusedFrameLimit = 0x1p20f;

// ---------------------------------------------------------------------------- the kernel

namespace pa = prefill_attention_detail;

/*!
 * \brief The shape per head_dim, key source and consumer count.
 *  - Consumers: warpgroups of 64 query rows each; a work item is 64 rows per consumer. Two, or
 *    three for ragged head_dim 64 with long requests (LaunchPrefill picks): there a tile's softmax
 *    costs as much as its products, and with a third warpgroup the tensor cores have work while
 *    two others are in their softmax (FlashInfer and FlashAttention-3 take 192 rows there too).
 *  - Keys per tile: S is 64 x kBlockN per consumer warpgroup, O 64 x D (at head_dim 256 a consumer
 *    thread holds 128 floats of O, 32 of S and 16 words of P).
 *  - Stages: two K/V tiles in the ring. Head_dim 64 and 128 have room for three next to Q in the
 *    227 KiB a block may use, but ran faster with two (H200, benchmarks/TUNING.md, "ring depth"):
 *    ragged 0.3-2%, paged 4-16% at page sizes 64-256 and up to 9% at 1 and 8; page size 16 lost 2%.
 *  - Registers: setmaxnreg moves them from the producer to the consumers, within the CTA's. The
 *    paged producer at head_dim 64 and 128 (block ids and row pointers of 128-key tiles) takes 72
 *    (with 56 it spills 16 bytes; earlier spills of 24-136 slowed even the TMA tiles 5-10%), leaving the consumers 216
 *    (they use up to R206). Head_dim 256's consumers need 224 (216 ran 7-11% slower), and its
 *    producer fits 56 by taking row pointers by shuffles. Ragged takes 56 / 224, or 32 with three
 *    consumers of 160 (152 spilled in the tile loop and ran 25% slower, measured).
 */
constexpr int kRingStages = 2;  // K/V tiles in the ring (Shape's comment says why two)

// Paged caches go by TMA boxes only for pages of at least 32 rows (4 KiB a box of 64 columns):
// smaller pages go faster by the warpgroup's cp.async copies (H200, benchmarks/TUNING.md v174:
// pages of 16 at head_dim 256 1.12x; at 128 since v167). Pages of 32 stay on TMA: by cp.async,
// head_dim 128 causal lost 12%.
constexpr int kMinBoxRows = 32;

template <int D, bool kPaged, int kConsumers_ = 2>
struct Shape {
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kBlockN = D <= 128 ? 128 : 64;
  static constexpr int kStages = kRingStages;
  static constexpr bool kBigProducer = kPaged && D <= 128;  // Registers (above) says why
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : kBigProducer ? 72 : 56;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : kBigProducer ? 216 : 224;
  static_assert(kConsumers == 2 || (kConsumers == 3 && !kPaged), "three consumers: ragged only");
  // setmaxnreg moves registers within what the CTA got at launch, kThreads x the launch bound's
  // share (one CTA an SM: 65536 / kThreads in steps of 8): a warpgroup asking for more waits
  // forever.
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= kThreads * (65536 / kThreads / 8 * 8),
                "registers of a CTA");
  static_assert(kBlockM >= pa::kBlockM, "pa::MaxWork counts items of pa::kBlockM rows: larger ones fit");
};
constexpr int kProducerBarrier = 8;  // named barrier of the producer warpgroup (1 + consumer: the turns)

/*! \brief Dynamic shared memory: Q, the K/V ring, key flags; plus slack to align the tiles to 1024 bytes. */
template <typename Tile, int D>
constexpr int kSmemBytes =
    1024 + (Tile::kBlockM * D + Tile::kStages * 2 * Tile::kBlockN * D) * 2 + Tile::kStages * Tile::kBlockN;

/*! \brief One unit of work: a work item of the plan (Shape::kBlockM query rows of a request) for one query head. */
struct Unit {
  int index;  // >= the number of units: no more work
  int request, head, row0, rows;
  pa::Request req;
  int shift;            // query j sits at position j + shift
  int lo, hi;           // the keys the unit's rows can see: [lo, hi)
  int num_tiles;        // ... in tiles of kBlockN
  int tma_tiles;        // paged: tiles [0, tma_tiles) go by TMA boxes when their block ids are valid
};

/*!
 * \brief What a CTA's warpgroups share besides the tiles. Each CTA runs units until none is left
 * (one CTA per SM, persistent): the producer's thread 0 takes the CTA's unit j from the plan's
 * counter and writes it to unit[j % 2] for the producer warpgroup (kProducerBarrier); thread 64 copies it
 * to handed[j % 2] for the consumers with its Q (q_full) once they are done with unit j - 1's Q
 * (q_empty). The units stay in shared memory, read where needed, rather than in registers.
 */
struct CtaState {
  uint64_t q_full;                // thread 64: the unit handed on and, when it has keys, its Q landed
  uint64_t q_empty;               // every consumer thread: the unit's last S = Q K^T is done
  uint64_t k_full[kRingStages];   // its 64 K loaders: the stage's K tile (and key flags) landed
  uint64_t v_full[kRingStages];   // its 64 V loaders: the stage's V tile landed
  uint64_t k_empty[kRingStages];  // every consumer thread: done with the stage's K tile
  uint64_t v_empty[kRingStages];  // ... and with its V tile
  Unit unit[2];
  Unit handed[2];
};

/*!
 * \brief TMA descriptors: q [tokens, heads, D]; k and v the same when ragged, or the paged caches
 * [blocks, block_size, heads, D] when `paged_rows` > 0 (boxes of that many rows of one page).
 * Boxes hold one head's 64 columns with the 128-byte swizzle (one column block of a tile); rows
 * past the last token read as zeros. Passed by value (__grid_constant__), so a captured CUDA
 * graph keeps them as it keeps the pointers.
 */
struct TmaMaps {
  CUtensorMap q, k, v;
  int paged_rows;  // paged: rows per box (0: the paged caches are copied with cp.async only)
};

/*! \brief cuTensorMapEncodeTiled (found through the runtime) of a 16-bit tensor, 128-byte swizzle. */
template <typename T, int kRank>
inline void EncodeMap(CUtensorMap* map, const T* base, const cuuint64_t (&dims)[kRank],
                      const cuuint64_t (&byte_strides)[kRank - 1], const cuuint32_t (&box)[kRank], const char* what) {
  static const auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  host::RuntimeCheck(encode != nullptr, "prefill attention: the CUDA driver has no cuTensorMapEncodeTiled");
  cuuint32_t unit[kRank];
  for (int i = 0; i < kRank; ++i) unit[i] = 1;
  const CUresult result =
      encode(map, std::is_same_v<T, fp16_t> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, kRank,
             const_cast<T*>(base), dims, byte_strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  host::RuntimeCheck(result == CUDA_SUCCESS, "prefill attention: cuTensorMapEncodeTiled(", what, ") failed with CUresult ",
                     static_cast<int>(result));
}

/*! \brief [tokens, heads, D] with a token stride; 0 tokens encode as 1 (nothing is read then). */
template <typename T>
inline void EncodeTokensMap(CUtensorMap* map, const T* base, int64_t tokens, int64_t heads, int64_t token_stride, int D,
                            int box_rows, const char* what) {
  EncodeMap<T, 3>(map, base, {cuuint64_t(D), cuuint64_t(heads), cuuint64_t(std::max<int64_t>(tokens, 1))},
                  {cuuint64_t(D) * sizeof(T), cuuint64_t(token_stride) * sizeof(T)},
                  {64, 1, cuuint32_t(box_rows)}, what);
}

/*!
 * \brief Rows per paged box: whole pages of at least kMinBoxRows rows that tile kBlockN, or
 * kBlockN rows of larger pages that kBlockN divides; 0 (cp.async only) for other block sizes.
 */
template <int D>
inline int PagedBoxRows(int64_t block_size) {
  constexpr int kBlockN = Shape<D, true>::kBlockN;
  if (block_size >= kMinBoxRows && block_size <= kBlockN && kBlockN % block_size == 0) return static_cast<int>(block_size);
  if (block_size > kBlockN && block_size % kBlockN == 0) return kBlockN;
  return 0;
}

template <typename T, int D, bool kPaged, int kConsumers>
TmaMaps MakeTmaMaps(const pa::PrefillParams<T>& p) {
  using Tile = Shape<D, kPaged, kConsumers>;
  constexpr int kBlockN = Tile::kBlockN;
  TmaMaps maps{};
  EncodeTokensMap(&maps.q, p.q, p.total_q, p.num_heads, p.q_stride, D, Tile::kBlockM, "q");
  if constexpr (!kPaged) {
    EncodeTokensMap(&maps.k, p.k, p.total_k, p.num_kv_heads, p.k_stride, D, kBlockN, "k");
    EncodeTokensMap(&maps.v, p.v, p.total_k, p.num_kv_heads, p.v_stride, D, kBlockN, "v");
  } else if (const int rows = PagedBoxRows<D>(p.block_size.d); rows > 0 && p.num_blocks > 0) {
    const cuuint64_t dims[4] = {cuuint64_t(D), cuuint64_t(p.num_kv_heads), cuuint64_t(p.block_size.d),
                                cuuint64_t(p.num_blocks)};
    const cuuint32_t box[4] = {64, 1, cuuint32_t(rows), 1};
    const cuuint64_t row_bytes = cuuint64_t(p.num_kv_heads) * D * sizeof(T);
    EncodeMap<T, 4>(&maps.k, p.k, dims, {cuuint64_t(D) * sizeof(T), row_bytes, cuuint64_t(p.k_stride) * sizeof(T)}, box,
                    "k_cache");
    EncodeMap<T, 4>(&maps.v, p.v, dims, {cuuint64_t(D) * sizeof(T), row_bytes, cuuint64_t(p.v_stride) * sizeof(T)}, box,
                    "v_cache");
    maps.paged_rows = rows;
  }
  return maps;
}

template <typename T, int D, bool kPaged, int kConsumers_ = 2>
__global__ void __launch_bounds__((Shape<D, kPaged, kConsumers_>::kThreads), 1)
    PrefillKernelSm90(const pa::PrefillParams<T> p, const __grid_constant__ TmaMaps maps) {
#ifdef MLLM_KERNEL_PREFILL_SM90_BODY
  using Tile = Shape<D, kPaged, kConsumers_>;
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kStages = Tile::kStages;
  constexpr int kConsumers = Tile::kConsumers, kConsumerThreads = 128 * kConsumers;
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int kTileBytes = kBlockN * D * 2;
  __shared__ CtaState cta;  // static shared memory: what HasSm90 looks for
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* q_tile = smem_raw + (1024 - smem_address(smem_raw) % 1024) % 1024;  // [kBlockM, D]
  unsigned char* kv_tiles = q_tile + kBlockM * D * 2;         // [kStages][K, V][kBlockN, D]
  uint8_t* key_ok = kv_tiles + kStages * 2 * kTileBytes;      // [kStages][kBlockN]

  device::pdl_wait_primary();  // the plan (and q, k, v from earlier kernels)
  const pa::Workspace ws(p.workspace, p.batch);
  const int num_units = *ws.num_work * p.num_heads;
  const bool use_mask = p.mask != nullptr;
  const bool upper = (p.causal && !use_mask) || p.window > 0;  // keys past a query's position are masked

  if (threadIdx.x == 0) {
    mbarrier_init(&cta.q_full, 1);
    mbarrier_init(&cta.q_empty, kConsumerThreads);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&cta.k_full[s], 64);
      mbarrier_init(&cta.v_full[s], 64);
      mbarrier_init(&cta.k_empty[s], kConsumerThreads);
      mbarrier_init(&cta.v_empty[s], kConsumerThreads);
    }
  }
  __syncthreads();


  if (threadIdx.x < 128) {
    // ------------------------------------------------------------ producer warpgroup
    registers_decrease<Tile::kProducerRegs>();
    const int t = threadIdx.x;
    // Warps 0-1 copy K tiles (and write the key flags), warps 2-3 V tiles, each on its own
    // barriers: a K tile is handed over as soon as it lands, whatever V is doing. Thread 64 also
    // copies each unit's Q once the previous unit's last S = Q K^T is done (V tiles are needed
    // last, so their wait costs least).
    const bool loads_k = t < 64;
    uint64_t* full = loads_k ? cta.k_full : cta.v_full;
    uint64_t* empty = loads_k ? cta.k_empty : cta.v_empty;
    const T* src_base = loads_k ? p.k : p.v;
    const int64_t src_stride = loads_k ? p.k_stride : p.v_stride;
    int g = 0;  // tiles this CTA has copied: tile g goes to stage g % kStages
    for (int j = 0;; ++j) {
      Unit& u = cta.unit[j % 2];
      if (t == 0) {  // the CTA's first unit is its own number, later ones come from the plan's counter
        const int index = j == 0 ? static_cast<int>(blockIdx.x) : static_cast<int>(gridDim.x) + atomicAdd(ws.next_unit, 1);
        u.index = index;
        if (index < num_units) {
          // Units in the order (KV head, work item, query head of its group): the CTAs at work at
          // one time share few K/V heads (which stay in L2), and each KV head's items come longest first.
          const int num_items = *ws.num_work, in_group = index % p.group, rest = index / p.group;
          const int2 item = ws.work[rest % num_items];
          const pa::Request req = ws.requests[item.x];
          const int row0 = item.y * kBlockM, rows = min(kBlockM, req.len_q - row0);
          const pa::KeyRange keys = pa::VisibleKeys(req, row0, rows, upper, p.window);
          const int lo = keys.lo, hi = keys.hi;
          u.request = item.x;
          u.head = rest / num_items * p.group + in_group;
          u.row0 = row0;
          u.rows = rows;
          u.req = req;
          u.shift = req.len_k - req.len_q;
          u.lo = lo;
          u.hi = hi;
          u.num_tiles = hi > lo ? (hi - lo + kBlockN - 1) / kBlockN : 0;
          // Whole tiles that start on a box (paged_rows, a power of two, divides kBlockN). The
          // consumers fence the other tiles, which go by cp.async, for wgmma.
          u.tma_tiles = maps.paged_rows > 0 && (lo & (maps.paged_rows - 1)) == 0 && hi > lo ? (hi - lo) / kBlockN : 0;
        }
      }
      asm volatile("bar.sync %0, 128;\n" ::"n"(kProducerBarrier) : "memory");  // unit j is written
      const bool done = u.index >= num_units;
      // Thread 64 hands the unit (and its Q) to the consumers once they are done with unit j - 1's
      // Q. Paged, it looks before and after the stage waits of the unit's first kStages V tiles and
      // waits only after them, so that its warp's row lookups and V copies do not queue behind the
      // consumers' last S = Q K^T of unit j - 1 (causal pages 1 and 16: 1.10x and 1.17x; ragged
      // rows lost up to 3% with it: benchmarks/TUNING.md v178).
      bool q_owed = t == 64;
      auto hand_on = [&](bool wait) {
        if (!q_owed) return;
        if (j > 0 && wait) mbarrier_wait(&cta.q_empty, (j - 1) & 1);
        if (j > 0 && !wait && !mbarrier_test(&cta.q_empty, (j - 1) & 1)) return;
        q_owed = false;
        cta.handed[j % 2] = u;
        if (!done && u.num_tiles > 0) {
          mbarrier_arrive_expect_tx(&cta.q_full, kBlockM * D * 2);
          for (int c = 0; c < D / 64; ++c) {  // rows past the request are another's (never written back) or zeros
            tma_load_3d(q_tile + c * kBlockM * 128, &maps.q, c * 64, u.head, u.req.q_start + u.row0, &cta.q_full);
          }
        } else {
          mbarrier_arrive(&cta.q_full);
        }
      };
      if (!kPaged || done || u.num_tiles == 0) hand_on(true);
      if (done) break;
      const int kvh = u.head / p.group;
      const int32_t* table = kPaged ? p.block_table + static_cast<int64_t>(u.request) * p.table_stride : nullptr;
      const int hi = u.hi;
      for (int kt = 0; kt < u.num_tiles; ++kt, ++g) {
        hand_on(kt >= kStages);  // from there, the stage wait below needs the consumers on this unit
        const int stage = g % kStages;
        const int key0 = u.lo + kt * kBlockN;
        // Paged: the tile's block ids, read before waiting for the stage (their latency overlaps
        // the wait); the tile goes by TMA when they are all valid.
        constexpr int kMaxBoxes = kBlockN / kMinBoxRows;
        int32_t blocks[kMaxBoxes];
        bool paged_tma = false;
        if constexpr (kPaged) {
          if (kt < u.tma_tiles) {
            paged_tma = true;
#pragma unroll
            for (int i = 0; i < kMaxBoxes; ++i) {
              if (i < kBlockN / maps.paged_rows) {
                blocks[i] = table[p.block_size.div(static_cast<uint32_t>(key0 + i * maps.paged_rows))];
                paged_tma = paged_tma && blocks[i] >= 0 && blocks[i] < p.num_blocks;
              }
            }
          }
        }
        // Paged tiles that go by cp.async (block sizes without TMA boxes, bad block ids): eight
        // lanes share a row, each copying 16 of every 128 contiguous bytes, so one copy
        // instruction of a warp moves whole 128-byte lines of four rows (four lanes a row, half
        // lines of eight rows, ran 1.07-1.47x slower at pages 1-16, benchmarks/TUNING.md v173).
        // The rows' addresses are looked up before the stage wait, like the TMA path's block ids:
        // each lane looks up rows lane + 32 i, and the copies take their pointers by shuffles.
        constexpr int kLanes = 8, kRowsPerCopy = 32 / kLanes;  // the copy loop's swizzle below assumes 8 (whole lines)
        constexpr int kRowsPerWarp = kBlockN / 2;
        constexpr int kHeld = kRowsPerWarp / 32;
        const int lane = t % 32, warp_row0 = t % 64 / 32 * kRowsPerWarp;
        const T* held[kHeld];  // K or V of head kvh of rows lane + 32 i; null: not read
        int bad_j = -1, bad_block = 0;  // a bad block id met by this thread (recorded once below)
        if (kPaged && !paged_tma) {
          const T* lane_base = src_base + static_cast<int64_t>(kvh) * D;
#pragma unroll
          for (int i = 0; i < kHeld; ++i) {
            const int key = key0 + warp_row0 + lane + 32 * i;
            held[i] = nullptr;
            if (key < hi) {
              const uint32_t jb = p.block_size.div(static_cast<uint32_t>(key));
              const int32_t block = table[jb];
              if (block >= 0 && block < p.num_blocks) {
                // A row within a block is block_size * num_kv_heads * D elements at most: int.
                const int in_block = (key - static_cast<int>(jb * p.block_size.d)) * p.num_kv_heads * D;
                held[i] = lane_base + block * src_stride + in_block;
              } else if (loads_k) {
                bad_j = jb;
                bad_block = block;
              }
            }
          }
        }
        if (g >= kStages) mbarrier_wait(&empty[stage], (g / kStages - 1) & 1);
        hand_on(false);
        unsigned char* dst = kv_tiles + stage * 2 * kTileBytes + (loads_k ? 0 : kTileBytes);
        if (!kPaged && key0 + kBlockN <= hi) {
          // A whole tile of the request's keys: TMA, one box per 64 columns. Tiles that end past
          // the keys take the cp.async path below, which zero-fills: a neighbour's V rows may hold
          // anything (0 * inf would be NaN).
          if (loads_k) {
            for (int r = t; r < kBlockN; r += 64) key_ok[stage * kBlockN + r] = 1;
          }
          if (t % 64 == 0) {
            mbarrier_arrive_expect_tx(&full[stage], kTileBytes);
            for (int c = 0; c < D / 64; ++c) {
              tma_load_3d(dst + c * kBlockN * 128, loads_k ? &maps.k : &maps.v, c * 64, kvh, u.req.k_start + key0,
                          &full[stage]);
            }
          } else {
            mbarrier_arrive(&full[stage]);
          }
          continue;
        }
        if (paged_tma) {
          // Whole pages (or page slices) of valid block ids: one box per page and 64 columns. A
          // bad id sends the tile to the cp.async path, which masks its keys and records it.
          if (loads_k) {
            for (int r = t; r < kBlockN; r += 64) key_ok[stage * kBlockN + r] = 1;
          }
          if (t % 64 == 0) {
            mbarrier_arrive_expect_tx(&full[stage], kTileBytes);
#pragma unroll
            for (int i = 0; i < kMaxBoxes; ++i) {
              if (i < kBlockN / maps.paged_rows) {
                const int key = key0 + i * maps.paged_rows;
                const int row = key - static_cast<int>(p.block_size.div(static_cast<uint32_t>(key)) * p.block_size.d);
                for (int c = 0; c < D / 64; ++c) {
                  tma_load_4d(dst + c * kBlockN * 128 + i * maps.paged_rows * 128, loads_k ? &maps.k : &maps.v, c * 64,
                              kvh, row, blocks[i], &full[stage]);
                }
              }
            }
          } else {
            mbarrier_arrive(&full[stage]);
          }
          continue;
        }
        if constexpr (kPaged) {
          // Chunk c = 8 q + lane % 8 of row r = r0 + 4 i lands at sw128_offset(r, c): column block
          // q, chunk (lane % 8) ^ (r % 8) within the row, and r % 8 = lane / 8 ^ 4 (i % 2)
          // (warp_row0 is a multiple of 8 and lane / 8 < 4): the lane's swizzle, ^ 4 on odd i.
          if (loads_k) {
#pragma unroll
            for (int i = 0; i < kHeld; ++i) {
              key_ok[stage * kBlockN + warp_row0 + lane + 32 * i] = held[i] != nullptr;
            }
          }
          const int r0 = warp_row0 + lane / kLanes, swizzle = (lane % kLanes) ^ (lane / kLanes);
          unsigned char* const row_dst[2] = {dst + r0 * 128 + (swizzle << 4), dst + r0 * 128 + ((swizzle ^ 4) << 4)};
#pragma unroll
          for (int i = 0; i < kRowsPerWarp / kRowsPerCopy; ++i) {
            const auto bits = reinterpret_cast<unsigned long long>(held[i * kRowsPerCopy / 32]);  // from the lane that looked it up
            const T* row = reinterpret_cast<const T*>(__shfl_sync(device::kFullMask, bits, (i * kRowsPerCopy + lane / kLanes) % 32));
            const bool ok = row != nullptr;
            const T* src = ok ? row + lane % kLanes * 8 : src_base;
#pragma unroll
            for (int q = 0; q < kChunks / kLanes; ++q) {
              device::cp_async_16(row_dst[i % 2] + q * (kBlockN * 128) + kRowsPerCopy * i * 128, src + q * kLanes * 8, ok);
            }
          }
        } else {
          // A ragged request's last tile: its row offsets are arithmetic, nothing to look up.
#pragma unroll 4
          for (int i = t % 64; i < kBlockN * kChunks; i += 64) {
            const int r = i / kChunks, c = i % kChunks;
            const int key = key0 + r;
            const bool ok = key < hi;
            const T* src = ok ? src_base + (u.req.k_start + key) * src_stride + static_cast<int64_t>(kvh) * D + c * 8 : src_base;
            device::cp_async_16(dst + sw128_offset<kBlockN>(r, c), src, ok);
            if (loads_k && c == 0) key_ok[stage * kBlockN + r] = ok;
          }
        }
        if (kPaged && bad_j >= 0 && u.head % p.group == 0) pa::record(p.error, pa::kBlockTable, u.request, bad_j, bad_block);
        if (kPaged && kt >= u.tma_tiles) {
          // The stage's phase completes once every loader's copies have landed; the producer
          // goes on to the next tile's lookups meanwhile. The consumers fence such tiles.
          cp_async_mbarrier_arrive(&full[stage]);
        } else {  // a ragged request's last tile, or a TMA tile with a bad block id (rare)
          device::cp_async_commit();
          device::cp_async_wait<0>();  // this stage's tile (zero-filled where not read)
          fence_proxy_async();
        }
        mbarrier_arrive(&full[stage]);
      }
      hand_on(true);
    }
    return;
  }

  // -------------------------------------------------------------- consumer warpgroups
  registers_increase<Tile::kConsumerRegs>();
  // Paged tiles copied by cp.async (generic proxy) reach wgmma (async proxy) through a proxy
  // fence after the stage's wait; TMA tiles need none. Which tiles those are follows from the
  // unit (Unit::tma_tiles), known before the wait.
  int tma_tiles = 0;
  auto fence_copies = [&](int kt) {
    if (kPaged && kt >= tma_tiles) fence_proxy_async();
  };
  // Through a shuffle, so that the compiler knows it to be warp-uniform: the Q descriptors built
  // from it then live in uniform registers (otherwise each product's descriptor is computed in
  // ordinary registers and moved over, 5 instructions per wgmma).
  const int consumer = __shfl_sync(device::kFullMask, static_cast<int>(threadIdx.x / 128), 0) - 1;
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  const int wrow = consumer * 64 + warp * 16;  // the warp's first row in the tile
  // Per lane: rows wrow + lane / 4 (h = 0) and + 8 (h = 1): frame m (log2 units, NextFrame), sum l, O
  // (o[4 n + c]: columns 8 n + 2 (lane % 4) + c % 2 of row h = c / 2, the wgmma accumulator layout).
  float m[2], l[2];
  float o[D / 2];
  int pos[2];
  int g = 0;  // tiles this CTA has consumed (stage g % kStages)
  // The unit's tiles [unmasked_lo, unmasked_hi) need no mask for any of the warp's 16 rows (set
  // once a unit, so that a tile costs two compares to classify).
  int unmasked_lo = 0, unmasked_hi = 0;
  int64_t mask_base = 0;
  const Unit* unit = nullptr;  // the unit being run, in shared memory
  float s[kBlockN / 2];                 // S of the current tile, then its P (float)
  uint32_t pv[kBlockN / 16][4];         // P of the previous tile as the A operand of O += P V
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) s[i] = 0.f;

  // S = Q K^T of tile kt: D / 16 products, 32 bytes of each row per product.
  // The descriptors are offsets (in 16-byte units) from two bases; at head_dim 256 the Q base is
  // made opaque so that the compiler recomputes them per tile instead of keeping 16 of them live
  // (they would spill).
  auto issue_qk = [&](int stage) {
    uint64_t a0 = sw128_descriptor(q_tile + consumer * 64 * 128, 16, 1024);
    const uint64_t b0 = sw128_descriptor(kv_tiles + stage * 2 * kTileBytes, 16, 1024);
    if constexpr (D > 128) asm volatile("" : "+l"(a0));
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const uint64_t a = a0 + (((ks / 4) * (kBlockM * 128) + (ks % 4) * 32) >> 4);
      const uint64_t bk = b0 + (((ks / 4) * (kBlockN * 128) + (ks % 4) * 32) >> 4);
      Wgmma<T, kBlockN>::ss(s, a, bk, ks > 0);
    }
    wgmma_commit();
  };
  // O += P V, 16 keys per product: V is [keys, D] (D contiguous), so its descriptor is MN-major
  // (transposed): 64-column blocks kBlockN * 128 bytes apart, 8-key atoms 1024 bytes apart.
  auto issue_pv = [&](int stage) {
    const uint64_t v0 = sw128_descriptor(kv_tiles + stage * 2 * kTileBytes + kTileBytes, kBlockN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) Wgmma<T, D>::rs(o, pv[kk], v0 + ((kk * 16 * 128) >> 4), 1);
    wgmma_commit();
  };
  // P's float accumulator layout is the A operand's register layout.
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
#pragma unroll
      for (int e = 0; e < 4; ++e) pv[kk][e] = device::pack2<T>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
    }
  };
  // Masks and the soft cap of the unit's tile kt (in stage), applied to s in place. Few tiles
  // need it (a row's edge tiles, or calls with a cap or a custom mask): the softmax calls it
  // out of its common path.
  auto cap_and_mask = [&](int kt, int stage, bool masked, bool bad_block) {
    const Unit& u = *unit;
    const int key0 = u.lo + kt * kBlockN, hi = u.hi;
    // A row keeps one range of the tile's keys, [window start, min(its position, end of keys)]:
    // first / last are columns relative to the lane's 2 (lane % 4), two compares a logit. A custom
    // mask or a bad block id (a key flag of 0) makes every key a lookup, into keep_bits.
    const bool per_key = use_mask || bad_block;
    int first[2], last[2];
    uint32_t keep_bits[2] = {~0u, ~0u};  // bit 2 n + e: column 8 n + 2 (lane % 4) + e
    if (masked) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int qpos = pos[h], lane_key0 = key0 + (lane % 4) * 2;
        last[h] = (upper ? min(hi - 1, qpos) : hi - 1) - lane_key0;
        first[h] = p.window > 0 ? qpos - p.window + 1 - lane_key0 : -kBlockN;
      }
    }
    if (masked && per_key) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int qpos = pos[h], jq = qpos - u.shift;
        uint32_t bits = 0;
#pragma unroll 1
        for (int i = 0; i < kBlockN / 4; ++i) {
          const int col = (i / 2) * 8 + (lane % 4) * 2 + (i & 1);
          const int key = key0 + col;
          bool keep = key < hi && key_ok[stage * kBlockN + col];
          if (upper) keep = keep && key <= qpos;
          if (p.window > 0) keep = keep && key > qpos - p.window;
          if (use_mask && keep && jq < u.req.len_q) {
            const int64_t at = mask_base + static_cast<int64_t>(jq) * u.req.len_k + key;
            keep = at < p.mask_size && p.mask[at] != 0;
          }
          bits |= static_cast<uint32_t>(keep) << i;
        }
        keep_bits[h] = bits;
      }
    }
    if (p.soft_cap) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) s[i] = tanhf(s[i] * p.q_scale) * p.logit_scale;
    }
    // After the cap (tanh(-inf) would be -1). Three loops, so that a logit costs only the
    // compares it needs: a lookup (custom mask, bad block id), both ends of the range (a
    // window), or its upper end (causal, or a request's last partial tile).
    auto mask_where = [&](auto drop) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        const int n = i / 4, c = i % 4;
        if (drop(c / 2, 8 * n + (c & 1), 2 * n + (c & 1))) s[i] = -INFINITY;
      }
    };
    if (masked && per_key) {
      mask_where([&](int h, int, int bit) { return ((keep_bits[h] >> bit) & 1u) == 0; });
    } else if (masked && p.window > 0) {
      mask_where([&](int h, int col, int) { return col < first[h] || col > last[h]; });
    } else if (masked) {
      mask_where([&](int h, int col, int) { return col > last[h]; });
    }
  };
  // The logits of the unit's tile kt (in stage), the running max and sum; s becomes P
  // (unnormalized, in the row's frame) and rescale the factor that moves O to that frame.
  auto softmax = [&](int kt, int stage, float (&rescale)[2]) {
    // Per-key masks only in tiles that are not whole for the warp's rows (as the mma.sync
    // kernel). A whole tile with a key flag of 0 met a bad block id (paged only: the flags
    // travel with the stage, so no flag shared across stages is read while the producer writes it).
    bool bad_block = false;
    if constexpr (kPaged) {
      const uint4* flags = reinterpret_cast<const uint4*>(key_ok + stage * kBlockN);
#pragma unroll
      for (int i = 0; i < kBlockN / 16; ++i) {
        const uint4 f = flags[i];
        bad_block = bad_block || (f.x & f.y & f.z & f.w) != 0x01010101u;
      }
    }
    const bool masked = use_mask || bad_block || kt < unmasked_lo || kt >= unmasked_hi;
    if (__builtin_expect(masked || p.soft_cap, 0)) cap_and_mask(kt, stage, masked, bad_block);
    const float sc = p.soft_cap ? 1.f : p.q_scale;  // the cap leaves scaled logits
    // The max over s (scale > 0: the max of x = s * scale is the max of s times scale).
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) row_max[i % 4 / 2] = fmaxf(row_max[i % 4 / 2], s[i]);
    float m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(device::kFullMask, row_max[h], 1));
      row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(device::kFullMask, row_max[h], 2));
      const float m_new = NextFrame(m[h], row_max[h] * sc);
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // no key yet: everything stays 0
      rescale[h] = device::exp2_approx(m[h] - m_use[h]);
      m[h] = m_new;
      l[h] *= rescale[h];
    }
    // P = 2^(s * scale - frame) in one FFMA and an exp2. The FFMA does not round the product,
    // so P may differ from 2^(x - frame) by x's rounding error, half an ulp: a factor of 2^(1/16)
    // at most below kFusedFrameLimit. Past it (absurd logits) x is rounded first, as in the
    // mma.sync kernel: half an ulp reaches 8 at 2^27 (16-bit P would overflow) and 128 at 2^31
    // (exp2 would).
    if (__builtin_expect(fabsf(m_use[0]) < kFusedFrameLimit && fabsf(m_use[1]) < kFusedFrameLimit, 1)) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        s[i] = device::exp2_approx(fmaf(s[i], sc, -m_use[i % 4 / 2]));
        l[i % 4 / 2] += s[i];
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        s[i] = device::exp2_approx(__fmul_rn(s[i], sc) - m_use[i % 4 / 2]);
        l[i % 4 / 2] += s[i];
      }
    }
  };

  // The consumers take turns at the tensor cores in a ring (named barrier 1 + c: "consumer c may
  // issue"): one issues its products while the others run their softmax. Within a consumer, O +=
  // P V of tile kt - 1 runs while the softmax of tile kt does. Every consumer has as many issue
  // blocks (they share each unit's tiles). Each block waits for its turn and passes it on; the
  // last consumer starts the ring with a pass of its own, and consumer 0 takes the last pass
  // after its last unit, so that every arrival is matched.
  auto wait_turn = [&] { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + consumer) : "memory"); };
  auto pass_turn = [&] { asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + (consumer + 1) % kConsumers) : "memory"); };
  if (consumer == kConsumers - 1) pass_turn();
  for (int j = 0;; ++j) {
    mbarrier_wait(&cta.q_full, j & 1);  // the unit handed on, and its Q when it has keys to see
    unit = &cta.handed[j % 2];
    const Unit& u = *unit;
    // Read through a shuffle: the compiler then knows them to be warp-uniform (a plain load from
    // shared memory would leave the products' loop "divergent", and ptxas serializes wgmma there).
    if (__shfl_sync(device::kFullMask, u.index, 0) >= num_units) break;
    const int num_tiles = __shfl_sync(device::kFullMask, u.num_tiles, 0);
    if (kPaged) tma_tiles = __shfl_sync(device::kFullMask, u.tma_tiles, 0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[h] = -INFINITY;
      l[h] = 0.f;
      pos[h] = u.row0 + wrow + lane / 4 + 8 * h + u.shift;
    }
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    {
      // A tile is whole for the warp (every key visible to all its 16 rows) when it ends by
      // min(the first row's position + 1, the end of the keys) and, with a window, starts past the
      // last row's window start. The truncating division leaves no whole tile when limit < lo.
      const int warp_pos_min = u.row0 + wrow + u.shift, warp_pos_max = warp_pos_min + 15;
      const int limit = upper ? min(u.hi, warp_pos_min + 1) : u.hi;
      unmasked_hi = (limit - u.lo) / kBlockN;
      const int dropped = warp_pos_max - p.window - u.lo;  // keys at or below this offset fall out of the window
      unmasked_lo = p.window > 0 && dropped >= 0 ? dropped / kBlockN + 1 : 0;
    }
    if (use_mask) mask_base = ws.mask_offset[u.request];
    if (num_tiles > 0) {
      float rescale[2];
      mbarrier_wait(&cta.k_full[g % kStages], (g / kStages) & 1);
      fence_copies(0);
      wait_turn();
      fence_registers(s);
      wgmma_fence();
      issue_qk(g % kStages);
      pass_turn();
      wgmma_wait<0>();
      fence_registers(s);
      if (num_tiles == 1) mbarrier_arrive(&cta.q_empty);  // the unit's last read of Q is done
      softmax(0, g % kStages, rescale);  // O is still 0: nothing to rescale
      mbarrier_arrive(&cta.k_empty[g % kStages]);
      for (int kt = 1; kt < num_tiles; ++kt) {
        const int stage = (g + kt) % kStages, prev = (g + kt - 1) % kStages;
        pack_p();
        mbarrier_wait(&cta.k_full[stage], ((g + kt) / kStages) & 1);
        fence_copies(kt);
        wait_turn();
        fence_registers(s);
        fence_registers(o);
        wgmma_fence();
        issue_qk(stage);
        mbarrier_wait(&cta.v_full[prev], ((g + kt - 1) / kStages) & 1);
        fence_copies(kt - 1);
        issue_pv(prev);
        pass_turn();
        wgmma_wait<1>();  // S of tile kt
        fence_registers(s);
        if (kt == num_tiles - 1) mbarrier_arrive(&cta.q_empty);
        softmax(kt, stage, rescale);
        mbarrier_arrive(&cta.k_empty[stage]);
        wgmma_wait<0>();  // O += P V of tile kt - 1
        fence_registers(o);
        mbarrier_arrive(&cta.v_empty[prev]);
        if (__builtin_expect(rescale[0] != 1.f || rescale[1] != 1.f, 0)) {
#pragma unroll
          for (int i = 0; i < D / 2; ++i) o[i] *= rescale[i % 4 / 2];
        }
      }
      const int last = (g + num_tiles - 1) % kStages;
      pack_p();
      mbarrier_wait(&cta.v_full[last], ((g + num_tiles - 1) / kStages) & 1);
      fence_copies(num_tiles - 1);
      wait_turn();
      fence_registers(o);
      wgmma_fence();
      issue_pv(last);
      pass_turn();
      wgmma_wait<0>();
      fence_registers(o);
      mbarrier_arrive(&cta.v_empty[last]);
      g += num_tiles;
    } else {
      mbarrier_arrive(&cta.q_empty);
    }

    // Epilogue: the rows' sums over the 4 lanes of a row, then out = O / l and lse.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[h];
      sum += __shfl_xor_sync(device::kFullMask, sum, 1);
      sum += __shfl_xor_sync(device::kFullMask, sum, 2);
      const int r = wrow + lane / 4 + 8 * h;
      const int64_t token = u.req.q_start + u.row0 + r;
      const float inv = sum == 0.f ? 0.f : 1.f / sum;  // no key: 0 and -inf
      T* dst = p.out + (token * p.num_heads + u.head) * D + (lane % 4) * 8;
      // Lane q of a row's quad holds word (n, q) of the row (columns 8 n + 2 q, + 1). A 4 x 4
      // transpose within the quad per 4 words leaves it words (4 a + q, 0..3): 16 contiguous
      // bytes, one store instead of four.
#pragma unroll
      for (int a = 0; a < D / 32; ++a) {
        uint32_t x[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int n = 4 * a + k;
          x[k] = device::pack2<T>(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
        }
        transpose_quad(x, lane);
        if (r < u.rows) *reinterpret_cast<uint4*>(dst + a * 32) = make_uint4(x[0], x[1], x[2], x[3]);
      }
      if (r < u.rows && lane % 4 == 0) {
        p.lse[token * p.num_heads + u.head] = sum == 0.f ? -INFINITY : (m[h] + log2f(sum)) * pa::kLn2;
      }
    }
  }
  if (consumer == 0) wait_turn();  // the last consumer's last pass
  device::pdl_launch_dependents();
#endif  // MLLM_KERNEL_PREFILL_SM90_BODY
}

}  // namespace mllm_kernel::gpu::prefill_attention_sm90

#endif  // MLLM_KERNEL_KERNELS_PREFILL_ATTENTION_SM90_CUH_
