/*!
 * \file kernels/kv_cache/kv_cache.cpp
 * \brief CPU store_kv_cache: scatter k/v rows into paged caches (one memcpy per row).
 *
 * A pure copy, so no Highway body: memcpy is already vectorized by the C library.
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * TVM_FFI_DLL_EXPORT_TYPED_FUNC(store_kv_cache, mllm_kernel::cpu::store_kv_cache).
 */
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <cstring>

namespace mllm_kernel::cpu {

/*!
 * \brief k_cache/v_cache [num_blocks, block_size, KH, D] at flat slot slot_mapping[t] = k/v[t].
 *
 * k, v: [T, KH, D], any token stride, heads and dims contiguous; caches contiguous, same dtype
 * (float32/float16/bfloat16). slot -1 skips the token. Every slot is checked before anything is
 * written: a slot < -1 or >= num_blocks * block_size raises ValueError naming the token.
 */
inline void store_kv_cache(tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView k_cache,
                           tvm::ffi::TensorView v_cache, tvm::ffi::TensorView slot_mapping) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize T{"num_tokens"}, KH{"num_kv_heads"}, D{"head_dim"}, KS{"k_token_stride"},
      VS{"v_token_stride"}, NB{"num_blocks"}, BS{"block_size"};
  SymbolicDType dtype;
  TensorMatcher({T, KH, D})
      .for_op("store_kv_cache")
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDLCPU>()
      .with_strides({KS, D, 1})
      .verify(k, "k");
  TensorMatcher({T, KH, D})
      .for_op("store_kv_cache")
      .with_dtype(dtype)
      .with_device<kDLCPU>()
      .with_strides({VS, D, 1})
      .verify(v, "v");
  TensorMatcher({NB, BS, KH, D})
      .for_op("store_kv_cache")
      .with_dtype(dtype)
      .with_device<kDLCPU>()
      .verify(k_cache, "k_cache")
      .verify(v_cache, "v_cache");
  TensorMatcher({T}).for_op("store_kv_cache").with_dtype<int64_t>().with_device<kDLCPU>().verify(
      slot_mapping, "slot_mapping");
  const int64_t num_tokens = T.unwrap();
  const int64_t num_slots = NB.unwrap() * BS.unwrap();
  const int64_t* slots = data_ptr<const int64_t>(slot_mapping);
  // Validate first, so a bad slot leaves both caches untouched.
  for (int64_t t = 0; t < num_tokens; ++t) {
    ValueCheck(slots[t] >= -1 && slots[t] < num_slots, "store_kv_cache: slot_mapping[", t, "] = ",
               slots[t], " is out of range [-1, num_blocks * block_size = ", num_slots, ")");
  }
  const int64_t elem = dtype_bytes(dtype.unwrap());
  const int64_t row = KH.unwrap() * D.unwrap();  // elements per token and cache slot
  const size_t row_bytes = static_cast<size_t>(row * elem);
  const auto* k_src = data_ptr<const char>(k);
  const auto* v_src = data_ptr<const char>(v);
  auto* k_dst = data_ptr<char>(k_cache);
  auto* v_dst = data_ptr<char>(v_cache);
  const int64_t ks = KS.unwrap() * elem, vs = VS.unwrap() * elem;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0) continue;  // -1: padding token, nothing to store
    std::memcpy(k_dst + slot * row * elem, k_src + t * ks, row_bytes);
    std::memcpy(v_dst + slot * row * elem, v_src + t * vs, row_bytes);
  }
}

}  // namespace mllm_kernel::cpu
