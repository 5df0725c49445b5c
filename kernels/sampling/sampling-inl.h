/*!
 * \file kernels/sampling/sampling-inl.h
 * \brief Highway per-target body of the CPU greedy sample (argmax); sampling.cpp's
 * HWY_TARGET_INCLUDE, so <hwy/foreach_target.h> re-includes it once per SIMD target (a toggling
 * guard, not #pragma once).
 */
#include <cstddef>
#include <cstdint>
#include <limits>

#if defined(MLLM_KERNEL_SAMPLING_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MLLM_KERNEL_SAMPLING_INL_H_
#undef MLLM_KERNEL_SAMPLING_INL_H_
#else
#define MLLM_KERNEL_SAMPLING_INL_H_
#endif
#include <hwy/highway.h>
#include <mllm_kernel/cpu/simd_io-inl.h>  // LoadF32 / LoadF32N, per target too

HWY_BEFORE_NAMESPACE();
namespace mllm_kernel::cpu::HWY_NAMESPACE {
namespace sampling_detail {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// The first index i of x[0, n) with pred(x[i] as a float32 vector) true, or n.
template <typename T, typename Pred>
HWY_INLINE size_t FindFirst(const T* HWY_RESTRICT x, size_t n, Pred&& pred) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const intptr_t k = hn::FindFirstTrue(df, pred(LoadF32(df, x + i)));
    if (k >= 0) return i + static_cast<size_t>(k);
  }
  if (i < n) {
    const intptr_t k = hn::FindFirstTrue(df, hn::And(hn::FirstN(df, n - i), pred(LoadF32N(df, x + i, n - i))));
    if (k >= 0) return i + static_cast<size_t>(k);
  }
  return n;
}

// argmax of one row, n > 0: the first NaN if there is one (like torch), else the first index
// of the max. Two passes: the max (and whether a NaN occurs), then the first index holding it.
template <typename T>
HWY_INLINE int64_t ArgMaxRow(const T* HWY_RESTRICT x, size_t n) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  auto vmax0 = neg_inf, vmax1 = neg_inf;  // two accumulators hide the max latency
  auto nan = hn::MaskFalse(df);
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const auto v0 = LoadF32(df, x + i), v1 = LoadF32(df, x + i + lanes);
    vmax0 = hn::Max(vmax0, v0);
    vmax1 = hn::Max(vmax1, v1);
    nan = hn::Or(nan, hn::Or(hn::IsNaN(v0), hn::IsNaN(v1)));
  }
  for (; i + lanes <= n; i += lanes) {
    const auto v = LoadF32(df, x + i);
    vmax0 = hn::Max(vmax0, v);
    nan = hn::Or(nan, hn::IsNaN(v));
  }
  if (i < n) {  // zero-filled lanes are not NaN, and -inf does not win the max
    const auto v = LoadF32N(df, x + i, n - i);
    vmax0 = hn::Max(vmax0, hn::IfThenElse(hn::FirstN(df, n - i), v, neg_inf));
    nan = hn::Or(nan, hn::IsNaN(v));
  }
  if (!hn::AllFalse(df, nan)) {
    return static_cast<int64_t>(FindFirst(x, n, [&](hn::Vec<DF> v) { return hn::IsNaN(v); }));
  }
  const auto vmax = hn::Set(df, hn::ReduceMax(df, hn::Max(vmax0, vmax1)));
  return static_cast<int64_t>(FindFirst(x, n, [&](hn::Vec<DF> v) { return hn::Eq(v, vmax); }));
}

// The exported entry (HWY_EXPORT_T in sampling.cpp): rows `stride` elements apart.
template <typename T>
void ArgMaxRows(int64_t* out, const T* x, int64_t rows, int64_t vocab, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r) out[r] = ArgMaxRow(x + r * stride, static_cast<size_t>(vocab));
}

}  // namespace sampling_detail
}  // namespace mllm_kernel::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MLLM_KERNEL_SAMPLING_INL_H_
