/*!
 * \file kernels/softmax/softmax.cpp
 * \brief CPU softmax / log_softmax over the last dim (float32, float16, bfloat16), vectorized
 *        with Highway dynamic dispatch; float32 accumulation.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::softmax and mllm_kernel::cpu::log_softmax (contract: softmax.hpp).
 */
#include "softmax.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "softmax-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "softmax-inl.h"

#if HWY_ONCE
namespace mllm_kernel::cpu {

namespace softmax_detail {

inline void Run(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView x,
                float inv_temp, bool log) {
  using host::data_ptr;
  const auto a = mllm_kernel::softmax::VerifySoftmax<kDLCPU>(op, out, x);
  if (a.empty()) return;
  host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
    HWY_EXPORT_T(Table, softmax_detail::Rows<T>);
    HWY_DYNAMIC_DISPATCH_T(Table)(data_ptr<T>(out), data_ptr<const T>(x), a.rows, a.vocab,
                                  a.x_stride, inv_temp, log);
  });
}

}  // namespace softmax_detail

/*! \brief out = softmax(x / temperature) over the last dim; temperature > 0. */
inline void softmax(tvm::ffi::TensorView out, tvm::ffi::TensorView x, double temperature) {
  softmax_detail::Run("softmax", out, x, mllm_kernel::softmax::InvTemperature(temperature), false);
}

/*! \brief out = log_softmax(x) over the last dim. */
inline void log_softmax(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  softmax_detail::Run("log_softmax", out, x, 1.0f, true);
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
