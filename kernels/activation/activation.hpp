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
#include <mllm_kernel/rows.hpp>
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
  SymbolicSize rows{"num_tokens"}, d{"d"}, two_d{"2*d"};
  SymbolicDType dtype{"dtype"};
  SymbolicDevice device{"device"};
  const int64_t x_stride = VerifyFloatRows<kDev>(op, x, "x", rows, two_d, dtype, device);
  ValueCheck(two_d.unwrap() % 2 == 0, op, ": argument 'x': the last dim must be even (2*d), got ",
             two_d.unwrap());
  d.set_value(two_d.unwrap() / 2);
  const int64_t out_stride = VerifyFloatRows<kDev>(op, out, "out", rows, d, dtype, device);
  CheckNoAliasing(op, {{out, "out"}}, {{x, "x"}});
  return {dtype.unwrap(), device.unwrap(), rows.unwrap(), d.unwrap(), out_stride, x_stride};
}

}  // namespace mllm_kernel::activation

#endif  // MLLM_KERNEL_KERNELS_ACTIVATION_HPP_
