/*!
 * \file kernels/activation/activation-inl.h
 * \brief Highway per-target body of the CPU gated activations (silu/gelu/gelu-tanh and mul),
 * re-included once per SIMD target by <hwy/foreach_target.h> (HWY_TARGET_INCLUDE in
 * activation.cpp): a toggling guard, not #pragma once.
 */
#include <cstddef>
#include <cstdint>

#include "activation.hpp"  // Act

#if defined(MLLM_KERNEL_ACTIVATION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MLLM_KERNEL_ACTIVATION_INL_H_
#undef MLLM_KERNEL_ACTIVATION_INL_H_
#else
#define MLLM_KERNEL_ACTIVATION_INL_H_
#endif
// Per-target headers (each has its toggle guard too): included once per target.
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>
#include <mllm_kernel/cpu/simd_io-inl.h>

HWY_BEFORE_NAMESPACE();
namespace mllm_kernel::cpu::HWY_NAMESPACE {
namespace activation_detail {
namespace hn = hwy::HWY_NAMESPACE;
using namespace mllm_kernel::activation;  // NOLINT(*): Act, kSilu, kGelu, kGeluTanh

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// x * sigmoid(x). exp(-x) is clamped to exp(88) (Exp is only valid up to ~88.7): for
// x < -88 the result is ~x * 6e-39, i.e. 0 for every practical purpose.
HWY_INLINE VF Silu(DF df, VF x) {
  const VF e = hn::Exp(df, hn::Min(hn::Neg(x), hn::Set(df, 88.0f)));
  return hn::Div(x, hn::Add(hn::Set(df, 1.0f), e));
}

// x * Phi(x) with Phi(x) = erfc(-x / sqrt(2)) / 2. Highway has no erf: erfc(z), z >= 0, uses the
// Chebyshev fit of Numerical Recipes (erfcc, relative error < 1.2e-7 for all z), which keeps
// the relative accuracy in the x < 0 tail where 1 + erf(x) would cancel.
HWY_INLINE VF Gelu(DF df, VF x_in) {
  // |x| capped at 15, where Phi(-|x|) already underflows to 0: x^2 stays finite (x^2 = inf made
  // exp(-inf) * inf = NaN for |x| > 1.8e19). The result multiplies the uncapped x.
  const VF x = hn::Clamp(x_in, hn::Set(df, -15.0f), hn::Set(df, 15.0f));
  const VF z = hn::Mul(hn::Abs(x), hn::Set(df, 0.70710678118654752f));
  const VF t = hn::Div(hn::Set(df, 1.0f), hn::MulAdd(z, hn::Set(df, 0.5f), hn::Set(df, 1.0f)));
  VF p = hn::Set(df, 0.17087277f);
  p = hn::MulAdd(p, t, hn::Set(df, -0.82215223f));
  p = hn::MulAdd(p, t, hn::Set(df, 1.48851587f));
  p = hn::MulAdd(p, t, hn::Set(df, -1.13520398f));
  p = hn::MulAdd(p, t, hn::Set(df, 0.27886807f));
  p = hn::MulAdd(p, t, hn::Set(df, -0.18628806f));
  p = hn::MulAdd(p, t, hn::Set(df, 0.09678418f));
  p = hn::MulAdd(p, t, hn::Set(df, 0.37409196f));
  p = hn::MulAdd(p, t, hn::Set(df, 1.00002368f));
  p = hn::MulAdd(p, t, hn::Set(df, -1.26551223f));
  // exp(-z^2 + p) with z^2 = x^2 / 2 = (hi + lo) / 2 split exactly by an FMA: a single Exp of
  // the rounded sum would lose ~|x|^2 * 2^-25 relative accuracy in the tail (1e-5 at x = -12).
  const VF hi = hn::Mul(x, x);
  const VF lo = hn::MulSub(x, x, hi);
  const VF neg_half = hn::Set(df, -0.5f);
  const VF e = hn::Mul(hn::Mul(hn::Exp(df, hn::Mul(hi, neg_half)), hn::Exp(df, p)),
                       hn::MulAdd(lo, neg_half, hn::Set(df, 1.0f)));
  const VF half_erfc = hn::Mul(hn::Mul(t, e), hn::Set(df, 0.5f));
  // Phi(x) = erfc(|x|/sqrt2)/2 for x < 0, 1 - erfc(|x|/sqrt2)/2 otherwise.
  const VF phi = hn::IfThenElse(hn::Lt(x, hn::Zero(df)), half_erfc,
                                hn::Sub(hn::Set(df, 1.0f), half_erfc));
  return hn::Mul(x_in, phi);
}

// 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).
HWY_INLINE VF GeluTanh(DF df, VF x) {
  const VF x2 = hn::Mul(x, x);
  const VF inner = hn::Mul(hn::Mul(x, hn::Set(df, 0.7978845608028654f)),
                           hn::MulAdd(x2, hn::Set(df, 0.044715f), hn::Set(df, 1.0f)));
  const VF half_x = hn::Mul(x, hn::Set(df, 0.5f));
  return hn::MulAdd(half_x, hn::Tanh(df, inner), half_x);
}

template <int kAct>
HWY_INLINE VF Activate(DF df, VF x) {
  if constexpr (kAct == kSilu) {
    return Silu(df, x);
  } else if constexpr (kAct == kGelu) {
    return Gelu(df, x);
  } else {
    return GeluTanh(df, x);
  }
}

// out[r, j] = act(x[r, j]) * x[r, d + j] for j < d.
template <int kAct, typename T>
HWY_INLINE void ActAndMulRows(T* HWY_RESTRICT out, const T* HWY_RESTRICT x, int64_t rows,
                              int64_t d, int64_t out_stride, int64_t x_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto n = static_cast<size_t>(d);
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = x + r * x_stride;
    const T* up = gate + n;
    T* o = out + r * out_stride;
    size_t j = 0;
    for (; j + lanes <= n; j += lanes) {
      const VF v = hn::Mul(Activate<kAct>(df, LoadF32(df, gate + j)), LoadF32(df, up + j));
      StoreF32(df, v, o + j);
    }
    if (j < n) {
      const size_t rest = n - j;
      const VF v = hn::Mul(Activate<kAct>(df, LoadF32N(df, gate + j, rest)),
                           LoadF32N(df, up + j, rest));
      StoreF32N(df, v, o + j, rest);
    }
  }
}

// The exported entry (HWY_EXPORT_T in activation.cpp): one dispatch table per T.
template <typename T>
void ActAndMul(T* out, const T* x, int64_t rows, int64_t d, int64_t out_stride, int64_t x_stride,
               int act) {
  switch (act) {
    case kSilu: return ActAndMulRows<kSilu>(out, x, rows, d, out_stride, x_stride);
    case kGelu: return ActAndMulRows<kGelu>(out, x, rows, d, out_stride, x_stride);
    default: return ActAndMulRows<kGeluTanh>(out, x, rows, d, out_stride, x_stride);
  }
}

}  // namespace activation_detail
}  // namespace mllm_kernel::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MLLM_KERNEL_ACTIVATION_INL_H_
