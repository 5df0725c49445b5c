/*!
 * \file kernels/kv_cache/kv_cache.cpp
 * \brief CPU store_kv_cache: scatter k/v rows into paged caches (one memcpy per row), or
 * quantize them into float8 caches.
 *
 * A copy, so no Highway body: memcpy is already vectorized by the C library; the float8 path is
 * scalar (one conversion per element, as CUDA's; a decode step stores one token per request).
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * TVM_FFI_DLL_EXPORT_TYPED_FUNC(store_kv_cache, mllm_kernel::cpu::store_kv_cache).
 */
#include "kv_cache.hpp"

#include <hwy/base.h>
#include <mllm_kernel/cpu/float8.hpp>
#include <mllm_kernel/dispatch.hpp>

#include <cstdint>
#include <cstring>

namespace mllm_kernel::cpu {

namespace kv_cache_detail {

inline float ToFloat(float x) { return x; }
inline float ToFloat(hwy::float16_t x) { return hwy::F32FromF16(x); }
inline float ToFloat(hwy::bfloat16_t x) { return hwy::F32FromBF16(x); }

// dst[h * head_dim + i] = e4m3(src[h * head_dim + i] / scale of kv head h), for one token's row.
template <typename T>
void QuantizeRow(float8_e4m3fn_t* dst, const T* src, const host::CacheScale& scale, int64_t num_kv_heads,
                 int64_t head_dim) {
  for (int64_t h = 0; h < num_kv_heads; ++h) {
    const float s = scale.value * (scale.data != nullptr ? scale.data[h * scale.stride] : 1.f);
    for (int64_t i = h * head_dim; i < (h + 1) * head_dim; ++i) dst[i] = FloatToE4M3(ToFloat(src[i]) / s);
  }
}

}  // namespace kv_cache_detail

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
                           tvm::ffi::TensorView k_scale, tvm::ffi::TensorView v_scale, double k_scale_value,
                           double v_scale_value, tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a = mllm_kernel::kv_cache::VerifyStoreKVCache<kDLCPU>(
      k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, k_scale_value, v_scale_value, error);
  const int64_t* slots = data_ptr<const int64_t>(slot_mapping);
  // Validate first, so a bad slot leaves both caches untouched.
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    host::ValueCheck(slots[t] >= -1 && slots[t] < a.num_slots, "store_kv_cache: slot_mapping[", t,
                     "] = ", slots[t], " is out of range [-1, num_blocks * block_size = ",
                     a.num_slots, ")");
  }
  if (a.fp8) {
    const int64_t row = a.num_kv_heads * a.head_dim;
    host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
      const int64_t k_stride = a.k_stride_bytes / static_cast<int64_t>(sizeof(T));
      const int64_t v_stride = a.v_stride_bytes / static_cast<int64_t>(sizeof(T));
      for (int64_t t = 0; t < a.num_tokens; ++t) {
        const int64_t slot = slots[t];
        if (slot < 0) continue;
        kv_cache_detail::QuantizeRow(data_ptr<float8_e4m3fn_t>(k_cache) + slot * row, data_ptr<const T>(k) + t * k_stride,
                                     a.k_scale, a.num_kv_heads, a.head_dim);
        kv_cache_detail::QuantizeRow(data_ptr<float8_e4m3fn_t>(v_cache) + slot * row, data_ptr<const T>(v) + t * v_stride,
                                     a.v_scale, a.num_kv_heads, a.head_dim);
      }
    });
    return;
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
