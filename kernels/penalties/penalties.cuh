/*!
 * \file kernels/penalties/penalties.cuh
 * \brief CUDA repetition / frequency / presence penalties, in place on logits, on torch's
 * current stream.
 *
 * One block per (row, vocab slice) pair, in a grid-stride loop (any batch fits one launch):
 *  - from token_ids: the block counts the row's ids that fall in its slice into a shared-memory
 *    histogram (every block reads the whole id list, which stays in L2), then penalizes the
 *    slice's tokens with a nonzero count. Repeated ids become one update, so no two threads write
 *    one logit and nothing needs sorting; slices keep the histogram small for any vocab.
 *  - from counts: the block reads its slice of the counts and penalizes where they are nonzero.
 * Only penalized logits are read and written. The plan depends on the shapes only (CUDA-graph
 * safe).
 *
 * Bad elements are never used: an id >= vocab (ids < 0 are padding) or a negative count is
 * skipped and recorded in `error` (int64 [3]: {flag, flattened index, value}; the first reporter
 * wins). Bad per-row parameters act as their no-op values (RowPenalties::Sanitized).
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * mllm_kernel::gpu::{apply_penalties_ids, apply_penalties_counts} (arguments: penalties.hpp).
 */
#ifndef MLLM_KERNEL_KERNELS_PENALTIES_CUH_
#define MLLM_KERNEL_KERNELS_PENALTIES_CUH_

#include <mllm_kernel/utils.cuh>

#include "penalties.hpp"

#include <algorithm>
#include <cstdint>

namespace mllm_kernel::gpu {

namespace penalties_detail {

using penalties::RowPenalties;

constexpr int kThreads = 256;
// Tokens per block: the id histogram's size (32 KiB of uint32 counts, so several blocks fit an
// SM); counts are streamed, so a slice there is just a block's share of the row.
constexpr int kIdSlice = 8192;
constexpr int kCountSlice = 4096;

/*! \brief The per-row parameters the blocks of `row` use. */
__device__ __forceinline__ RowPenalties LoadRow(const float* repetition, const float* frequency,
                                                const float* presence, int64_t row) {
  return RowPenalties::Sanitized(repetition[row], frequency[row], presence[row]);
}

template <typename T>
__device__ __forceinline__ void Penalize(T* logit, float count, const RowPenalties& p) {
  *logit = device::from_float<T>(p.Apply(device::to_float(*logit), count));
}

template <typename T, typename IdT>
__global__ void __launch_bounds__(kThreads)
    PenaltiesFromIdsKernel(T* __restrict__ logits, const IdT* __restrict__ ids, const float* __restrict__ repetition,
                           const float* __restrict__ frequency, const float* __restrict__ presence, int64_t batch,
                           int64_t vocab, int64_t logits_stride, int64_t num_ids, int64_t ids_stride,
                           int64_t slices, int64_t* error) {
  __shared__ uint32_t count[kIdSlice];
  device::pdl_wait_primary();  // ids and logits may come from the previous kernel
  for (int64_t work = blockIdx.x; work < batch * slices; work += gridDim.x) {
    const int64_t row = work / slices, slice = work % slices;
    const int64_t first = slice * kIdSlice;
    for (int i = threadIdx.x; i < kIdSlice; i += kThreads) count[i] = 0;
    __syncthreads();
    const IdT* row_ids = ids + row * ids_stride;
    for (int64_t j = threadIdx.x; j < num_ids; j += kThreads) {
      const auto id = static_cast<int64_t>(row_ids[j]);
      if (id >= vocab) {
        if (slice == 0) device::record_error(error, row * num_ids + j, id);  // one block reports
      } else if (id >= first && id < first + kIdSlice) {                    // ids < 0 fail here
        atomicAdd(&count[id - first], 1u);
      }
    }
    __syncthreads();
    const RowPenalties p = LoadRow(repetition, frequency, presence, row);
    T* row_logits = logits + row * logits_stride + first;
    const int64_t width = vocab - first < kIdSlice ? vocab - first : kIdSlice;
    for (int i = threadIdx.x; i < width; i += kThreads) {
      if (count[i] != 0) Penalize(row_logits + i, static_cast<float>(count[i]), p);
    }
    __syncthreads();  // the histogram is cleared for the next work item
  }
  device::pdl_launch_dependents();
}

template <typename T, typename C>
__global__ void __launch_bounds__(kThreads)
    PenaltiesFromCountsKernel(T* __restrict__ logits, const C* __restrict__ counts, const float* __restrict__ repetition,
                              const float* __restrict__ frequency, const float* __restrict__ presence,
                              int64_t batch, int64_t vocab, int64_t logits_stride, int64_t counts_stride,
                              int64_t slices, int64_t* error) {
  device::pdl_wait_primary();
  for (int64_t work = blockIdx.x; work < batch * slices; work += gridDim.x) {
    const int64_t row = work / slices;
    const int64_t first = (work % slices) * kCountSlice;
    const int64_t last = first + kCountSlice < vocab ? first + kCountSlice : vocab;
    const C* row_counts = counts + row * counts_stride;
    T* row_logits = logits + row * logits_stride;
    const RowPenalties p = LoadRow(repetition, frequency, presence, row);
    for (int64_t v = first + threadIdx.x; v < last; v += kThreads) {
      const int64_t c = penalties::CountOf(row_counts + v);
      if (c == 0) continue;
      if (c < 0) {
        device::record_error(error, row * vocab + v, c);
        continue;
      }
      Penalize(row_logits + v, static_cast<float>(c), p);
    }
  }
  device::pdl_launch_dependents();
}

/*! \brief Enough blocks to fill the GPU several times over; the kernels loop over the rest. */
inline int64_t GridFor(const penalties::PenaltyArgs& a, int64_t slices) {
  const int64_t cap = static_cast<int64_t>(host::MultiProcessorCount(a.device.device_id)) * 32;
  return std::min(a.batch * slices, cap);
}

}  // namespace penalties_detail

/*! \brief Penalize logits in place for the tokens of token_ids (arguments: penalties.hpp). Asynchronous. */
inline void apply_penalties_ids(tvm::ffi::TensorView logits, tvm::ffi::TensorView token_ids,
                                tvm::ffi::TensorView repetition, tvm::ffi::TensorView frequency,
                                tvm::ffi::TensorView presence, tvm::ffi::TensorView error) {
  using host::data_ptr;
  using namespace penalties_detail;  // NOLINT(*)
  const auto a = penalties::VerifyPenaltiesIds<kDLCUDA>(logits, token_ids, repetition, frequency, presence, error);
  if (a.batch == 0 || a.source_len == 0) return;  // no ids (and a zero-block grid is a launch error)
  // vocab 0 still launches one slice: every id >= 0 is then recorded as out of range.
  const int64_t slices = std::max<int64_t>(1, host::div_ceil(a.vocab, int64_t{kIdSlice}));
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    host::DispatchIndex(a.source_dtype, [&]<typename IdT>() {
      host::LaunchKernel(GridFor(a, slices), kThreads, a.device)
          .enable_pdl(true)(PenaltiesFromIdsKernel<T, IdT>, data_ptr<T>(logits), data_ptr<const IdT>(token_ids),
                            data_ptr<const float>(repetition), data_ptr<const float>(frequency),
                            data_ptr<const float>(presence), a.batch, a.vocab, a.logits_stride, a.source_len,
                            a.source_stride, slices, data_ptr<int64_t>(error));
    });
  });
}

/*! \brief Penalize logits in place by counts or a bool mask (arguments: penalties.hpp). Asynchronous. */
inline void apply_penalties_counts(tvm::ffi::TensorView logits, tvm::ffi::TensorView counts,
                                   tvm::ffi::TensorView repetition, tvm::ffi::TensorView frequency,
                                   tvm::ffi::TensorView presence, tvm::ffi::TensorView error) {
  using host::data_ptr;
  using namespace penalties_detail;  // NOLINT(*)
  const auto a = penalties::VerifyPenaltiesCounts<kDLCUDA>(logits, counts, repetition, frequency, presence, error);
  if (a.empty()) return;
  const int64_t slices = host::div_ceil(a.vocab, int64_t{kCountSlice});
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    penalties::DispatchCount(a.source_dtype, [&]<typename C>() {
      host::LaunchKernel(GridFor(a, slices), kThreads, a.device)
          .enable_pdl(true)(PenaltiesFromCountsKernel<T, C>, data_ptr<T>(logits), data_ptr<const C>(counts),
                            data_ptr<const float>(repetition), data_ptr<const float>(frequency),
                            data_ptr<const float>(presence), a.batch, a.vocab, a.logits_stride, a.source_stride,
                            slices, data_ptr<int64_t>(error));
    });
  });
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_PENALTIES_CUH_
