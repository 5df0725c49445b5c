/*!
 * \file kernels/kv_cache/kv_cache.cuh
 * \brief CUDA store_kv_cache: scatter k/v rows into paged caches, on torch's current stream.
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * TVM_FFI_DLL_EXPORT_TYPED_FUNC(store_kv_cache, mllm_kernel::gpu::store_kv_cache).
 *
 * float8 caches: each value is stored as x / scale of its kv head, rounded to nearest with
 * cvt's satfinite (+-inf and finite values beyond 448 become +-448, NaN stays NaN).
 *
 * Out-of-range slots: never written. A slot < -1 or >= num_blocks * block_size is skipped and
 * recorded in `error` (int64 [3]: {flag, token, slot}; the first reporter wins, later ones keep
 * it). The host never reads it here (no sync): the Python wrapper decides when to check.
 */
#ifndef MLLM_KERNEL_KERNELS_KV_CACHE_CUH_
#define MLLM_KERNEL_KERNELS_KV_CACHE_CUH_

#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/row_copy.cuh>
#include <mllm_kernel/utils.cuh>

#include "kv_cache.hpp"

#include <algorithm>
#include <cstdint>

namespace mllm_kernel::gpu {

namespace kv_cache_detail {

// The slot of token t, or -1 to skip the token: padding (-1), or out of range (recorded in
// `error`, never written).
__device__ __forceinline__ int64_t slot_of(const int64_t* __restrict__ slots, int64_t t, int64_t num_slots,
                                           int64_t* error) {
  const int64_t slot = slots[t];
  if (slot < -1 || slot >= num_slots) {
    if (threadIdx.x == 0) device::record_error(error, t, slot);
    return -1;
  }
  return slot;
}

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
    const int64_t slot = slot_of(slots, t, num_slots, error);
    if (slot < 0) continue;
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

// Quantizes each token's k and v rows into float8 caches: element i of a row belongs to kv head
// i / head_dim. Grid-stride over tokens as StoreKVCacheKernel; one element a thread step.
template <typename T>
__global__ void StoreKVCacheFp8Kernel(const T* __restrict__ k, const T* __restrict__ v,
                                      __nv_fp8_storage_t* __restrict__ k_cache, __nv_fp8_storage_t* __restrict__ v_cache,
                                      const int64_t* __restrict__ slots, int64_t num_tokens, int row_elems,
                                      int head_dim, int64_t k_stride, int64_t v_stride, int64_t num_slots,
                                      host::CacheScale k_scale, host::CacheScale v_scale, int64_t* error) {
  device::pdl_wait_primary();
  const auto quantize = [](float x, float s) {  // x / s exactly as the CPU divides
    return __nv_cvt_float_to_fp8(x / s, __NV_SATFINITE, __NV_E4M3);
  };
  const int64_t token_step = device::copy_row_step();
  for (int64_t t = device::first_copy_row(); t < num_tokens; t += token_step) {
    const int64_t slot = slot_of(slots, t, num_slots, error);
    if (slot < 0) continue;
    for (int i = threadIdx.x; i < row_elems; i += blockDim.x) {  // a row (kv_heads * head_dim) fits an int
      const int h = i / head_dim;
      const float ks = k_scale.value * (k_scale.data ? k_scale.data[h * k_scale.stride] : 1.f);
      const float vs = v_scale.value * (v_scale.data ? v_scale.data[h * v_scale.stride] : 1.f);
      k_cache[slot * row_elems + i] = quantize(device::to_float(k[t * k_stride + i]), ks);
      v_cache[slot * row_elems + i] = quantize(device::to_float(v[t * v_stride + i]), vs);
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
                           tvm::ffi::TensorView k_scale, tvm::ffi::TensorView v_scale, double k_scale_value,
                           double v_scale_value, tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a = mllm_kernel::kv_cache::VerifyStoreKVCache<kDLCUDA>(
      k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, k_scale_value, v_scale_value, error);
  if (a.empty()) return;  // a zero-block grid is a launch error
  if (a.fp8) {
    const int64_t elem = host::dtype_bytes(a.dtype);
    const int64_t row_elems = a.row_bytes / elem;
    host::ValueCheck(row_elems < (int64_t{1} << 31), "store_kv_cache: a float8 cache's token row (num_kv_heads * head_dim) ",
                     "must have < 2^31 elements on CUDA, got ", row_elems);
    host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
      const host::RowCopyPlan plan = host::plan_row_copy(a.num_tokens, row_elems);
      host::LaunchKernel(plan.grid, plan.block, a.device)
          .enable_pdl(true)(kv_cache_detail::StoreKVCacheFp8Kernel<T>, data_ptr<const T>(k), data_ptr<const T>(v),
                            data_ptr<__nv_fp8_storage_t>(k_cache), data_ptr<__nv_fp8_storage_t>(v_cache),
                            data_ptr<const int64_t>(slot_mapping), a.num_tokens, static_cast<int>(row_elems), static_cast<int>(a.head_dim),
                            a.k_stride_bytes / elem, a.v_stride_bytes / elem, a.num_slots, a.k_scale, a.v_scale,
                            data_ptr<int64_t>(error));
    });
    return;
  }
  kv_cache_detail::LaunchStoreKVCache(a.device, data_ptr<const char>(k), data_ptr<const char>(v),
                                      data_ptr<char>(k_cache), data_ptr<char>(v_cache),
                                      data_ptr<const int64_t>(slot_mapping), a.num_tokens,
                                      a.row_bytes, a.k_stride_bytes, a.v_stride_bytes, a.num_slots,
                                      data_ptr<int64_t>(error));
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_KV_CACHE_CUH_
