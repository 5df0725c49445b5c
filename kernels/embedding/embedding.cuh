/*!
 * \file kernels/embedding/embedding.cuh
 * \brief CUDA embedding lookup: out[i] = table[ids[i]], on torch's current stream.
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * TVM_FFI_DLL_EXPORT_TYPED_FUNC(embedding, mllm_kernel::gpu::embedding).
 *
 * Out-of-range ids: never read. The row of an id < 0 or >= vocab is written with zeros and
 * recorded in `error` (int64 [3]: {flag, flattened position, id}; the first reporter wins,
 * later ones keep it). The host never reads it here (no sync): the Python wrapper does.
 */
#ifndef MLLM_KERNEL_KERNELS_EMBEDDING_CUH_
#define MLLM_KERNEL_KERNELS_EMBEDDING_CUH_

#include <mllm_kernel/row_copy.cuh>
#include <mllm_kernel/utils.cuh>

#include "embedding.hpp"

#include <algorithm>
#include <cstdint>

namespace mllm_kernel::gpu {

namespace embedding_detail {

// Copies rows in units U (mllm_kernel/row_copy.cuh). Sizes/strides in units of U.
template <typename U, typename IdT>
__global__ void EmbeddingKernel(U* __restrict__ out, const U* __restrict__ table,
                                const IdT* __restrict__ ids, int64_t n, int64_t vocab,
                                int64_t row_units, int64_t table_stride, int64_t* error) {
  device::pdl_wait_primary();  // ids may come from the previous kernel
  const int64_t row_step = device::copy_row_step();
  for (int64_t r = device::first_copy_row(); r < n; r += row_step) {
    const auto id = static_cast<int64_t>(ids[r]);
    U* dst = out + r * row_units;
    if (id < 0 || id >= vocab) {
      if (threadIdx.x == 0) device::record_error(error, r, id);
      const U zero{};  // value-initialized: all bytes 0
      for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) dst[i] = zero;
      continue;
    }
    const U* src = table + id * table_stride;
    for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) dst[i] = src[i];
  }
  device::pdl_launch_dependents();
}

template <typename IdT>
void DispatchUnit(DLDevice device, void* out, const void* table, const IdT* ids, int64_t n,
                  int64_t vocab, int64_t row_bytes, int64_t table_stride_bytes, int64_t* error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  const uintptr_t alignment = copy_alignment(out, table, row_bytes, table_stride_bytes);
  dispatch_copy_unit(alignment, [&]<typename U>() {
    constexpr int64_t kU = sizeof(U);
    const RowCopyPlan plan = plan_row_copy(n, row_bytes / kU);
    LaunchKernel(plan.grid, plan.block, device)
        .enable_pdl(true)(EmbeddingKernel<U, IdT>, static_cast<U*>(out), static_cast<const U*>(table),
                          ids, n, vocab, row_bytes / kU, table_stride_bytes / kU, error);
  });
}

}  // namespace embedding_detail

/*!
 * \brief out [N, H] = table [vocab, H] rows picked by ids [N] (arguments: embedding.hpp).
 * Asynchronous: no host sync.
 */
inline void embedding(tvm::ffi::TensorView out, tvm::ffi::TensorView ids, tvm::ffi::TensorView table,
                      tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a = mllm_kernel::embedding::VerifyEmbedding<kDLCUDA>(out, ids, table, error);
  if (a.empty()) return;  // a zero-block grid is a launch error
  host::DispatchIndex(a.id_dtype, [&]<typename IdT>() {
    embedding_detail::DispatchUnit(a.device, data_ptr<char>(out), data_ptr<const char>(table),
                                   data_ptr<const IdT>(ids), a.num_ids, a.vocab, a.row_bytes,
                                   a.table_stride_bytes, data_ptr<int64_t>(error));
  });
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_EMBEDDING_CUH_
