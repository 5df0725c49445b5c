/*!
 * \file kernels/rope/rope.cpp
 * \brief CPU rotary position embedding (RoPE), in place on q and k, Highway dynamic dispatch.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * TVM_FFI_DLL_EXPORT_TYPED_FUNC(apply_rope, mllm_kernel::cpu::apply_rope).
 */
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "rope_simd.hpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "rope_simd.hpp"

#if HWY_ONCE
namespace mllm_kernel::cpu {

HWY_EXPORT(RopeF32);
HWY_EXPORT(RopeF16);
HWY_EXPORT(RopeBF16);

/*!
 * \brief Rotate the first rot_dim dims of each head of q [T, H, D] and k [T, KH, D] in place.
 *
 * positions: int64 [T]; cos_sin_cache: float32 [max_pos, rot_dim] (cos in the first rot_dim/2
 * columns, sin in the rest). q/k: float32/float16/bfloat16, same dtype, any token stride, heads
 * and dims contiguous. is_neox: pairs (i, i + rot_dim/2); else GPT-J pairs (2i, 2i+1).
 * Every position is checked before anything is written: ValueError names the first bad token.
 */
inline void apply_rope(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView positions,
                       tvm::ffi::TensorView cos_sin_cache, bool is_neox) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize T{"num_tokens"}, H{"num_heads"}, KH{"num_kv_heads"}, D{"head_dim"};
  SymbolicSize QS{"q_token_stride"}, KS{"k_token_stride"}, P{"max_pos"}, R{"rot_dim"};
  SymbolicDType dtype;
  TensorMatcher({T, H, D})
      .for_op("apply_rope")
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDLCPU>()
      .with_strides({QS, D, 1})
      .verify(q, "q");
  TensorMatcher({T, KH, D})
      .for_op("apply_rope")
      .with_dtype(dtype)
      .with_device<kDLCPU>()
      .with_strides({KS, D, 1})
      .verify(k, "k");
  TensorMatcher({T}).for_op("apply_rope").with_dtype<int64_t>().with_device<kDLCPU>().verify(
      positions, "positions");
  TensorMatcher({P, R}).for_op("apply_rope").with_dtype<float>().with_device<kDLCPU>().verify(
      cos_sin_cache, "cos_sin_cache");
  const int64_t num_tokens = T.unwrap(), head_dim = D.unwrap(), rot_dim = R.unwrap();
  const int64_t max_pos = P.unwrap();
  ValueCheck(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= head_dim,
             "apply_rope: cos_sin_cache rot_dim (dim 1) must be even and in [2, head_dim=",
             head_dim, "], got ", rot_dim);
  const int64_t* pos = data_ptr<const int64_t>(positions);
  // Validate first, so a bad position leaves q and k untouched.
  for (int64_t t = 0; t < num_tokens; ++t) {
    ValueCheck(pos[t] >= 0 && pos[t] < max_pos, "apply_rope: positions[", t, "] = ", pos[t],
               " is out of range [0, max_pos=", max_pos, ")");
  }
  if (num_tokens == 0) return;
  std::vector<float> scratch(static_cast<size_t>(2 * rot_dim));
  const float* cache = data_ptr<const float>(cos_sin_cache);
  const int64_t qs = QS.unwrap(), ks = KS.unwrap(), nh = H.unwrap(), nkv = KH.unwrap();
  if (dtype.is<float>()) {
    HWY_DYNAMIC_DISPATCH(RopeF32)(data_ptr<float>(q), data_ptr<float>(k), pos, cache, num_tokens,
                                  nh, nkv, head_dim, rot_dim, qs, ks, is_neox, scratch.data());
  } else if (dtype.is<float16_tag>()) {
    HWY_DYNAMIC_DISPATCH(RopeF16)(data_ptr<hwy::float16_t>(q), data_ptr<hwy::float16_t>(k), pos,
                                  cache, num_tokens, nh, nkv, head_dim, rot_dim, qs, ks, is_neox,
                                  scratch.data());
  } else {
    HWY_DYNAMIC_DISPATCH(RopeBF16)(data_ptr<hwy::bfloat16_t>(q), data_ptr<hwy::bfloat16_t>(k), pos,
                                   cache, num_tokens, nh, nkv, head_dim, rot_dim, qs, ks, is_neox,
                                   scratch.data());
  }
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
