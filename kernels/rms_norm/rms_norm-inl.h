/*!
 * \file kernels/rms_norm/rms_norm-inl.h
 * \brief Highway per-target body of the CPU rms_norm / fused_add_rms_norm kernels.
 *
 * Re-included once per SIMD target by <hwy/foreach_target.h> (see HWY_TARGET_INCLUDE in
 * rms_norm.cpp), hence the toggling guard instead of #pragma once.
 */
#if defined(MLLM_KERNEL_RMS_NORM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MLLM_KERNEL_RMS_NORM_INL_H_
#undef MLLM_KERNEL_RMS_NORM_INL_H_
#else
#define MLLM_KERNEL_RMS_NORM_INL_H_
#endif

#include <hwy/highway.h>
#include <mllm_kernel/cpu/simd_io-inl.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace mllm_kernel::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace rms_norm_detail {

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Round a float32 vector to T and back: the value a store of T would keep.
template <typename T>
HWY_INLINE VF RoundTo(DF df, VF v) {
  if constexpr (hwy::IsSame<T, float>()) {
    return v;
  } else {
    return hn::PromoteTo(df, hn::DemoteTo(hn::Rebind<T, DF>(), v));
  }
}

// out[i] = x[i] * inv_rms * w[i], rounded once to T. out may alias x (fused op).
template <typename T>
HWY_INLINE void ScaleRow(DF df, T* out, const T* x, const T* HWY_RESTRICT w, size_t d,
                         float inv_rms) {
  const size_t lanes = hn::Lanes(df);
  const VF vs = hn::Set(df, inv_rms);
  size_t i = 0;
  for (; i + lanes <= d; i += lanes) {
    const VF v = hn::Mul(hn::Mul(LoadF32(df, x + i), vs), LoadF32(df, w + i));
    StoreF32(df, v, out + i);
  }
  if (i < d) {
    const size_t rest = d - i;
    const VF v = hn::Mul(hn::Mul(LoadF32N(df, x + i, rest), vs), LoadF32N(df, w + i, rest));
    StoreF32N(df, v, out + i, rest);
  }
}

// 1 / sqrt(mean + eps); 0 when mean + eps is 0 (an all-zero row with eps = 0: the row stays
// zeros instead of 0 * inf = NaN). A NaN mean stays NaN.
HWY_INLINE float InvRms(float sum_sq, size_t d, float eps) {
  const float ms = sum_sq / static_cast<float>(d) + eps;
  return ms == 0.0f ? 0.0f : 1.0f / std::sqrt(ms);
}

}  // namespace rms_norm_detail

// Rows of d elements; x/out rows start every x_stride/out_stride elements. d > 0.
template <typename T>
void RmsNorm(T* out, const T* x, const T* weight, int64_t rows, int64_t d, int64_t out_stride,
             int64_t x_stride, float eps) {
  namespace rd = rms_norm_detail;
  const rd::DF df;
  const size_t lanes = hn::Lanes(df);
  const auto n = static_cast<size_t>(d);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * x_stride;
    // Two accumulators hide the FMA latency; the row stays in L1/L2 for the second pass.
    rd::VF acc0 = hn::Zero(df), acc1 = hn::Zero(df);
    size_t i = 0;
    for (; i + 2 * lanes <= n; i += 2 * lanes) {
      const rd::VF v0 = LoadF32(df, xr + i);
      const rd::VF v1 = LoadF32(df, xr + i + lanes);
      acc0 = hn::MulAdd(v0, v0, acc0);
      acc1 = hn::MulAdd(v1, v1, acc1);
    }
    for (; i + lanes <= n; i += lanes) {
      const rd::VF v = LoadF32(df, xr + i);
      acc0 = hn::MulAdd(v, v, acc0);
    }
    if (i < n) {
      const rd::VF v = LoadF32N(df, xr + i, n - i);  // zero padding adds nothing
      acc1 = hn::MulAdd(v, v, acc1);
    }
    const float sum_sq = hn::ReduceSum(df, hn::Add(acc0, acc1));
    rd::ScaleRow(df, out + r * out_stride, xr, weight, n, rd::InvRms(sum_sq, n, eps));
  }
}

// residual = round_T(x + residual); x = rms_norm(residual) * weight. d > 0.
template <typename T>
void FusedAddRmsNorm(T* x, T* residual, const T* weight, int64_t rows, int64_t d,
                     int64_t x_stride, int64_t residual_stride, float eps) {
  namespace rd = rms_norm_detail;
  const rd::DF df;
  const size_t lanes = hn::Lanes(df);
  const auto n = static_cast<size_t>(d);
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * x_stride;
    T* rr = residual + r * residual_stride;
    rd::VF acc = hn::Zero(df);
    size_t i = 0;
    for (; i + lanes <= n; i += lanes) {
      // Norm of the residual as stored (rounded to T), so the output matches a re-read of it.
      const rd::VF s = rd::RoundTo<T>(df, hn::Add(LoadF32(df, xr + i), LoadF32(df, rr + i)));
      StoreF32(df, s, rr + i);
      acc = hn::MulAdd(s, s, acc);
    }
    if (i < n) {
      const size_t rest = n - i;
      const rd::VF s = rd::RoundTo<T>(
          df, hn::Add(LoadF32N(df, xr + i, rest), LoadF32N(df, rr + i, rest)));
      StoreF32N(df, s, rr + i, rest);
      acc = hn::MulAdd(s, s, acc);
    }
    const float sum_sq = hn::ReduceSum(df, acc);
    rd::ScaleRow(df, xr, rr, weight, n, rd::InvRms(sum_sq, n, eps));
  }
}

}  // namespace mllm_kernel::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MLLM_KERNEL_RMS_NORM_INL_H_
