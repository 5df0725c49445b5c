/*!
 * \file mllm_kernel/cuda/fast_math.cuh
 * \brief The SFU's approximations, flush-to-zero, without the range fix-ups of __expf /
 *        __fdividef: exp2_approx (2^x within 2 ulp; 2^+big = inf, 2^-big = 0) and rcp_approx
 *        (1/x within 1 ulp). For math whose result is rounded to 16 bits, or whose per-element
 *        error cancels (a softmax row's shared exponent).
 */
#ifndef MLLM_KERNEL_CUDA_FAST_MATH_CUH_
#define MLLM_KERNEL_CUDA_FAST_MATH_CUH_

#include <cuda_runtime.h>

namespace mllm_kernel::device {

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace mllm_kernel::device

#endif  // MLLM_KERNEL_CUDA_FAST_MATH_CUH_
