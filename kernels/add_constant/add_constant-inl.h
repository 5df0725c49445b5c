/*!
 * \file kernels/add_constant/add_constant-inl.h
 * \brief Highway per-target body of the CPU add_constant kernels: add_constant.cpp's
 * HWY_TARGET_INCLUDE, re-included by <hwy/foreach_target.h> for each SIMD target (so a
 * toggling guard, not #pragma once).
 */
#include <cstddef>

#if defined(MLLM_KERNEL_ADD_CONSTANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MLLM_KERNEL_ADD_CONSTANT_INL_H_
#undef MLLM_KERNEL_ADD_CONSTANT_INL_H_
#else
#define MLLM_KERNEL_ADD_CONSTANT_INL_H_
#endif
#include <hwy/highway.h>  // per target too

HWY_BEFORE_NAMESPACE();
namespace mllm_kernel::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// dst[i] = src[i] + c. dst may alias src (in-place), so no HWY_RESTRICT.
HWY_INLINE void AddConstantImpl(float* dst, const float* src, size_t n, float c) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const auto vc = hn::Set(d, c);
  size_t i = 0;
  // Two vectors per iteration keeps both load ports busy on wide targets.
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const auto v0 = hn::LoadU(d, src + i);
    const auto v1 = hn::LoadU(d, src + i + lanes);
    hn::StoreU(hn::Add(v0, vc), d, dst + i);
    hn::StoreU(hn::Add(v1, vc), d, dst + i + lanes);
  }
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(d, src + i), vc), d, dst + i);
  }
  // Tail (< one vector): LoadN/StoreN touch only the first n - i elements.
  if (i < n) {
    const size_t rest = n - i;
    hn::StoreN(hn::Add(hn::LoadN(d, src + i, rest), vc), d, dst + i, rest);
  }
}

// Compile-time constant: one instantiation (and dispatch table, see HWY_EXPORT_T) per C.
template <int C>
void AddConstant(float* dst, const float* src, size_t n) {
  AddConstantImpl(dst, src, n, static_cast<float>(C));
}

void AddConstantRuntime(float* dst, const float* src, size_t n, float c) {
  AddConstantImpl(dst, src, n, c);
}

}  // namespace mllm_kernel::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MLLM_KERNEL_ADD_CONSTANT_INL_H_
