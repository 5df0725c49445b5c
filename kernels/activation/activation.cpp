/*!
 * \file kernels/activation/activation.cpp
 * \brief CPU gated activations (float32/float16/bfloat16), Highway dynamic dispatch:
 *        out = act(x[:, :d]) * x[:, d:] with act in {silu, gelu (erf), gelu (tanh)}.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::{silu_and_mul, gelu_and_mul, gelu_tanh_and_mul} (contract: activation.hpp).
 * Math in float32; each output rounded once to the dtype.
 */
#include "activation.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "activation-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "activation-inl.h"

#if HWY_ONCE
namespace mllm_kernel::cpu {

namespace activation_detail {

inline void Run(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView x,
                activation::Act act) {
  using host::data_ptr;
  const auto a = mllm_kernel::activation::VerifyActAndMul<kDLCPU>(op, out, x);
  if (a.empty()) return;
  host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
    HWY_EXPORT_T(Table, activation_detail::ActAndMul<T>);
    HWY_DYNAMIC_DISPATCH_T(Table)(data_ptr<T>(out), data_ptr<const T>(x), a.rows, a.d,
                                  a.out_stride, a.x_stride, act);
  });
}

}  // namespace activation_detail

/*! \brief out = silu(x[:, :d]) * x[:, d:]; out [rows, d], x [rows, 2d]. */
inline void silu_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  activation_detail::Run("silu_and_mul", out, x, activation::kSilu);
}

/*! \brief out = gelu(x[:, :d]) * x[:, d:] with the exact (erf) gelu. */
inline void gelu_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  activation_detail::Run("gelu_and_mul", out, x, activation::kGelu);
}

/*! \brief out = gelu(x[:, :d]) * x[:, d:] with the tanh approximation of gelu. */
inline void gelu_tanh_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  activation_detail::Run("gelu_and_mul", out, x, activation::kGeluTanh);
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
