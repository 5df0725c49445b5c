/*!
 * \file kernels/rms_norm/rms_norm.hpp
 * \brief The argument contract of rms_norm and fused_add_rms_norm, shared by the CPU
 * (rms_norm.cpp) and CUDA (rms_norm.cuh) entry points.
 *
 * Tensors are 2-D [rows, hidden] with unit stride along hidden and any row stride; weight is
 * [hidden], contiguous; all share one dtype (float32/float16/bfloat16) and one device. The
 * tensors the op writes (out; x and residual) have no internal overlap and share no memory with
 * any other argument (mllm_kernel/overlap.hpp). eps is finite and >= 0; a row whose float32
 * mean(x^2) + eps is 0 (all zeros with eps = 0) normalizes to zeros (never 0 * inf = NaN).
 */
#ifndef MLLM_KERNEL_KERNELS_RMS_NORM_HPP_
#define MLLM_KERNEL_KERNELS_RMS_NORM_HPP_

#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/rows.hpp>
#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cmath>
#include <cstdint>

namespace mllm_kernel::rms_norm {

/*! \brief Sizes of a verified call: rows of `hidden` elements; a/b: row strides of the first
 * and second row tensor (out and x, or x and residual). */
struct RowsArgs {
  int64_t rows, hidden, a_stride, b_stride;
  DLDataType dtype;
  DLDevice device;
  float eps;
  bool empty() const { return rows == 0 || hidden == 0; }
};

/*! \brief Two [rows, hidden] tensors a and b and weight [hidden]. The input is verified first
 * (b for rms_norm, whose a is the output it allocates), so a bad x is named as x. a is written;
 * b too unless b_first (rms_norm's x is read only). */
template <DLDeviceType kDev>
RowsArgs VerifyRows(const char* op, tvm::ffi::TensorView a, const char* a_name,
                    tvm::ffi::TensorView b, const char* b_name, tvm::ffi::TensorView weight,
                    bool b_first, double eps) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize rows{"num_tokens"}, hidden{"hidden"};
  SymbolicDType dtype{"dtype"};
  SymbolicDevice device{"device"};
  int64_t a_stride = 0, b_stride = 0;
  if (b_first) b_stride = VerifyFloatRows<kDev>(op, b, b_name, rows, hidden, dtype, device);
  a_stride = VerifyFloatRows<kDev>(op, a, a_name, rows, hidden, dtype, device, /*written=*/true);
  if (!b_first) b_stride = VerifyFloatRows<kDev>(op, b, b_name, rows, hidden, dtype, device, /*written=*/true);
  TensorMatcher({hidden}).for_op(op).with_dtype(dtype).with_device(device).verify(weight, "weight");
  ValueCheck(std::isfinite(eps) && eps >= 0.0, op, ": eps must be finite and >= 0, got ", eps);
  return {rows.unwrap(), hidden.unwrap(), a_stride, b_stride, dtype.unwrap(), device.unwrap(),
          static_cast<float>(eps)};
}

/*! \brief rms_norm(out, x, weight, eps): out is written, x and weight are read. */
template <DLDeviceType kDev>
RowsArgs VerifyRmsNorm(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView weight,
                       double eps) {
  const RowsArgs args = VerifyRows<kDev>("rms_norm", out, "out", x, "x", weight, /*b_first=*/true, eps);
  host::CheckNoAliasing("rms_norm", {{out, "out"}}, {{x, "x"}, {weight, "weight"}});
  return args;
}

/*! \brief fused_add_rms_norm(x, residual, weight, eps): x and residual are written (in place,
 * row by row, so they must not share memory), weight is read. */
template <DLDeviceType kDev>
RowsArgs VerifyFusedAddRmsNorm(tvm::ffi::TensorView x, tvm::ffi::TensorView residual,
                               tvm::ffi::TensorView weight, double eps) {
  const RowsArgs args =
      VerifyRows<kDev>("fused_add_rms_norm", x, "x", residual, "residual", weight, /*b_first=*/false, eps);
  host::CheckNoAliasing("fused_add_rms_norm", {{x, "x"}, {residual, "residual"}}, {{weight, "weight"}});
  return args;
}

}  // namespace mllm_kernel::rms_norm

#endif  // MLLM_KERNEL_KERNELS_RMS_NORM_HPP_
