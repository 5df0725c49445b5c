/*!
 * \file kernels/kv_cache/kv_cache.cpp
 * \brief CPU store_kv_cache: scatter k/v rows into paged caches (one memcpy per row).
 *
 * A pure copy, so no Highway body: memcpy is already vectorized by the C library.
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * TVM_FFI_DLL_EXPORT_TYPED_FUNC(store_kv_cache, mllm_kernel::cpu::store_kv_cache).
 */
#include "kv_cache.hpp"

#include <cstdint>
#include <cstring>

namespace mllm_kernel::cpu {

/*!
 * \brief k_cache/v_cache [num_blocks, block_size, KH, D] at flat slot slot_mapping[t] = k/v[t]
 * (arguments: kv_cache.hpp).
 *
 * slot -1 skips the token. Every slot is checked before anything is written: a slot < -1 or
 * >= num_blocks * block_size raises ValueError naming the token. error: the CUDA export's
 * device-error record, taken for the same signature and ignored (the CPU raises at once instead).
 */
inline void store_kv_cache(tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView k_cache,
                           tvm::ffi::TensorView v_cache, tvm::ffi::TensorView slot_mapping,
                           tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a = mllm_kernel::kv_cache::VerifyStoreKVCache<kDLCPU>(k, v, k_cache, v_cache,
                                                                   slot_mapping, error);
  const int64_t* slots = data_ptr<const int64_t>(slot_mapping);
  // Validate first, so a bad slot leaves both caches untouched.
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    host::ValueCheck(slots[t] >= -1 && slots[t] < a.num_slots, "store_kv_cache: slot_mapping[", t,
                     "] = ", slots[t], " is out of range [-1, num_blocks * block_size = ",
                     a.num_slots, ")");
  }
  const auto* k_src = data_ptr<const char>(k);
  const auto* v_src = data_ptr<const char>(v);
  auto* k_dst = data_ptr<char>(k_cache);
  auto* v_dst = data_ptr<char>(v_cache);
  const auto row_bytes = static_cast<size_t>(a.row_bytes);
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const int64_t slot = slots[t];
    if (slot < 0) continue;  // -1: padding token, nothing to store
    std::memcpy(k_dst + slot * a.row_bytes, k_src + t * a.k_stride_bytes, row_bytes);
    std::memcpy(v_dst + slot * a.row_bytes, v_src + t * a.v_stride_bytes, row_bytes);
  }
}

}  // namespace mllm_kernel::cpu
