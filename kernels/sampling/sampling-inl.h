/*!
 * \file kernels/sampling/sampling-inl.h
 * \brief Highway per-target bodies of the CPU greedy sample (argmax) and min-p; sampling.cpp's
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

// The max of x[0, n), n > 0, and whether a NaN occurs (*nan; the max is then meaningless).
template <typename T>
HWY_INLINE float RowMax(const T* HWY_RESTRICT x, size_t n, bool* nan) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  auto vmax0 = neg_inf, vmax1 = neg_inf;  // two accumulators hide the max latency
  auto any_nan = hn::MaskFalse(df);
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const auto v0 = LoadF32(df, x + i), v1 = LoadF32(df, x + i + lanes);
    vmax0 = hn::Max(vmax0, v0);
    vmax1 = hn::Max(vmax1, v1);
    any_nan = hn::Or(any_nan, hn::Or(hn::IsNaN(v0), hn::IsNaN(v1)));
  }
  for (; i + lanes <= n; i += lanes) {
    const auto v = LoadF32(df, x + i);
    vmax0 = hn::Max(vmax0, v);
    any_nan = hn::Or(any_nan, hn::IsNaN(v));
  }
  if (i < n) {  // zero-filled lanes are not NaN, and -inf does not win the max
    const auto v = LoadF32N(df, x + i, n - i);
    vmax0 = hn::Max(vmax0, hn::IfThenElse(hn::FirstN(df, n - i), v, neg_inf));
    any_nan = hn::Or(any_nan, hn::IsNaN(v));
  }
  *nan = !hn::AllFalse(df, any_nan);
  return hn::ReduceMax(df, hn::Max(vmax0, vmax1));
}

// argmax of one row, n > 0: the first NaN if there is one (like torch), else the first index
// of the max. Two passes: the max (and whether a NaN occurs), then the first index holding it.
template <typename T>
HWY_INLINE int64_t ArgMaxRow(const T* HWY_RESTRICT x, size_t n) {
  bool nan;
  const float max = RowMax(x, n, &nan);
  if (nan) return static_cast<int64_t>(FindFirst(x, n, [&](hn::Vec<DF> v) { return hn::IsNaN(v); }));
  const auto vmax = hn::Set(DF(), max);
  return static_cast<int64_t>(FindFirst(x, n, [&](hn::Vec<DF> v) { return hn::Eq(v, vmax); }));
}

// The exported entry (HWY_EXPORT_T in sampling.cpp): rows `stride` elements apart.
template <typename T>
void ArgMaxRows(int64_t* out, const T* x, int64_t rows, int64_t vocab, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r) out[r] = ArgMaxRow(x + r * stride, static_cast<size_t>(vocab));
}

/*!
 * \brief min_p_sample's token for one row of n > 0 probabilities (the rule in sampling.cpp):
 *        the row max, the kept sum (p >= min_p * max, the product in float32) in float64 lanes,
 *        then the inverse CDF over blocks of 4 vectors, element by element only inside the block
 *        where the running sum passes u times the total. Sums differ from sampling.cpp's
 *        sequential ones only in rounding. Returns -1 for a row holding a NaN (whose max rule,
 *        NaN skipped after the first element, the caller's scalar path keeps) and where float64
 *        vectors are missing.
 */
template <typename T>
int64_t MinPRow(const T* HWY_RESTRICT x, int64_t length, float min_p, float u) {
#if HWY_HAVE_FLOAT64
  const size_t n = static_cast<size_t>(length);
  bool nan;
  const float threshold = min_p * RowMax(x, n, &nan);
  if (nan) return -1;

  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dh;  // a float per double lane
  const size_t dl = hn::Lanes(dd);
  const auto thr = hn::Set(dh, threshold), zero = hn::Zero(dh);
  // The total counts every kept value, as the sequential sum does; the walk only positive ones.
  auto kept = [&](size_t at, size_t count) {
    const auto v = LoadF32N(dh, x + at, count);  // lanes past count are 0
    return hn::PromoteTo(dd, hn::IfThenElseZero(hn::Ge(v, thr), v));
  };
  auto positive = [&](size_t at, size_t count) {
    const auto v = LoadF32N(dh, x + at, count);
    return hn::PromoteTo(dd, hn::IfThenElseZero(hn::And(hn::Ge(v, thr), hn::Gt(v, zero)), v));
  };
  auto s0 = hn::Zero(dd), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 4 * dl <= n; i += 4 * dl) {
    s0 = hn::Add(s0, kept(i, dl));
    s1 = hn::Add(s1, kept(i + dl, dl));
    s2 = hn::Add(s2, kept(i + 2 * dl, dl));
    s3 = hn::Add(s3, kept(i + 3 * dl, dl));
  }
  for (; i < n; i += dl) s0 = hn::Add(s0, kept(i, HWY_MIN(dl, n - i)));
  const double total = hn::ReduceSum(dd, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3)));

  const double target = static_cast<double>(u) * total;
  constexpr size_t kMaxBlock = 4 * HWY_MAX_BYTES / sizeof(double);
  float values[kMaxBlock];
  double cum = 0.0;
  for (i = 0; i < n; i += 4 * dl) {
    const size_t m = HWY_MIN(4 * dl, n - i);
    auto block = hn::Zero(dd);
    for (size_t j = 0; j < m; j += dl) block = hn::Add(block, positive(i + j, HWY_MIN(dl, m - j)));
    const double sum = hn::ReduceSum(dd, block);
    if (!(cum + sum > target)) {
      cum += sum;
      continue;
    }
    for (size_t j = 0; j < m; j += dl) hn::StoreU(LoadF32N(dh, x + i + j, HWY_MIN(dl, m - j)), dh, values + j);
    for (size_t j = 0; j < m; ++j) {
      const float p = values[j];
      if (!(p >= threshold && p > 0.0f)) continue;
      cum += p;
      if (cum > target) return static_cast<int64_t>(i + j);
    }  // not passed after all (rounding): go on from the walked sum
  }
  // u * total rounded past the sum: the last kept index (0 if none), as the sequential walk.
  for (size_t j = n; j-- > 0;) {
    const float p = hn::GetLane(LoadF32N(dh, x + j, 1));
    if (p >= threshold && p > 0.0f) return static_cast<int64_t>(j);
  }
  return 0;
#else
  (void)x, (void)length, (void)min_p, (void)u;
  return -1;
#endif
}

}  // namespace sampling_detail
}  // namespace mllm_kernel::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MLLM_KERNEL_SAMPLING_INL_H_
