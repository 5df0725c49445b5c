/*!
 * \file kernels/activation/activation.cpp
 * \brief CPU gated activations (float32/float16/bfloat16), Highway dynamic dispatch:
 *        out = act(x[:, :d]) * x[:, d:] with act in {silu, gelu (erf), gelu (tanh)}.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::{silu_and_mul, gelu_and_mul, gelu_tanh_and_mul}.
 * Tensors: x [rows, 2d], out [rows, d], unit stride along the last dim, any row stride.
 * Math in float32; each output rounded once to the dtype.
 */
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstddef>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "activation_simd.hpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "activation_simd.hpp"

#if HWY_ONCE
namespace mllm_kernel::cpu {

HWY_EXPORT(ActAndMulF32);
HWY_EXPORT(ActAndMulF16);
HWY_EXPORT(ActAndMulBF16);

namespace activation_detail {

// Must match activation_detail::Act in activation_simd.hpp.
inline constexpr int kSilu = 0, kGelu = 1, kGeluTanh = 2;

inline void ActAndMul(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView x, int act) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize rows{"num_tokens"}, d{"d"}, out_stride{"out_row_stride"}, x_stride{"x_row_stride"};
  SymbolicDType dtype{"dtype"};
  TensorMatcher({rows, d})
      .for_op(op)
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDLCPU>()
      .with_strides({out_stride, 1})
      .verify(out, "out");
  SymbolicSize two_d{"2*d"};
  two_d.set_value(2 * d.unwrap());
  TensorMatcher({rows, two_d})
      .for_op(op)
      .with_dtype(dtype)
      .with_device<kDLCPU>()
      .with_strides({x_stride, 1})
      .verify(x, "x");
  const int64_t n = rows.unwrap(), half = d.unwrap();
  if (n == 0 || half == 0) return;
  const int64_t os = out_stride.unwrap(), xs = x_stride.unwrap();
  ValueCheck(n == 1 || os >= half, op, ": argument 'out': row stride ", os,
             " is smaller than d=", half, ": output rows would overlap");
  if (dtype.is<float>()) {
    HWY_DYNAMIC_DISPATCH(ActAndMulF32)(data_ptr<float>(out), data_ptr<const float>(x), n, half, os, xs, act);
  } else if (dtype.is<float16_tag>()) {
    using T = hwy::float16_t;
    HWY_DYNAMIC_DISPATCH(ActAndMulF16)(data_ptr<T>(out), data_ptr<const T>(x), n, half, os, xs, act);
  } else {
    using T = hwy::bfloat16_t;
    HWY_DYNAMIC_DISPATCH(ActAndMulBF16)(data_ptr<T>(out), data_ptr<const T>(x), n, half, os, xs, act);
  }
}

}  // namespace activation_detail

/*! \brief out = silu(x[:, :d]) * x[:, d:]; out [rows, d], x [rows, 2d]. */
inline void silu_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  activation_detail::ActAndMul("silu_and_mul", out, x, activation_detail::kSilu);
}

/*! \brief out = gelu(x[:, :d]) * x[:, d:] with the exact (erf) gelu. */
inline void gelu_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  activation_detail::ActAndMul("gelu_and_mul", out, x, activation_detail::kGelu);
}

/*! \brief out = gelu(x[:, :d]) * x[:, d:] with the tanh approximation of gelu. */
inline void gelu_tanh_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  activation_detail::ActAndMul("gelu_and_mul", out, x, activation_detail::kGeluTanh);
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
