/*!
 * \file kernels/softmax/softmax.hpp
 * \brief The argument contract of softmax and log_softmax, shared by the CPU (softmax.cpp) and
 * CUDA (softmax.cuh) entry points.
 *
 * out: contiguous [rows, vocab]; x: [rows, vocab] with unit last stride and any row stride; one
 * dtype (float32/float16/bfloat16) and one device; out shares no memory with x.
 */
#ifndef MLLM_KERNEL_KERNELS_SOFTMAX_HPP_
#define MLLM_KERNEL_KERNELS_SOFTMAX_HPP_

#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/rows.hpp>
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
  SymbolicSize rows{"rows"}, vocab{"vocab"};
  SymbolicDType dtype{"dtype"};
  SymbolicDevice device{"device"};
  // x first: a bad x is named as x, not as the out that the Python op allocated from it.
  const int64_t x_stride = VerifyFloatRows<kDev>(op, x, "x", rows, vocab, dtype, device);
  TensorMatcher({rows, vocab}).for_op(op).with_dtype(dtype).with_device(device).verify(out, "out");
  CheckNoAliasing(op, {{out, "out"}}, {{x, "x"}});
  return {dtype.unwrap(), device.unwrap(), rows.unwrap(), vocab.unwrap(), x_stride};
}

/*!
 * \brief The largest 1 / temperature the kernels use, 2^125.
 *
 * Both devices compute the exponent of x as z = (x/2 - max/2) * (2 / temperature): halving is
 * exact (for normal floats) and keeps the difference finite even for logits spanning more than
 * FLT_MAX, the subtraction comes first, so z is exactly 0 at the row max and <= 0 elsewhere, and
 * 2 * 2^125 * log2(e) is still finite in float32. So any positive temperature gives a finite
 * result: tiny ones the one-hot of the max (ties split evenly), huge ones the uniform row.
 */
inline constexpr float kMaxInvTemperature = 0x1p125f;

/*! \brief 1 / temperature for softmax, saturated at kMaxInvTemperature (temperatures below 2^-125
 * ~ 2.4e-38 act as 2^-125: only logits within ~1e-36 of the row max then keep a share of the
 * max's weight); temperature must be positive and finite. */
inline float InvTemperature(double temperature) {
  host::ValueCheck(temperature > 0.0 && std::isfinite(temperature),
                   "softmax: temperature must be a positive finite number, got ", temperature);
  const double inv = 1.0 / temperature;  // inf for denormal temperatures
  return inv < static_cast<double>(kMaxInvTemperature) ? static_cast<float>(inv) : kMaxInvTemperature;
}

}  // namespace mllm_kernel::softmax

#endif  // MLLM_KERNEL_KERNELS_SOFTMAX_HPP_
