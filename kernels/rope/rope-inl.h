/*!
 * \file kernels/rope/rope-inl.h
 * \brief Highway per-target body of the CPU rotary embedding (RoPE) kernel. rope.cpp names it
 * in HWY_TARGET_INCLUDE: <hwy/foreach_target.h> re-includes it for every SIMD target, so it has
 * a toggling guard instead of #pragma once.
 */
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(MLLM_KERNEL_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MLLM_KERNEL_ROPE_INL_H_
#undef MLLM_KERNEL_ROPE_INL_H_
#else
#define MLLM_KERNEL_ROPE_INL_H_
#endif
#include <hwy/highway.h>  // this target's ops
#include <mllm_kernel/cpu/simd_io-inl.h>  // PromoteToF32, per target too

HWY_BEFORE_NAMESPACE();
namespace mllm_kernel::cpu::HWY_NAMESPACE {
namespace rope_detail {
namespace hn = hwy::HWY_NAMESPACE;

// Load/store n (<= Lanes(df)) elements of T as float32 lanes; 16-bit types go through a
// half-width vector and PromoteTo/DemoteTo. Full vectors use LoadU/StoreU, tails LoadN/StoreN.
template <class DF, typename T>
HWY_INLINE hn::VFromD<DF> LoadAsFloat(DF df, const T* p, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return n == hn::Lanes(df) ? hn::LoadU(df, p) : hn::LoadN(df, p, n);
  } else {
    const hn::Rebind<T, DF> dt;
    return PromoteToF32(df, n == hn::Lanes(df) ? hn::LoadU(dt, p) : hn::LoadN(dt, p, n));
  }
}

template <class DF, typename T>
HWY_INLINE void StoreFromFloat(DF df, hn::VFromD<DF> v, T* p, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (n == hn::Lanes(df)) {
      hn::StoreU(v, df, p);
    } else {
      hn::StoreN(v, df, p, n);
    }
  } else {
    const hn::Rebind<T, DF> dt;
    const auto packed = hn::DemoteTo(dt, v);
    if (n == hn::Lanes(df)) {
      hn::StoreU(packed, dt, p);
    } else {
      hn::StoreN(packed, dt, p, n);
    }
  }
}

// NeoX: pairs (i, i + half). x1' = x1*cos - x2*sin, x2' = x2*cos + x1*sin.
template <typename T>
HWY_INLINE void RotateNeox(T* x, const float* cos, const float* sin, size_t half) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  for (size_t i = 0; i < half; i += lanes) {
    const size_t n = half - i < lanes ? half - i : lanes;
    // Both halves are loaded before either is stored: in place is safe.
    const auto x1 = LoadAsFloat(df, x + i, n);
    const auto x2 = LoadAsFloat(df, x + half + i, n);
    const auto c = LoadAsFloat(df, cos + i, n);
    const auto s = LoadAsFloat(df, sin + i, n);
    StoreFromFloat(df, hn::NegMulAdd(x2, s, hn::Mul(x1, c)), x + i, n);
    StoreFromFloat(df, hn::MulAdd(x1, s, hn::Mul(x2, c)), x + half + i, n);
  }
}

// GPT-J: pairs (2i, 2i+1). With cos_dup[j] = cos[j/2] and sin_alt[j] = (j even ? -1 : +1) *
// sin[j/2] (built once per token), x' = x*cos_dup + swap_pairs(x)*sin_alt, where Reverse2
// swaps adjacent lanes. rot_dim and every vector start are even, so pairs never straddle.
template <typename T>
HWY_INLINE void RotateGptj(T* x, const float* cos_dup, const float* sin_alt, size_t rot_dim) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  for (size_t i = 0; i < rot_dim; i += lanes) {
    const size_t n = rot_dim - i < lanes ? rot_dim - i : lanes;
    const auto v = LoadAsFloat(df, x + i, n);
    const auto c = LoadAsFloat(df, cos_dup + i, n);
    const auto s = LoadAsFloat(df, sin_alt + i, n);
    StoreFromFloat(df, hn::MulAdd(hn::Reverse2(df, v), s, hn::Mul(v, c)), x + i, n);
  }
}

}  // namespace rope_detail

// Rotates the first rot_dim dims of every head of q and k in place. Positions were checked to
// lie in [0, max_pos) by the caller. Strides are in elements; heads are head_dim apart.
// scratch: 2 * rot_dim floats (the per-token GPT-J cos/sin tables). The exported entry
// (HWY_EXPORT_T in rope.cpp): one dispatch table per T.
template <typename T>
void RopeImpl(T* q, T* k, const int64_t* positions, const float* cos_sin_cache, int64_t num_tokens,
              int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t rot_dim,
              int64_t q_stride, int64_t k_stride, bool is_neox, float* scratch) {
  const size_t half = static_cast<size_t>(rot_dim / 2);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* cos = cos_sin_cache + positions[t] * rot_dim;
    const float* sin = cos + half;
    T* q_row = q + t * q_stride;
    T* k_row = k + t * k_stride;
    if (is_neox) {
      for (int64_t h = 0; h < num_heads; ++h) rope_detail::RotateNeox(q_row + h * head_dim, cos, sin, half);
      for (int64_t h = 0; h < num_kv_heads; ++h) rope_detail::RotateNeox(k_row + h * head_dim, cos, sin, half);
    } else {
      float* cos_dup = scratch;
      float* sin_alt = scratch + rot_dim;
      for (size_t i = 0; i < half; ++i) {
        cos_dup[2 * i] = cos[i];
        cos_dup[2 * i + 1] = cos[i];
        sin_alt[2 * i] = -sin[i];
        sin_alt[2 * i + 1] = sin[i];
      }
      const size_t rd = static_cast<size_t>(rot_dim);
      for (int64_t h = 0; h < num_heads; ++h) rope_detail::RotateGptj(q_row + h * head_dim, cos_dup, sin_alt, rd);
      for (int64_t h = 0; h < num_kv_heads; ++h) rope_detail::RotateGptj(k_row + h * head_dim, cos_dup, sin_alt, rd);
    }
  }
}

}  // namespace mllm_kernel::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MLLM_KERNEL_ROPE_INL_H_
