/*!
 * \file mllm_kernel/cuda/types.cuh
 * \brief CUDA element types (fp16_t, bf16_t, fp8, fp32_t) and the float conversions kernels use
 *        to read and write them while computing in float32.
 */
#ifndef MLLM_KERNEL_CUDA_TYPES_CUH_
#define MLLM_KERNEL_CUDA_TYPES_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

namespace mllm_kernel::device {

using fp16_t = __half;
using bf16_t = __nv_bfloat16;
using fp8_e4m3_t = __nv_fp8_e4m3;
using fp8_e5m2_t = __nv_fp8_e5m2;
using fp32_t = float;

// Kernels read and write float / fp16_t / bf16_t and compute in float32.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(fp16_t v) { return __half2float(v); }
__device__ __forceinline__ float to_float(bf16_t v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, fp16_t>) {
    return __float2half_rn(v);
  } else {
    static_assert(std::is_same_v<T, bf16_t>, "from_float: T must be float, fp16_t or bf16_t");
    return __float2bfloat16_rn(v);
  }
}

}  // namespace mllm_kernel::device

namespace mllm_kernel::host {

using device::bf16_t;
using device::fp16_t;
using device::fp32_t;
using device::fp8_e4m3_t;
using device::fp8_e5m2_t;

}  // namespace mllm_kernel::host

#endif  // MLLM_KERNEL_CUDA_TYPES_CUH_
