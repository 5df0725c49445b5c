/*!
 * \file kernels/softmax/softmax-inl.h
 * \brief Highway per-target body of the CPU softmax / log_softmax kernels; softmax.cpp's
 * HWY_TARGET_INCLUDE, so <hwy/foreach_target.h> re-includes it once per SIMD target (a toggling
 * guard, not #pragma once).
 */
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(MLLM_KERNEL_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MLLM_KERNEL_SOFTMAX_INL_H_
#undef MLLM_KERNEL_SOFTMAX_INL_H_
#else
#define MLLM_KERNEL_SOFTMAX_INL_H_
#endif
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>  // per target, like this file
#include <mllm_kernel/cpu/simd_io-inl.h>  // LoadF32 / StoreF32, per target too

HWY_BEFORE_NAMESPACE();
namespace mllm_kernel::cpu::HWY_NAMESPACE {
namespace softmax_detail {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// Loads and stores of T as float32 vectors: LoadF32 / LoadF32N / StoreF32 / StoreF32N
// (mllm_kernel/cpu/simd_io-inl.h).

// One row: out = softmax(x * inv_temp) or log_softmax(x * inv_temp), accumulated in float32.
// Three passes over the row (max, sum of exp, write). softmax keeps the exps, one per element,
// until the sum is known: float32 in out itself (scaled in place after), fp16/bf16 in the
// float32 `scratch` of n elements (so that they are rounded once, in the last pass).
template <typename T>
HWY_INLINE void Row(T* HWY_RESTRICT out, const T* HWY_RESTRICT x, size_t n, float inv_temp,
                    bool log, float* HWY_RESTRICT scratch) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());

  // Pass 1: max of x (the scale is positive, so max(x * s) = max(x) * s).
  auto vmax0 = neg_inf, vmax1 = neg_inf;  // two accumulators hide the max latency
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    vmax0 = hn::Max(vmax0, LoadF32(df, x + i));
    vmax1 = hn::Max(vmax1, LoadF32(df, x + i + lanes));
  }
  for (; i + lanes <= n; i += lanes) vmax0 = hn::Max(vmax0, LoadF32(df, x + i));
  if (i < n) {  // zero-filled lanes must not win the max
    const auto tail = hn::IfThenElse(hn::FirstN(df, n - i), LoadF32N(df, x + i, n - i), neg_inf);
    vmax0 = hn::Max(vmax0, tail);
  }
  const float row_max = hn::ReduceMax(df, hn::Max(vmax0, vmax1));
  // z = (x - max) * s as (x/2 - max/2) * 2s (softmax.hpp, kMaxInvTemperature): subtracting
  // first makes z exactly 0 at the max and <= 0 elsewhere for ANY temperature; the halves keep
  // the difference finite. (x * s - max * s leaves the max a rounding error of |max * s| that
  // exp amplifies to inf, and x * s overflows for tiny temperatures: NaN.)
  const auto vhalf = hn::Set(df, 0.5f);
  const auto vhalf_max = hn::Set(df, 0.5f * row_max);
  const auto vs2 = hn::Set(df, 2.0f * inv_temp);
  auto scaled = [&](hn::Vec<DF> v) { return hn::Mul(hn::MulSub(v, vhalf, vhalf_max), vs2); };

  // Pass 2: sum of exp((x - max) * s); softmax keeps them in `exps` (out is never x: the
  // contract rejects aliasing).
  float* exps = scratch;
  if constexpr (std::is_same_v<T, float>) exps = out;
  const bool keep = !log;
  auto vsum0 = hn::Zero(df), vsum1 = hn::Zero(df);
  i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const auto e0 = hn::Exp(df, scaled(LoadF32(df, x + i)));
    const auto e1 = hn::Exp(df, scaled(LoadF32(df, x + i + lanes)));
    if (keep) {
      StoreF32(df, e0, exps + i);
      StoreF32(df, e1, exps + i + lanes);
    }
    vsum0 = hn::Add(vsum0, e0);
    vsum1 = hn::Add(vsum1, e1);
  }
  for (; i + lanes <= n; i += lanes) {
    const auto e = hn::Exp(df, scaled(LoadF32(df, x + i)));
    if (keep) StoreF32(df, e, exps + i);
    vsum0 = hn::Add(vsum0, e);
  }
  if (i < n) {
    const auto e = hn::Exp(df, scaled(LoadF32N(df, x + i, n - i)));
    if (keep) StoreF32N(df, e, exps + i, n - i);
    vsum0 = hn::Add(vsum0, hn::IfThenElseZero(hn::FirstN(df, n - i), e));
  }
  const float sum = hn::ReduceSum(df, hn::Add(vsum0, vsum1));

  // Pass 3: write.
  i = 0;
  if (log) {
    const auto vlog = hn::Set(df, std::log(sum));
    for (; i + lanes <= n; i += lanes) StoreF32(df, hn::Sub(scaled(LoadF32(df, x + i)), vlog), out + i);
    if (i < n) StoreF32N(df, hn::Sub(scaled(LoadF32N(df, x + i, n - i)), vlog), out + i, n - i);
  } else {
    const auto vinv = hn::Set(df, 1.0f / sum);
    for (; i + lanes <= n; i += lanes) StoreF32(df, hn::Mul(LoadF32(df, exps + i), vinv), out + i);
    if (i < n) StoreF32N(df, hn::Mul(LoadF32N(df, exps + i, n - i), vinv), out + i, n - i);
  }
}

// The exported entry (HWY_EXPORT_T in softmax.cpp): out is contiguous [rows, vocab]; x rows
// are x_stride elements apart.
template <typename T>
void Rows(T* out, const T* x, int64_t rows, int64_t vocab, int64_t x_stride, float inv_temp,
          bool log) {
  // 16-bit softmax outputs: a row of float32 exps (one exp per element instead of two: 1.4-1.8x
  // on one thread, RESULTS.md), this thread's own and kept between calls up to 4 MiB.
  constexpr size_t kKeptFloats = size_t{1} << 20;
  std::vector<float> once;
  float* scratch = nullptr;
  if constexpr (!std::is_same_v<T, float>) {
    static thread_local std::vector<float> kept;
    if (!log) {
      const size_t n = static_cast<size_t>(vocab);
      std::vector<float>& exps = n <= kKeptFloats ? kept : once;
      if (exps.size() < n) exps.resize(n);
      scratch = exps.data();
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    Row(out + r * vocab, x + r * x_stride, static_cast<size_t>(vocab), inv_temp, log, scratch);
  }
}

}  // namespace softmax_detail
}  // namespace mllm_kernel::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MLLM_KERNEL_SOFTMAX_INL_H_
