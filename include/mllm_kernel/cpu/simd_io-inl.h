/*!
 * \file include/mllm_kernel/cpu/simd_io-inl.h
 * \brief Highway per-target helpers: load float / float16 / bfloat16 memory as float32 vectors
 * and store float32 vectors back (CPU kernels compute in float32).
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

HWY_BEFORE_NAMESPACE();
namespace mllm_kernel::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One full vector (unaligned) of T at p, as float32.
template <class DF, typename T>
HWY_INLINE hn::VFromD<DF> LoadF32(DF df, const T* HWY_RESTRICT p) {
  if constexpr (hwy::IsSame<T, float>()) {
    return hn::LoadU(df, p);
  } else {
    return hn::PromoteTo(df, hn::LoadU(hn::Rebind<T, DF>(), p));
  }
}

// The first n (< one vector) elements of T at p, as float32; the other lanes are zero.
template <class DF, typename T>
HWY_INLINE hn::VFromD<DF> LoadF32N(DF df, const T* HWY_RESTRICT p, size_t n) {
  if constexpr (hwy::IsSame<T, float>()) {
    return hn::LoadN(df, p, n);
  } else {
    return hn::PromoteTo(df, hn::LoadN(hn::Rebind<T, DF>(), p, n));
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
