/*!
 * \file include/mllm_kernel/cpu/simd_io-inl.h
 * \brief Highway per-target helpers: load float / float16 / bfloat16 memory as float32 vectors
 * (PromoteToF32: inf and NaN kept on every target) and store float32 vectors back (CPU kernels
 * compute in float32).
 *
 * Include it from a kernel's -inl.h (re-included once per SIMD target by foreach_target.h),
 * hence the toggling guard instead of #pragma once.
 */
#if defined(MLLM_KERNEL_CPU_SIMD_IO_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MLLM_KERNEL_CPU_SIMD_IO_INL_H_
#undef MLLM_KERNEL_CPU_SIMD_IO_INL_H_
#else
#define MLLM_KERNEL_CPU_SIMD_IO_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace mllm_kernel::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// float16 / bfloat16 lanes as float32. Highway's portable float16 promotion, which x86 targets
// without F16C (SSE2, SSSE3, SSE4) and the emulated ones use, reads exponent 31 as a normal
// exponent: inf and NaN would become finite numbers near 2^16. Those lanes are rebuilt here.
template <class DF, class V16>
HWY_INLINE hn::VFromD<DF> PromoteToF32(DF df, V16 v) {
  const hn::VFromD<DF> promoted = hn::PromoteTo(df, v);
#if (HWY_ARCH_X86 && HWY_TARGET >= HWY_SSE4) || HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
  if constexpr (hwy::IsSame<hn::TFromV<V16>, hwy::float16_t>()) {
    const hn::RebindToUnsigned<DF> du32;
    const hn::Rebind<uint16_t, DF> du16;
    const auto bits = hn::PromoteTo(du32, hn::BitCast(du16, v));
    const auto exponent = hn::Set(du32, 0x7C00u);
    const auto special = hn::Eq(hn::And(bits, exponent), exponent);
    // sign, all-ones float32 exponent, the mantissa moved up: +-inf, or a NaN keeping its payload.
    const auto rebuilt = hn::Or(hn::Or(hn::ShiftLeft<16>(hn::And(bits, hn::Set(du32, 0x8000u))),
                                       hn::Set(du32, 0x7F800000u)),
                                hn::ShiftLeft<13>(hn::And(bits, hn::Set(du32, 0x3FFu))));
    return hn::IfThenElse(hn::RebindMask(df, special), hn::BitCast(df, rebuilt), promoted);
  }
#endif
  return promoted;
}

// One full vector (unaligned) of T at p, as float32.
template <class DF, typename T>
HWY_INLINE hn::VFromD<DF> LoadF32(DF df, const T* HWY_RESTRICT p) {
  if constexpr (hwy::IsSame<T, float>()) {
    return hn::LoadU(df, p);
  } else {
    return PromoteToF32(df, hn::LoadU(hn::Rebind<T, DF>(), p));
  }
}

// The first n (< one vector) elements of T at p, as float32; the other lanes are zero.
template <class DF, typename T>
HWY_INLINE hn::VFromD<DF> LoadF32N(DF df, const T* HWY_RESTRICT p, size_t n) {
  if constexpr (hwy::IsSame<T, float>()) {
    return hn::LoadN(df, p, n);
  } else {
    return PromoteToF32(df, hn::LoadN(hn::Rebind<T, DF>(), p, n));
  }
}

template <class DF, typename T>
HWY_INLINE void StoreF32(DF df, hn::VFromD<DF> v, T* HWY_RESTRICT p) {
  if constexpr (hwy::IsSame<T, float>()) {
    hn::StoreU(v, df, p);
  } else {
    const hn::Rebind<T, DF> dt;
    hn::StoreU(hn::DemoteTo(dt, v), dt, p);
  }
}

// Stores only the first n lanes.
template <class DF, typename T>
HWY_INLINE void StoreF32N(DF df, hn::VFromD<DF> v, T* HWY_RESTRICT p, size_t n) {
  if constexpr (hwy::IsSame<T, float>()) {
    hn::StoreN(v, df, p, n);
  } else {
    const hn::Rebind<T, DF> dt;
    hn::StoreN(hn::DemoteTo(dt, v), dt, p, n);
  }
}

}  // namespace mllm_kernel::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MLLM_KERNEL_CPU_SIMD_IO_INL_H_
