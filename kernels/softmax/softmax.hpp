/*!
 * \file kernels/softmax/softmax.hpp
 * \brief The argument contract of softmax and log_softmax, shared by the CPU (softmax.cpp) and
 * CUDA (softmax.cuh) entry points.
 *
 * out: contiguous [rows, vocab]; x: [rows, vocab] with unit last stride and any row stride; one
 * dtype (float32/float16/bfloat16) and one device.
 */
#ifndef MLLM_KERNEL_KERNELS_SOFTMAX_HPP_
#define MLLM_KERNEL_KERNELS_SOFTMAX_HPP_

#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cmath>
#include <cstdint>

namespace mllm_kernel::softmax {

/*! \brief A verified call: `rows` rows of `vocab` logits, x's rows x_stride elements apart. */
struct SoftmaxArgs {
  DLDataType dtype;
  DLDevice device;
  int64_t rows, vocab, x_stride;
  bool empty() const { return rows == 0 || vocab == 0; }
};

/*! \brief out [rows, vocab] contiguous, x [rows, vocab] row-strided; `op` names the public op. */
template <DLDeviceType kDev>
SoftmaxArgs VerifySoftmax(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize rows{"rows"}, vocab{"vocab"}, x_stride{"x_row_stride"};
  SymbolicDType dtype{"dtype"};
  SymbolicDevice device{"device"};
  TensorMatcher({rows, vocab})
      .for_op(op)
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDev>(device)
      .verify(out, "out");
  TensorMatcher({rows, vocab})
      .for_op(op)
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDev>(device)
      .with_strides({x_stride, 1})
      .verify(x, "x");
  return {dtype.unwrap(), device.unwrap(), rows.unwrap(), vocab.unwrap(), x_stride.unwrap()};
}

/*! \brief 1 / temperature for softmax; temperature must be positive and finite. */
inline float InvTemperature(double temperature) {
  host::ValueCheck(temperature > 0.0 && std::isfinite(temperature),
                   "softmax: temperature must be a positive finite number, got ", temperature);
  return static_cast<float>(1.0 / temperature);
}

}  // namespace mllm_kernel::softmax

#endif  // MLLM_KERNEL_KERNELS_SOFTMAX_HPP_
