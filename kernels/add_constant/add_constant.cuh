/*!
 * \file kernels/add_constant/add_constant.cuh
 * \brief CUDA add_constant kernel (int32): dst = src + C on torch's current stream.
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and then
 * exports e.g. TVM_FFI_DLL_EXPORT_TYPED_FUNC(add_constant, mllm_kernel::gpu::add_constant<16>).
 */
#ifndef MLLM_KERNEL_KERNELS_ADD_CONSTANT_CUH_
#define MLLM_KERNEL_KERNELS_ADD_CONSTANT_CUH_

#include <mllm_kernel/utils.cuh>

#include "add_constant.hpp"

#include <algorithm>
#include <cstdint>

// Not `cuda`: that would shadow libcu++'s ::cuda namespace inside mllm_kernel.
namespace mllm_kernel::gpu {

namespace detail {

// Signed overflow is UB; wrap like torch does by adding in uint32.
template <int C>
__device__ __forceinline__ int32_t AddWrapped(int32_t x) {
  return static_cast<int32_t>(static_cast<uint32_t>(x) + static_cast<uint32_t>(C));
}

// Grid-stride loop with 64-bit indices. kVectorized: 16-byte accesses over the first
// n / 4 * 4 elements (both pointers 16-byte aligned), then a scalar tail.
// dst may alias src (in-place), hence no __restrict__.
template <int C, bool kVectorized>
__global__ void AddConstantKernel(int32_t* dst, const int32_t* src, int64_t n) {
  device::pdl_wait_primary();  // src may be written by the previous kernel (PDL launch)
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_begin = 0;
  if constexpr (kVectorized) {
    using Vec = device::AlignedVector<int32_t, device::kVecSize<int32_t>>;
    const int64_t num_vecs = n / Vec::kSize;
    for (int64_t v = tid; v < num_vecs; v += stride) {
      Vec x;
      x.load(src, v);
#pragma unroll
      for (int k = 0; k < Vec::kSize; ++k) x[k] = AddWrapped<C>(x[k]);
      x.store(dst, v);
    }
    scalar_begin = num_vecs * Vec::kSize;
  }
  for (int64_t i = scalar_begin + tid; i < n; i += stride) dst[i] = AddWrapped<C>(src[i]);
  device::pdl_launch_dependents();
}


}  // namespace detail

/*! \brief dst = src + C for int32 1-D contiguous CUDA tensors (contract: add_constant.hpp). */
template <int C>
void add_constant(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  const auto args = mllm_kernel::add_constant::VerifyAddConstant<kDLCUDA>(dst, src);
  const int64_t num = args.n;
  if (num == 0) return;  // a zero-block grid is a launch error

  int32_t* out = host::data_ptr<int32_t>(dst);
  const int32_t* in = host::data_ptr<const int32_t>(src);
  const bool vectorized = device::is_aligned<16>(out) && device::is_aligned<16>(in);
  constexpr int kThreads = 256;
  // Enough blocks to fill any current GPU several times; the grid-stride loop covers the rest.
  constexpr int64_t kMaxBlocks = 4096;
  const int64_t work = vectorized ? div_ceil(num, device::kVecSize<int32_t>) : num;
  const auto blocks = static_cast<unsigned>(std::min(div_ceil(work, kThreads), kMaxBlocks));
  const auto kernel = vectorized ? detail::AddConstantKernel<C, true>
                                 : detail::AddConstantKernel<C, false>;
  LaunchKernel(dim3(blocks), dim3(kThreads), args.device)
      .enable_pdl(true)(kernel, out, in, num);
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_ADD_CONSTANT_CUH_
