/*!
 * \file kernels/kv_cache/kv_cache.hpp
 * \brief The argument contract of store_kv_cache, shared by the CPU (kv_cache.cpp) and CUDA
 * (kv_cache.cuh) entry points, which take the same arguments.
 *
 * k, v: [T, KH, D], any token stride, heads and dims contiguous; k_cache, v_cache:
 * [num_blocks, block_size, KH, D], contiguous; all float32/float16/bfloat16 of one dtype;
 * slot_mapping: int64 [T]; error: int64 [3], the device-error record {flag, token, slot} that
 * CUDA fills for an out-of-range slot. All on one device. k_cache and v_cache (written) share no
 * memory with each other or with k, v and slot_mapping (mllm_kernel/overlap.hpp).
 */
#ifndef MLLM_KERNEL_KERNELS_KV_CACHE_HPP_
#define MLLM_KERNEL_KERNELS_KV_CACHE_HPP_

#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace mllm_kernel::kv_cache {

/*! \brief A verified call; rows (KH * D elements a token and a slot) are copied as bytes. */
struct StoreKVCacheArgs {
  DLDevice device;
  int64_t num_tokens, num_slots, row_bytes, k_stride_bytes, v_stride_bytes;
  bool empty() const { return num_tokens == 0 || row_bytes == 0; }
};

template <DLDeviceType kDev>
StoreKVCacheArgs VerifyStoreKVCache(tvm::ffi::TensorView k, tvm::ffi::TensorView v,
                                    tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
                                    tvm::ffi::TensorView slot_mapping, tvm::ffi::TensorView error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize T{"num_tokens"}, KH{"num_kv_heads"}, D{"head_dim"}, KS{"k_token_stride"},
      VS{"v_token_stride"}, NB{"num_blocks"}, BS{"block_size"};
  SymbolicDType dtype;
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
      .with_dtype(dtype)
      .with_device(device)
      .verify(k_cache, "k_cache")
      .verify(v_cache, "v_cache");
  TensorMatcher({T}).for_op("store_kv_cache").with_dtype<int64_t>().with_device(device).verify(
      slot_mapping, "slot_mapping");
  // The CPU ignores the error record: it checks every slot on the host and raises at once.
  if constexpr (kDev == kDLCUDA) {
    TensorMatcher({3}).for_op("store_kv_cache").with_dtype<int64_t>().with_device(device).verify(
        error, "error");
  }
  CheckNoAliasing("store_kv_cache", {{k_cache, "k_cache"}, {v_cache, "v_cache"}},
                  {{k, "k"}, {v, "v"}, {slot_mapping, "slot_mapping"}});
  const int64_t elem = dtype_bytes(dtype.unwrap());
  return {device.unwrap(), T.unwrap(), NB.unwrap() * BS.unwrap(), KH.unwrap() * D.unwrap() * elem,
          KS.unwrap() * elem, VS.unwrap() * elem};
}

}  // namespace mllm_kernel::kv_cache

#endif  // MLLM_KERNEL_KERNELS_KV_CACHE_HPP_
