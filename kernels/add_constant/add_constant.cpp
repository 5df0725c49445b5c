/*!
 * \file kernels/add_constant/add_constant.cpp
 * \brief CPU add_constant kernels (float32), vectorized with Highway dynamic dispatch.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and then
 * exports e.g. TVM_FFI_DLL_EXPORT_TYPED_FUNC(add_constant, mllm_kernel::cpu::add_constant<16>).
 * The module must also link Highway's hwy/targets.cc and hwy/abort.cc.
 */
#include "add_constant.hpp"

#include <cstddef>

// Compile add_constant-inl.h once per SIMD target; found through the -I of this directory.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "add_constant-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

// ... and once more for the static (baseline) target.
#include "add_constant-inl.h"

#if HWY_ONCE
namespace mllm_kernel::cpu {

// Dispatch table of the per-target AddConstantRuntime (internal linkage).
HWY_EXPORT(AddConstantRuntime);

/*! \brief dst = src + C for float32 1-D contiguous CPU tensors; C in {1, 2, 4, 8, 16}. */
template <int C>
void add_constant(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  static_assert(C == 1 || C == 2 || C == 4 || C == 8 || C == 16,
                "add_constant<C>: C must be one of 1, 2, 4, 8, 16");
  const int64_t n = mllm_kernel::add_constant::VerifyAddConstant<kDLCPU>(dst, src).n;
  if (n == 0) return;
  // A function-local table per C: the per-target AddConstant<C> instantiations.
  HWY_EXPORT_T(AddConstantTable, AddConstant<C>);
  HWY_DYNAMIC_DISPATCH_T(AddConstantTable)
  (host::data_ptr<float>(dst), host::data_ptr<const float>(src), static_cast<size_t>(n));
}

/*! \brief dst = src + c (c rounded to float32) for float32 1-D contiguous CPU tensors. */
inline void add_constant_runtime(tvm::ffi::TensorView dst, tvm::ffi::TensorView src, double c) {
  const int64_t n = mllm_kernel::add_constant::VerifyAddConstant<kDLCPU>(dst, src).n;
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(AddConstantRuntime)
  (host::data_ptr<float>(dst), host::data_ptr<const float>(src), static_cast<size_t>(n),
   static_cast<float>(c));
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
