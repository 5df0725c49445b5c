/*!
 * \file include/mllm_kernel/cpu/simd_io-inl.h
 * \brief Highway per-target helpers: load float / float16 / bfloat16 / float8 e4m3fn memory as
 * float32 vectors (PromoteToF32: inf and NaN kept on every target) and store float32 vectors
 * back to float / float16 / bfloat16 (CPU kernels compute in float32).
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
#include <mllm_kernel/cpu/float8.hpp>

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

// e4m3fn bytes (promoted to u32 lanes) as float32, exactly: normal numbers by moving exponent
// and mantissa into place (+120 rebiases 7 to 127), subnormals (exponent 0) as m * 2^-9 (no
// float denormals, which a flush-to-zero mode would lose), 0x7F/0xFF as NaN.
template <class DF, class VU>
HWY_INLINE hn::VFromD<DF> E4M3ToF32(DF df, VU bits) {
  const hn::RebindToUnsigned<DF> du;
  const auto em = hn::And(bits, hn::Set(du, 0x7Fu));
  const auto normal = hn::BitCast(df, hn::Add(hn::ShiftLeft<20>(em), hn::Set(du, 120u << 23)));
  const auto subnormal = hn::Mul(hn::ConvertTo(df, hn::BitCast(hn::RebindToSigned<DF>(), em)), hn::Set(df, 0.001953125f));
  auto value = hn::IfThenElse(hn::RebindMask(df, hn::Lt(em, hn::Set(du, 8u))), subnormal, normal);
  value = hn::IfThenElse(hn::RebindMask(df, hn::Eq(em, hn::Set(du, 0x7Fu))), hn::NaN(df), value);
  return hn::Or(value, hn::BitCast(df, hn::ShiftLeft<24>(hn::And(bits, hn::Set(du, 0x80u)))));
}

// One full vector (unaligned) of T at p, as float32.
template <class DF, typename T>
HWY_INLINE hn::VFromD<DF> LoadF32(DF df, const T* HWY_RESTRICT p) {
  if constexpr (hwy::IsSame<T, float>()) {
    return hn::LoadU(df, p);
  } else if constexpr (hwy::IsSame<T, float8_e4m3fn_t>()) {
    const hn::Rebind<uint8_t, DF> d8;
    return E4M3ToF32(df, hn::PromoteTo(hn::RebindToUnsigned<DF>(), hn::LoadU(d8, reinterpret_cast<const uint8_t*>(p))));
  } else {
    return PromoteToF32(df, hn::LoadU(hn::Rebind<T, DF>(), p));
  }
}

// The first n (< one vector) elements of T at p, as float32; the other lanes are zero.
template <class DF, typename T>
HWY_INLINE hn::VFromD<DF> LoadF32N(DF df, const T* HWY_RESTRICT p, size_t n) {
  if constexpr (hwy::IsSame<T, float>()) {
    return hn::LoadN(df, p, n);
  } else if constexpr (hwy::IsSame<T, float8_e4m3fn_t>()) {
    const hn::Rebind<uint8_t, DF> d8;
    return E4M3ToF32(df, hn::PromoteTo(hn::RebindToUnsigned<DF>(), hn::LoadN(d8, reinterpret_cast<const uint8_t*>(p), n)));
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
