/*!
 * \file kernels/activation/activation.hpp
 * \brief The argument contract of the gated activations (silu_and_mul, gelu_and_mul,
 * gelu_tanh_and_mul), shared by the CPU (activation.cpp) and CUDA (activation.cuh) entry points.
 *
 * out [rows, d] and x [rows, 2d], unit stride along the last dim and any row stride; one dtype
 * (float32/float16/bfloat16) and one device. out = act(x[:, :d]) * x[:, d:].
 */
#ifndef MLLM_KERNEL_KERNELS_ACTIVATION_HPP_
#define MLLM_KERNEL_KERNELS_ACTIVATION_HPP_

#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace mllm_kernel::activation {

/*! \brief The activation of the gate half; the kernels of both devices are specialized on it. */
enum Act : int { kSilu = 0, kGelu = 1, kGeluTanh = 2 };

/*! \brief Sizes of a verified call: rows of d outputs (x rows hold 2d inputs). */
struct ActArgs {
  DLDataType dtype;
  DLDevice device;
  int64_t rows, d, out_stride, x_stride;
  bool empty() const { return rows == 0 || d == 0; }
};

/*! \brief out [rows, d] and x [rows, 2d]; out (written) has no internal overlap and shares no
 * memory with x. x is verified first, so a bad x is named as x, not as the out allocated from
 * it. `op` names the public op. */
template <DLDeviceType kDev>
ActArgs VerifyActAndMul(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize rows{"num_tokens"}, d{"d"}, two_d{"2*d"}, out_stride{"out_row_stride"},
      x_stride{"x_row_stride"};
  SymbolicDType dtype{"dtype"};
  SymbolicDevice device{"device"};
  TensorMatcher({rows, two_d})
      .for_op(op)
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDev>(device)
      .with_strides({x_stride, 1})
      .verify(x, "x");
  ValueCheck(two_d.unwrap() % 2 == 0, op, ": argument 'x': the last dim must be even (2*d), got ",
             two_d.unwrap());
  d.set_value(two_d.unwrap() / 2);
  TensorMatcher({rows, d})
      .for_op(op)
      .with_dtype(dtype)
      .with_device(device)
      .with_strides({out_stride, 1})
      .verify(out, "out");
  CheckNoAliasing(op, {{out, "out"}}, {{x, "x"}});
  return {dtype.unwrap(), device.unwrap(), rows.unwrap(), d.unwrap(), out_stride.unwrap(),
          x_stride.unwrap()};
}

}  // namespace mllm_kernel::activation

#endif  // MLLM_KERNEL_KERNELS_ACTIVATION_HPP_
