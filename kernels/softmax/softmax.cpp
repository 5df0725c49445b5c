/*!
 * \file kernels/softmax/softmax.cpp
 * \brief CPU softmax / log_softmax over the last dim (float32, float16, bfloat16), vectorized
 *        with Highway dynamic dispatch; float32 accumulation.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::softmax and mllm_kernel::cpu::log_softmax.
 */
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cmath>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "softmax_simd.hpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "softmax_simd.hpp"

#if HWY_ONCE
namespace mllm_kernel::cpu {

HWY_EXPORT(SoftmaxRowsF32);
HWY_EXPORT(SoftmaxRowsF16);
HWY_EXPORT(SoftmaxRowsBF16);

namespace softmax_detail {

// out: contiguous [rows, vocab]; x: [rows, vocab] with unit last stride and any row stride.
inline void Run(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView x,
                float inv_temp, bool log) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize rows{"rows"}, vocab{"vocab"}, x_stride{"x_row_stride"};
  SymbolicDType dtype{"dtype"};
  TensorMatcher({rows, vocab})
      .for_op(op)
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDLCPU>()
      .verify(out, "out");
  TensorMatcher({rows, vocab})
      .for_op(op)
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDLCPU>()
      .with_strides({x_stride, 1})
      .verify(x, "x");
  const int64_t n_rows = rows.unwrap(), n = vocab.unwrap(), stride = x_stride.unwrap();
  if (n_rows == 0 || n == 0) return;
  if (dtype.is<float>()) {
    HWY_DYNAMIC_DISPATCH(SoftmaxRowsF32)
    (data_ptr<float>(out), data_ptr<const float>(x), n_rows, n, stride, inv_temp, log);
  } else if (dtype.is<float16_tag>()) {
    HWY_DYNAMIC_DISPATCH(SoftmaxRowsF16)
    (data_ptr<hwy::float16_t>(out), data_ptr<const hwy::float16_t>(x), n_rows, n, stride,
     inv_temp, log);
  } else {
    HWY_DYNAMIC_DISPATCH(SoftmaxRowsBF16)
    (data_ptr<hwy::bfloat16_t>(out), data_ptr<const hwy::bfloat16_t>(x), n_rows, n, stride,
     inv_temp, log);
  }
}

}  // namespace softmax_detail

/*! \brief out = softmax(x / temperature) over the last dim; temperature > 0. */
inline void softmax(tvm::ffi::TensorView out, tvm::ffi::TensorView x, double temperature) {
  host::ValueCheck(temperature > 0.0 && std::isfinite(temperature),
                   "softmax: temperature must be a positive finite number, got ", temperature);
  softmax_detail::Run("softmax", out, x, static_cast<float>(1.0 / temperature), false);
}

/*! \brief out = log_softmax(x) over the last dim. */
inline void log_softmax(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  softmax_detail::Run("log_softmax", out, x, 1.0f, true);
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
