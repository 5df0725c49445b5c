/*!
 * \file kernels/rms_norm/rms_norm.cpp
 * \brief CPU rms_norm and fused_add_rms_norm (float32/float16/bfloat16), Highway dynamic dispatch.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::rms_norm and mllm_kernel::cpu::fused_add_rms_norm.
 * Tensors are 2-D [rows, hidden] with unit stride along hidden and any row stride.
 * Math in float32; each output is rounded once to the tensor dtype.
 */
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstddef>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "rms_norm_simd.hpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "rms_norm_simd.hpp"

#if HWY_ONCE
namespace mllm_kernel::cpu {

HWY_EXPORT(RmsNormF32);
HWY_EXPORT(RmsNormF16);
HWY_EXPORT(RmsNormBF16);
HWY_EXPORT(FusedAddRmsNormF32);
HWY_EXPORT(FusedAddRmsNormF16);
HWY_EXPORT(FusedAddRmsNormBF16);

/*!
 * \brief out = x / sqrt(mean(x^2) + eps) * weight, per row.
 * \param out [rows, hidden], unit stride along hidden.
 * \param x [rows, hidden], unit stride along hidden.
 * \param weight [hidden], contiguous; all three share one dtype.
 */
inline void rms_norm(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView weight,
                     double eps) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize rows{"num_tokens"}, hidden{"hidden"}, out_stride{"out_row_stride"},
      x_stride{"x_row_stride"};
  SymbolicDType dtype{"dtype"};
  TensorMatcher({rows, hidden})
      .for_op("rms_norm")
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDLCPU>()
      .with_strides({x_stride, 1})
      .verify(x, "x");
  TensorMatcher({rows, hidden})
      .for_op("rms_norm")
      .with_dtype(dtype)
      .with_device<kDLCPU>()
      .with_strides({out_stride, 1})
      .verify(out, "out");
  TensorMatcher({hidden}).for_op("rms_norm").with_dtype(dtype).with_device<kDLCPU>().verify(
      weight, "weight");
  const int64_t n = rows.unwrap(), d = hidden.unwrap();
  if (n == 0 || d == 0) return;
  const auto e = static_cast<float>(eps);
  const int64_t os = out_stride.unwrap(), xs = x_stride.unwrap();
  // Rows written must not overlap (e.g. an expanded, stride-0 output).
  ValueCheck(n == 1 || os >= d, "rms_norm: argument 'out': row stride ", os,
             " is smaller than hidden=", d, ": output rows would overlap");
  if (dtype.is<float>()) {
    HWY_DYNAMIC_DISPATCH(RmsNormF32)
    (data_ptr<float>(out), data_ptr<const float>(x), data_ptr<const float>(weight), n, d, os, xs, e);
  } else if (dtype.is<float16_tag>()) {
    using T = hwy::float16_t;
    HWY_DYNAMIC_DISPATCH(RmsNormF16)
    (data_ptr<T>(out), data_ptr<const T>(x), data_ptr<const T>(weight), n, d, os, xs, e);
  } else {
    using T = hwy::bfloat16_t;
    HWY_DYNAMIC_DISPATCH(RmsNormBF16)
    (data_ptr<T>(out), data_ptr<const T>(x), data_ptr<const T>(weight), n, d, os, xs, e);
  }
}

/*!
 * \brief In place: residual = round(x + residual); x = rms_norm(residual) * weight.
 * The new residual is rounded to the dtype before its norm is computed (as if re-read).
 * \param x [rows, hidden], unit stride along hidden (overwritten with the normalized output).
 * \param residual [rows, hidden], unit stride along hidden (overwritten with the sum).
 * \param weight [hidden], contiguous.
 */
inline void fused_add_rms_norm(tvm::ffi::TensorView x, tvm::ffi::TensorView residual,
                               tvm::ffi::TensorView weight, double eps) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize rows{"num_tokens"}, hidden{"hidden"}, x_stride{"x_row_stride"},
      r_stride{"residual_row_stride"};
  SymbolicDType dtype{"dtype"};
  TensorMatcher({rows, hidden})
      .for_op("fused_add_rms_norm")
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDLCPU>()
      .with_strides({x_stride, 1})
      .verify(x, "x");
  TensorMatcher({rows, hidden})
      .for_op("fused_add_rms_norm")
      .with_dtype(dtype)
      .with_device<kDLCPU>()
      .with_strides({r_stride, 1})
      .verify(residual, "residual");
  TensorMatcher({hidden})
      .for_op("fused_add_rms_norm")
      .with_dtype(dtype)
      .with_device<kDLCPU>()
      .verify(weight, "weight");
  const int64_t n = rows.unwrap(), d = hidden.unwrap();
  if (n == 0 || d == 0) return;
  const auto e = static_cast<float>(eps);
  const int64_t xs = x_stride.unwrap(), rs = r_stride.unwrap();
  // Both tensors are written: their rows must not overlap (e.g. an expanded, stride-0 view).
  ValueCheck(n == 1 || (xs >= d && rs >= d), "fused_add_rms_norm: row strides (x ", xs,
             ", residual ", rs, ") must be >= hidden=", d, ": rows written would overlap");
  if (dtype.is<float>()) {
    HWY_DYNAMIC_DISPATCH(FusedAddRmsNormF32)
    (data_ptr<float>(x), data_ptr<float>(residual), data_ptr<const float>(weight), n, d, xs, rs, e);
  } else if (dtype.is<float16_tag>()) {
    using T = hwy::float16_t;
    HWY_DYNAMIC_DISPATCH(FusedAddRmsNormF16)
    (data_ptr<T>(x), data_ptr<T>(residual), data_ptr<const T>(weight), n, d, xs, rs, e);
  } else {
    using T = hwy::bfloat16_t;
    HWY_DYNAMIC_DISPATCH(FusedAddRmsNormBF16)
    (data_ptr<T>(x), data_ptr<T>(residual), data_ptr<const T>(weight), n, d, xs, rs, e);
  }
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
