/*!
 * \file kernels/rms_norm/rms_norm.hpp
 * \brief The argument contract of rms_norm and fused_add_rms_norm, shared by the CPU
 * (rms_norm.cpp) and CUDA (rms_norm.cuh) entry points.
 *
 * Tensors are 2-D [rows, hidden] with unit stride along hidden and any row stride; weight is
 * [hidden], contiguous; all share one dtype (float32/float16/bfloat16) and one device.
 */
#ifndef MLLM_KERNEL_KERNELS_RMS_NORM_HPP_
#define MLLM_KERNEL_KERNELS_RMS_NORM_HPP_

#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace mllm_kernel::rms_norm {

/*! \brief Sizes of a verified call: rows of `hidden` elements; a/b: row strides of the first
 * and second row tensor (out and x, or x and residual). */
struct RowsArgs {
  int64_t rows, hidden, a_stride, b_stride;
  DLDataType dtype;
  DLDevice device;
  bool empty() const { return rows == 0 || hidden == 0; }
};

/*! \brief Two [rows, hidden] tensors and weight [hidden]; `written` names the tensors the op
 * writes, whose rows must not overlap (e.g. an expanded, stride-0 view). */
template <DLDeviceType kDev>
RowsArgs VerifyRows(const char* op, tvm::ffi::TensorView a, const char* a_name,
                    tvm::ffi::TensorView b, const char* b_name, tvm::ffi::TensorView weight,
                    bool b_written) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize rows{"num_tokens"}, hidden{"hidden"}, a_stride{"row_stride"}, b_stride{"row_stride"};
  SymbolicDType dtype{"dtype"};
  SymbolicDevice device{"device"};
  TensorMatcher({rows, hidden})
      .for_op(op)
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDev>(device)
      .with_strides({a_stride, 1})
      .verify(a, a_name);
  TensorMatcher({rows, hidden})
      .for_op(op)
      .with_dtype(dtype)
      .with_device(device)
      .with_strides({b_stride, 1})
      .verify(b, b_name);
  TensorMatcher({hidden}).for_op(op).with_dtype(dtype).with_device(device).verify(weight, "weight");
  const RowsArgs args{rows.unwrap(), hidden.unwrap(), a_stride.unwrap(), b_stride.unwrap(),
                      dtype.unwrap(), device.unwrap()};
  const bool one_row = args.rows <= 1;
  ValueCheck(one_row || args.a_stride >= args.hidden, op, ": argument '", a_name, "': row stride ",
             args.a_stride, " is smaller than hidden=", args.hidden, ": rows written would overlap");
  ValueCheck(one_row || !b_written || args.b_stride >= args.hidden, op, ": argument '", b_name,
             "': row stride ", args.b_stride, " is smaller than hidden=", args.hidden,
             ": rows written would overlap");
  return args;
}

/*! \brief rms_norm(out, x, weight): out is written. */
template <DLDeviceType kDev>
RowsArgs VerifyRmsNorm(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView weight) {
  return VerifyRows<kDev>("rms_norm", out, "out", x, "x", weight, /*b_written=*/false);
}

/*! \brief fused_add_rms_norm(x, residual, weight): both x and residual are written. */
template <DLDeviceType kDev>
RowsArgs VerifyFusedAddRmsNorm(tvm::ffi::TensorView x, tvm::ffi::TensorView residual,
                               tvm::ffi::TensorView weight) {
  return VerifyRows<kDev>("fused_add_rms_norm", x, "x", residual, "residual", weight, /*b_written=*/true);
}

}  // namespace mllm_kernel::rms_norm

#endif  // MLLM_KERNEL_KERNELS_RMS_NORM_HPP_
