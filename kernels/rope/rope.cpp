/*!
 * \file kernels/rope/rope.cpp
 * \brief CPU rotary position embedding (RoPE), in place on q and k, Highway dynamic dispatch.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * TVM_FFI_DLL_EXPORT_TYPED_FUNC(apply_rope, mllm_kernel::cpu::apply_rope).
 */
#include "rope.hpp"

#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "rope-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "rope-inl.h"

#if HWY_ONCE
namespace mllm_kernel::cpu {

/*!
 * \brief Rotate the first rot_dim dims of each head of q [T, H, D] and k [T, KH, D] in place
 * (arguments: rope.hpp). is_neox: pairs (i, i + rot_dim/2); else GPT-J pairs (2i, 2i+1).
 * Every position is checked before anything is written: ValueError names the first bad token.
 * error: the CUDA export's device-error record, taken for the same signature and ignored (the
 * CPU raises at once instead).
 */
inline void apply_rope(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView positions,
                       tvm::ffi::TensorView cos_sin_cache, bool is_neox, tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a = mllm_kernel::rope::VerifyApplyRope<kDLCPU>(q, k, positions, cos_sin_cache, error);
  const int64_t* pos = data_ptr<const int64_t>(positions);
  // Validate first, so a bad position leaves q and k untouched.
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    host::ValueCheck(pos[t] >= 0 && pos[t] < a.max_pos, "apply_rope: positions[", t, "] = ",
                     pos[t], " is out of range [0, max_pos=", a.max_pos, ")");
  }
  if (a.empty()) return;
  std::vector<float> scratch(static_cast<size_t>(2 * a.rot_dim));
  host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
    HWY_EXPORT_T(Table, RopeImpl<T>);
    HWY_DYNAMIC_DISPATCH_T(Table)(data_ptr<T>(q), data_ptr<T>(k), pos,
                                  data_ptr<const float>(cos_sin_cache), a.num_tokens, a.num_heads,
                                  a.num_kv_heads, a.head_dim, a.rot_dim, a.q_stride, a.k_stride,
                                  is_neox, scratch.data());
  });
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
