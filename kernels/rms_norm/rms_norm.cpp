/*!
 * \file kernels/rms_norm/rms_norm.cpp
 * \brief CPU rms_norm and fused_add_rms_norm (float32/float16/bfloat16), Highway dynamic dispatch.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::rms_norm and mllm_kernel::cpu::fused_add_rms_norm. Math in float32; each
 * output is rounded once to the tensor dtype.
 */
#include "rms_norm.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "rms_norm-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "rms_norm-inl.h"

#if HWY_ONCE
namespace mllm_kernel::cpu {

/*! \brief out = x / sqrt(mean(x^2) + eps) * weight, per row (contract: rms_norm.hpp). */
inline void rms_norm(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView weight,
                     double eps) {
  using host::data_ptr;
  const auto a = mllm_kernel::rms_norm::VerifyRmsNorm<kDLCPU>(out, x, weight, eps);
  if (a.empty()) return;
  host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
    HWY_EXPORT_T(Table, RmsNorm<T>);
    HWY_DYNAMIC_DISPATCH_T(Table)(data_ptr<T>(out), data_ptr<const T>(x), data_ptr<const T>(weight),
                                  a.rows, a.hidden, a.a_stride, a.b_stride, a.eps);
  });
}

/*! \brief In place: residual = round(x + residual); x = rms_norm(residual) * weight. */
inline void fused_add_rms_norm(tvm::ffi::TensorView x, tvm::ffi::TensorView residual,
                               tvm::ffi::TensorView weight, double eps) {
  using host::data_ptr;
  const auto a = mllm_kernel::rms_norm::VerifyFusedAddRmsNorm<kDLCPU>(x, residual, weight, eps);
  if (a.empty()) return;
  host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
    HWY_EXPORT_T(Table, FusedAddRmsNorm<T>);
    HWY_DYNAMIC_DISPATCH_T(Table)(data_ptr<T>(x), data_ptr<T>(residual), data_ptr<const T>(weight),
                                  a.rows, a.hidden, a.a_stride, a.b_stride, a.eps);
  });
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
