/*!
 * \file mllm_kernel/dispatch.hpp
 * \brief One dtype dispatcher for CPU and CUDA kernels, and the device-to-element-type map.
 *
 * An op's argument contract (kernels/<op>/<op>.hpp) matches dtypes by their tags (float,
 * float16_tag, bfloat16_tag), which both devices name the same way. The entry point of each
 * device then turns the bound dtype into that device's element type:
 *
 * \code{.cpp}
 *   const auto a = VerifyRmsNorm<kDLCPU>(out, x, weight);
 *   DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() { RmsNorm<T>(data_ptr<T>(out), ...); });
 * \endcode
 *
 * CPU element types are Highway's (hwy::float16_t, hwy::bfloat16_t); CUDA's are cuda_fp16.h's
 * and cuda_bf16.h's. A translation unit sees the map of the device it compiles for.
 */
#ifndef MLLM_KERNEL_DISPATCH_HPP_
#define MLLM_KERNEL_DISPATCH_HPP_

#include <dlpack/dlpack.h>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>

#include <cstdint>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#else
#include <hwy/base.h>
#endif

namespace mllm_kernel::host {

/*! \brief The element types a device's kernels use for the 16-bit float dtypes. */
template <DLDeviceType kDev>
struct FloatTypes;

#ifdef __CUDACC__
template <>
struct FloatTypes<kDLCUDA> {
  using f16 = __half;
  using bf16 = __nv_bfloat16;
};
#else
template <>
struct FloatTypes<kDLCPU> {
  using f16 = hwy::float16_t;
  using bf16 = hwy::bfloat16_t;
};
#endif

/*!
 * \brief Call `fn.template operator()<T>()` with T the element type of \p dtype on \p kDev
 * (float, or the device's 16-bit float type). Other dtypes raise TypeError; contracts reject
 * them first, so this is a last line of defence.
 */
template <DLDeviceType kDev, typename Fn>
decltype(auto) DispatchFloat(DLDataType dtype, Fn&& fn) {
  using Types = FloatTypes<kDev>;
  if (dtype == kDType<float>) return fn.template operator()<float>();
  if (dtype == kDType<float16_tag>) return fn.template operator()<typename Types::f16>();
  if (dtype == kDType<bfloat16_tag>) return fn.template operator()<typename Types::bf16>();
  Throw<ErrorKind::kTypeError>("expected dtype float32, float16 or bfloat16, got ", DTypeName(dtype));
}

/*! \brief The same for integer index dtypes (int32, int64). */
template <typename Fn>
decltype(auto) DispatchIndex(DLDataType dtype, Fn&& fn) {
  if (dtype == kDType<int32_t>) return fn.template operator()<int32_t>();
  if (dtype == kDType<int64_t>) return fn.template operator()<int64_t>();
  Throw<ErrorKind::kTypeError>("expected dtype int32 or int64, got ", DTypeName(dtype));
}

}  // namespace mllm_kernel::host

#endif  // MLLM_KERNEL_DISPATCH_HPP_
