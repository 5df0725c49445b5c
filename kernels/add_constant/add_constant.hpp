/*!
 * \file kernels/add_constant/add_constant.hpp
 * \brief The argument contract of add_constant, shared by the CPU (add_constant.cpp) and CUDA
 * (add_constant.cuh) entry points: dst and src are 1-D, contiguous, of the device's element type
 * (Elem<kDev>), on one device, of one length.
 */
#ifndef MLLM_KERNEL_KERNELS_ADD_CONSTANT_HPP_
#define MLLM_KERNEL_KERNELS_ADD_CONSTANT_HPP_

#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <type_traits>

namespace mllm_kernel::add_constant {

/*! \brief The element type each device adds to: float32 on the CPU, int32 on CUDA. */
template <DLDeviceType kDev>
using Elem = std::conditional_t<kDev == kDLCPU, float, int32_t>;

/*! \brief A verified call: n elements of dst and of src. */
struct AddConstantArgs {
  int64_t n;
  DLDevice device;
};

template <DLDeviceType kDev>
AddConstantArgs VerifyAddConstant(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize n{"num_elements"};
  SymbolicDevice device{"device"};
  TensorMatcher({n})
      .for_op("add_constant")
      .with_dtype<Elem<kDev>>()
      .template with_device<kDev>(device)
      .verify(dst, "dst")
      .verify(src, "src");
  return {n.unwrap(), device.unwrap()};
}

}  // namespace mllm_kernel::add_constant

#endif  // MLLM_KERNEL_KERNELS_ADD_CONSTANT_HPP_
