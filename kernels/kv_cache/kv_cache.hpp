/*!
 * \file kernels/kv_cache/kv_cache.hpp
 * \brief The argument contract of store_kv_cache, shared by the CPU (kv_cache.cpp) and CUDA
 * (kv_cache.cuh) entry points, which take the same arguments.
 *
 * k, v: [T, KH, D], any token stride, heads and dims contiguous; k_cache, v_cache:
 * [num_blocks, block_size, KH, D], contiguous; all float32/float16/bfloat16 of one dtype, or
 * both caches float8_e4m3fn (then a value x is stored as x / scale, rounded to nearest, +-448 at
 * most, NaN kept; scales: k_scale, v_scale float32 [KH], [1] or [0] with k_scale_value,
 * v_scale_value, mllm_kernel/cache_scale.hpp); slot_mapping: int64 [T]; error: int64 [3], the device-error record {flag, token, slot} that
 * CUDA fills for an out-of-range slot. All on one device. k_cache and v_cache (written) share no
 * memory with each other or with k, v and slot_mapping (mllm_kernel/overlap.hpp).
 */
#ifndef MLLM_KERNEL_KERNELS_KV_CACHE_HPP_
#define MLLM_KERNEL_KERNELS_KV_CACHE_HPP_

#include <mllm_kernel/cache_scale.hpp>
#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace mllm_kernel::kv_cache {

/*! \brief A verified call. Rows (KH * D elements a token and a slot) of a cache of k's dtype are
 * copied as bytes; into a float8 cache they are quantized. */
struct StoreKVCacheArgs {
  DLDevice device;
  DLDataType dtype;  // k's and v's
  int64_t num_tokens, num_slots, row_bytes, k_stride_bytes, v_stride_bytes;  // bytes of k and v
  int64_t num_kv_heads, head_dim;
  bool fp8 = false;  // the caches are float8_e4m3fn
  host::CacheScale k_scale, v_scale;
  bool empty() const { return num_tokens == 0 || row_bytes == 0; }
};

template <DLDeviceType kDev>
StoreKVCacheArgs VerifyStoreKVCache(tvm::ffi::TensorView k, tvm::ffi::TensorView v,
                                    tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
                                    tvm::ffi::TensorView slot_mapping, tvm::ffi::TensorView k_scale,
                                    tvm::ffi::TensorView v_scale, double k_scale_value, double v_scale_value,
                                    tvm::ffi::TensorView error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize T{"num_tokens"}, KH{"num_kv_heads"}, D{"head_dim"}, KS{"k_token_stride"},
      VS{"v_token_stride"}, NB{"num_blocks"}, BS{"block_size"};
  SymbolicDType dtype, cache_dtype;
  SymbolicDevice device{"device"};
  TensorMatcher({T, KH, D})
      .for_op("store_kv_cache")
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDev>(device)
      .with_strides({KS, D, 1})
      .verify(k, "k");
  TensorMatcher({T, KH, D})
      .for_op("store_kv_cache")
      .with_dtype(dtype)
      .with_device(device)
      .with_strides({VS, D, 1})
      .verify(v, "v");
  TensorMatcher({NB, BS, KH, D})
      .for_op("store_kv_cache")
      .with_dtype<float, float16_tag, bfloat16_tag, float8_e4m3fn_tag>(cache_dtype)
      .with_device(device)
      .verify(k_cache, "k_cache")
      .verify(v_cache, "v_cache");
  const bool fp8 = cache_dtype.unwrap() == kDType<float8_e4m3fn_tag>;
  TypeCheck(fp8 || cache_dtype.unwrap() == dtype.unwrap(), "store_kv_cache: k_cache and v_cache must have k's dtype (",
             DTypeName(dtype.unwrap()), ") or be float8_e4m3fn, got ", DTypeName(cache_dtype.unwrap()));
  const CacheScale ks = VerifyCacheScale<kDev>("store_kv_cache", "k_scale", k_scale, k_scale_value, device,
                                               KH.unwrap(), fp8);
  const CacheScale vs = VerifyCacheScale<kDev>("store_kv_cache", "v_scale", v_scale, v_scale_value, device,
                                               KH.unwrap(), fp8);
  TensorMatcher({T}).for_op("store_kv_cache").with_dtype<int64_t>().with_device(device).verify(
      slot_mapping, "slot_mapping");
  // The CPU ignores the error record: it checks every slot on the host and raises at once.
  if constexpr (kDev == kDLCUDA) {
    TensorMatcher({3}).for_op("store_kv_cache").with_dtype<int64_t>().with_device(device).verify(
        error, "error");
  }
  CheckNoAliasing("store_kv_cache", {{k_cache, "k_cache"}, {v_cache, "v_cache"}},
                  {{k, "k"}, {v, "v"}, {slot_mapping, "slot_mapping"}, {k_scale, "k_scale"}, {v_scale, "v_scale"}});
  const int64_t elem = dtype_bytes(dtype.unwrap());
  StoreKVCacheArgs a{};
  a.device = device.unwrap();
  a.dtype = dtype.unwrap();
  a.num_tokens = T.unwrap();
  a.num_slots = NB.unwrap() * BS.unwrap();
  a.row_bytes = KH.unwrap() * D.unwrap() * elem;
  a.k_stride_bytes = KS.unwrap() * elem;
  a.v_stride_bytes = VS.unwrap() * elem;
  a.num_kv_heads = KH.unwrap();
  a.head_dim = D.unwrap();
  a.fp8 = fp8;
  a.k_scale = ks;
  a.v_scale = vs;
  return a;
}

}  // namespace mllm_kernel::kv_cache

#endif  // MLLM_KERNEL_KERNELS_KV_CACHE_HPP_
