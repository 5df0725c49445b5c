/*!
 * \file kernels/kv_cache/kv_cache.cuh
 * \brief CUDA store_kv_cache: scatter k/v rows into paged caches, on torch's current stream.
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * TVM_FFI_DLL_EXPORT_TYPED_FUNC(store_kv_cache, mllm_kernel::gpu::store_kv_cache).
 *
 * Out-of-range slots: never written. A slot < -1 or >= num_blocks * block_size is skipped and
 * recorded in `error` (int64 [3]: {flag, token, slot}; the first reporter wins, later ones keep
 * it). The host never reads it here (no sync): the Python wrapper decides when to check.
 */
#ifndef MLLM_KERNEL_KERNELS_KV_CACHE_CUH_
#define MLLM_KERNEL_KERNELS_KV_CACHE_CUH_

#include <mllm_kernel/row_copy.cuh>
#include <mllm_kernel/utils.cuh>

#include "kv_cache.hpp"

#include <algorithm>
#include <cstdint>

namespace mllm_kernel::gpu {

namespace kv_cache_detail {

// Copies each token's k and v rows in units U (mllm_kernel/row_copy.cuh). Strides and row
// sizes are in units of U. Grid-stride over tokens; 64-bit index math throughout.
template <typename U>
__global__ void StoreKVCacheKernel(const U* __restrict__ k, const U* __restrict__ v,
                                   U* __restrict__ k_cache, U* __restrict__ v_cache,
                                   const int64_t* __restrict__ slots, int64_t num_tokens,
                                   int64_t row_units, int64_t k_stride, int64_t v_stride,
                                   int64_t num_slots, int64_t* error) {
  device::pdl_wait_primary();  // k, v, slot_mapping may come from the previous kernel
  const int64_t token_step = device::copy_row_step();
  for (int64_t t = device::first_copy_row(); t < num_tokens; t += token_step) {
    const int64_t slot = slots[t];
    if (slot == -1) continue;  // padding token
    if (slot < -1 || slot >= num_slots) {
      if (threadIdx.x == 0) device::record_error(error, t, slot);
      continue;
    }
    const U* k_row = k + t * k_stride;
    const U* v_row = v + t * v_stride;
    U* kc_row = k_cache + slot * row_units;
    U* vc_row = v_cache + slot * row_units;
    for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) {
      kc_row[i] = k_row[i];
      vc_row[i] = v_row[i];
    }
  }
  device::pdl_launch_dependents();
}

// Launches StoreKVCacheKernel in the widest copy unit that divides every address, stride and
// the row size (sizes and strides in bytes).
inline void LaunchStoreKVCache(DLDevice device, const void* k, const void* v, void* k_cache,
                               void* v_cache, const int64_t* slots, int64_t num_tokens,
                               int64_t row_bytes, int64_t k_stride_bytes, int64_t v_stride_bytes,
                               int64_t num_slots, int64_t* error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  const uintptr_t alignment =
      copy_alignment(k, v, k_cache, v_cache, row_bytes, k_stride_bytes, v_stride_bytes);
  dispatch_copy_unit(alignment, [&]<typename U>() {
    constexpr int64_t kU = sizeof(U);
    const RowCopyPlan plan = plan_row_copy(num_tokens, row_bytes / kU);
    LaunchKernel(plan.grid, plan.block, device)
        .enable_pdl(true)(StoreKVCacheKernel<U>, static_cast<const U*>(k), static_cast<const U*>(v),
                          static_cast<U*>(k_cache), static_cast<U*>(v_cache), slots, num_tokens,
                          row_bytes / kU, k_stride_bytes / kU, v_stride_bytes / kU, num_slots,
                          error);
  });
}

}  // namespace kv_cache_detail

/*!
 * \brief k_cache/v_cache [num_blocks, block_size, KH, D] at flat slot slot_mapping[t] = k/v[t]
 * (arguments: kv_cache.hpp). slot -1 skips the token. Asynchronous: no host sync.
 */
inline void store_kv_cache(tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView k_cache,
                           tvm::ffi::TensorView v_cache, tvm::ffi::TensorView slot_mapping,
                           tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a = mllm_kernel::kv_cache::VerifyStoreKVCache<kDLCUDA>(k, v, k_cache, v_cache,
                                                                    slot_mapping, error);
  if (a.empty()) return;  // a zero-block grid is a launch error
  kv_cache_detail::LaunchStoreKVCache(a.device, data_ptr<const char>(k), data_ptr<const char>(v),
                                      data_ptr<char>(k_cache), data_ptr<char>(v_cache),
                                      data_ptr<const int64_t>(slot_mapping), a.num_tokens,
                                      a.row_bytes, a.k_stride_bytes, a.v_stride_bytes, a.num_slots,
                                      data_ptr<int64_t>(error));
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_KV_CACHE_CUH_
