/*!
 * \file kernels/rope/rope.cuh
 * \brief CUDA rotary position embedding (RoPE), in place on q and k, on torch's current stream.
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * TVM_FFI_DLL_EXPORT_TYPED_FUNC(apply_rope, mllm_kernel::gpu::apply_rope).
 *
 * Out-of-range positions: the kernel never reads the cache out of bounds. A token whose
 * position is < 0 or >= max_pos is left untouched and recorded in `error` (int64 [3]:
 * {flag, token, position}; the first reporter wins, later ones keep it). The host never reads
 * it here (no sync): the Python wrapper decides when to check.
 */
#ifndef MLLM_KERNEL_KERNELS_ROPE_CUH_
#define MLLM_KERNEL_KERNELS_ROPE_CUH_

#include <mllm_kernel/utils.cuh>

#include "rope.hpp"

#include <algorithm>
#include <cstdint>

namespace mllm_kernel::gpu {

namespace rope_detail {

// kN elements at p: one aligned 16-byte access when kVec, element by element otherwise.
template <bool kVec, typename V, typename T>
__device__ __forceinline__ void LoadElems(V& v, const T* p) {
  if constexpr (kVec) {
    v.load(p);
  } else {
#pragma unroll
    for (int j = 0; j < V::kSize; ++j) v[j] = p[j];
  }
}
template <bool kVec, typename V, typename T>
__device__ __forceinline__ void StoreElems(const V& v, T* p) {
  if constexpr (kVec) {
    v.store(p);
  } else {
#pragma unroll
    for (int j = 0; j < V::kSize; ++j) p[j] = v[j];
  }
}

// One block per token (grid-stride over tokens); its threads stride over (head, unit) items.
// A unit is kN elements: NeoX takes kN from each half (kN pairs), GPT-J kN consecutive
// elements (kN / 2 pairs). kVec: 16-byte accesses (host checked alignment and divisibility).
template <typename T, bool kNeox, bool kVec>
__global__ void RopeKernel(T* q, T* k, const int64_t* __restrict__ positions,
                          const float* __restrict__ cache, int64_t num_tokens, int64_t num_heads,
                          int64_t num_kv_heads, int64_t head_dim, int64_t rot_dim,
                          int64_t q_stride, int64_t k_stride, int64_t max_pos, int64_t* error) {
  constexpr int kN = kVec ? device::kVecSize<T> : (kNeox ? 1 : 2);
  using V = device::AlignedVector<T, kN>;
  device::pdl_wait_primary();  // q, k, positions may come from the previous kernel
  const int64_t half = rot_dim / 2;
  const int64_t units = (kNeox ? half : rot_dim) / kN;
  const int64_t items = (num_heads + num_kv_heads) * units;
  for (int64_t t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    // The position is checked after the token's q/k loads are issued: they do not depend on it,
    // so a few-token call waits for one load latency before the cache reads, not two.
    const int64_t pos = positions[t];
    for (int64_t item = threadIdx.x; item < items; item += blockDim.x) {
      const int64_t head = item / units;
      const int64_t i0 = (item % units) * kN;
      T* x = head < num_heads ? q + t * q_stride + head * head_dim
                              : k + t * k_stride + (head - num_heads) * head_dim;
      V a, b;
      LoadElems<kVec>(a, x + i0);
      if constexpr (kNeox) LoadElems<kVec>(b, x + half + i0);
      if (pos < 0 || pos >= max_pos) break;  // the same for every item: recorded below
      const float* cos = cache + pos * rot_dim;
      const float* sin = cos + half;
      if constexpr (kNeox) {
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          const float c = __ldg(cos + i0 + j), s = __ldg(sin + i0 + j);
          const float x1 = device::to_float(a[j]), x2 = device::to_float(b[j]);
          a[j] = device::from_float<T>(x1 * c - x2 * s);
          b[j] = device::from_float<T>(x2 * c + x1 * s);
        }
        StoreElems<kVec>(a, x + i0);
        StoreElems<kVec>(b, x + half + i0);
      } else {
#pragma unroll
        for (int j = 0; j < kN; j += 2) {
          const int64_t p = (i0 + j) / 2;
          const float c = __ldg(cos + p), s = __ldg(sin + p);
          const float x1 = device::to_float(a[j]), x2 = device::to_float(a[j + 1]);
          a[j] = device::from_float<T>(x1 * c - x2 * s);
          a[j + 1] = device::from_float<T>(x2 * c + x1 * s);
        }
        StoreElems<kVec>(a, x + i0);
      }
    }
    if ((pos < 0 || pos >= max_pos) && threadIdx.x == 0) device::record_error(error, t, pos);
  }
  device::pdl_launch_dependents();
}

template <typename T>
void LaunchRope(DLDevice device, T* q, T* k, const int64_t* positions, const float* cache,
                int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                int64_t rot_dim, int64_t q_stride, int64_t k_stride, int64_t max_pos,
                int64_t* error, bool is_neox) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  constexpr int64_t kV = device::kVecSize<T>;
  // 16-byte accesses need aligned bases and every row/head/unit start on a vector boundary.
  const bool vec = device::is_aligned<16>(q) && device::is_aligned<16>(k) && q_stride % kV == 0 &&
                   k_stride % kV == 0 && head_dim % kV == 0 &&
                   (is_neox ? (rot_dim / 2) % kV == 0 : rot_dim % kV == 0);
  const int64_t elems_per_unit = vec ? kV : (is_neox ? 1 : 2);
  const int64_t units = (is_neox ? rot_dim / 2 : rot_dim) / elems_per_unit;
  const int64_t items = (num_heads + num_kv_heads) * units;
  // Up to 512 threads: a decode step's token (e.g. 40 heads of 8 vectors) is one item a thread.
  constexpr int64_t kMaxThreads = 512;
  constexpr int64_t kMaxBlocks = 1 << 20;  // grid-stride loop covers more tokens
  const auto threads = static_cast<unsigned>(
      std::clamp<int64_t>(div_ceil(items, device::kWarpThreads) * device::kWarpThreads,
                          device::kWarpThreads, kMaxThreads));
  const auto blocks = static_cast<unsigned>(std::min(num_tokens, kMaxBlocks));
  auto kernel = RopeKernel<T, true, false>;
  if (is_neox) {
    kernel = vec ? RopeKernel<T, true, true> : RopeKernel<T, true, false>;
  } else {
    kernel = vec ? RopeKernel<T, false, true> : RopeKernel<T, false, false>;
  }
  LaunchKernel(dim3(blocks), dim3(threads), device)
      .enable_pdl(true)(kernel, q, k, positions, cache, num_tokens, num_heads, num_kv_heads,
                        head_dim, rot_dim, q_stride, k_stride, max_pos, error);
}

}  // namespace rope_detail

/*!
 * \brief Rotate the first rot_dim dims of each head of q [T, H, D] and k [T, KH, D] in place
 * (arguments: rope.hpp; error: see the file comment). Asynchronous: no host sync.
 */
inline void apply_rope(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView positions,
                       tvm::ffi::TensorView cos_sin_cache, bool is_neox, tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a =
      mllm_kernel::rope::VerifyApplyRope<kDLCUDA>(q, k, positions, cos_sin_cache, error);
  if (a.empty()) return;  // a zero-block grid is an error
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    rope_detail::LaunchRope(a.device, data_ptr<T>(q), data_ptr<T>(k),
                            data_ptr<const int64_t>(positions), data_ptr<const float>(cos_sin_cache),
                            a.num_tokens, a.num_heads, a.num_kv_heads, a.head_dim, a.rot_dim,
                            a.q_stride, a.k_stride, a.max_pos, data_ptr<int64_t>(error), is_neox);
  });
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_ROPE_CUH_
