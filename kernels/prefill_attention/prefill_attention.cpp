/*!
 * \file kernels/prefill_attention/prefill_attention.cpp
 * \brief CPU prefill attention over ragged K/V and over the paged KV cache (float32, float16,
 *        bfloat16), vectorized with Highway dynamic dispatch; float32 accumulation.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::prefill_attention and mllm_kernel::cpu::paged_prefill_attention (contract:
 * prefill_attention.hpp). The CPU checks every length, block id and the mask's size before it
 * writes anything and raises on a bad one (the CUDA plan's workspace and the error record are
 * taken for the common signature and ignored).
 */
#include "prefill_attention.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "prefill_attention-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "prefill_attention-inl.h"
#include "mllm_kernel/cpu/parallel.hpp"

#if HWY_ONCE
namespace mllm_kernel::cpu {

namespace prefill_attention_detail {

using mllm_kernel::prefill_attention::PrefillArgs;

// Prefix sums `cu` [batch + 1]: start at 0, never decrease, end at `total`.
inline void CheckPrefixSums(const char* op, const char* name, const int32_t* cu, int64_t batch, int64_t total,
                            const char* total_name) {
  host::ValueCheck(cu[0] == 0, op, ": ", name, "[0] must be 0, got ", cu[0]);
  for (int64_t i = 1; i <= batch; ++i) {
    host::ValueCheck(cu[i] >= cu[i - 1], op, ": ", name, "[", i, "] = ", cu[i], " is less than ", name, "[", i - 1,
                     "] = ", cu[i - 1], " (prefix sums must not decrease)");
  }
  host::ValueCheck(cu[batch] == total, op, ": ", name, "[", batch, "] = ", cu[batch], " must equal ", total_name,
                   " = ", total);
}

// Runs the items (request, kv head, query block) on num_threads workers (0 or 1: the caller).
template <typename T>
void Run(const Problem& pr, T* out, float* lse, const T* q, const T* k, const T* v, int64_t num_threads) {
  const PrefillArgs& a = pr.args;
  std::vector<int64_t> blocks;  // request << 32 | first query of a block of QueriesPerItem
  const int64_t per_item = QueriesPerItem(static_cast<size_t>(a.group()));
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t j = 0; j < pr.requests[b].len_q; j += per_item) blocks.push_back(b << 32 | j);
  }
  const int64_t num_items = static_cast<int64_t>(blocks.size()) * a.num_kv_heads;
  if (num_items == 0) return;
  const int64_t workers = std::max<int64_t>(1, std::min(num_threads, num_items));
  const size_t per_worker = ScratchFloats(static_cast<size_t>(a.group()), static_cast<size_t>(a.head_dim));
  std::vector<float> scratch(per_worker * static_cast<size_t>(workers));
  HWY_EXPORT_T(Table, prefill_attention_detail::AttendItems<T>);
  std::atomic<int64_t> next{0};
  // Validation is done, so nothing below throws inside a worker.
  RunWorkers(workers, [&](int64_t worker) {
    HWY_DYNAMIC_DISPATCH_T(Table)(out, lse, q, k, v, pr, blocks.data(), num_items, &next,
                                  scratch.data() + per_worker * static_cast<size_t>(worker));
  });
}

}  // namespace prefill_attention_detail

/*!
 * \brief out [TQ, H, D], lse [TQ, H] = attention of a ragged batch over ragged K/V (arguments and
 * masking: prefill_attention.hpp). Bad prefix sums raise ValueError before anything is written.
 */
inline void prefill_attention(tvm::ffi::TensorView out, tvm::ffi::TensorView lse, tvm::ffi::TensorView q,
                              tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView cu_seqlens_q,
                              tvm::ffi::TensorView cu_seqlens_k, tvm::ffi::TensorView workspace, double scale,
                              bool causal, int64_t sliding_window, double soft_cap, int64_t num_threads,
                              tvm::ffi::TensorView error) {
  namespace d = prefill_attention_detail;
  using host::data_ptr;
  (void)workspace;
  constexpr const char* kOp = "prefill_attention";
  const auto a = mllm_kernel::prefill_attention::VerifyPrefill<kDLCPU>(out, lse, q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                                       scale, causal, sliding_window, soft_cap, error);
  mllm_kernel::prefill_attention::VerifyNumThreads(kOp, num_threads);
  const auto* cq = data_ptr<const int32_t>(cu_seqlens_q);
  const auto* ck = data_ptr<const int32_t>(cu_seqlens_k);
  d::CheckPrefixSums(kOp, "cu_seqlens_q", cq, a.batch, a.total_q, "total_q (q.shape[0])");
  d::CheckPrefixSums(kOp, "cu_seqlens_k", ck, a.batch, a.total_k, "total_k (k.shape[0])");
  if (a.empty()) return;
  std::vector<d::RequestRows> requests(static_cast<size_t>(a.batch));
  for (int64_t b = 0; b < a.batch; ++b) {
    requests[b] = {cq[b], cq[b + 1] - cq[b], ck[b + 1] - ck[b], ck[b], nullptr, 0};
  }
  const d::Problem pr{requests.data(), nullptr, a};
  host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
    d::Run<T>(pr, data_ptr<T>(out), data_ptr<float>(lse), data_ptr<const T>(q), data_ptr<const T>(k),
              data_ptr<const T>(v), num_threads);
  });
}

/*!
 * \brief out [TQ, H, D], lse [TQ, H] = attention of a ragged batch over the paged cache
 * (arguments and masking: prefill_attention.hpp). A bad prefix sum, seq_len, block id among the
 * blocks a request reads, or a custom_mask of the wrong size raises ValueError before anything
 * is written.
 */
inline void paged_prefill_attention(tvm::ffi::TensorView out, tvm::ffi::TensorView lse, tvm::ffi::TensorView q,
                                    tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
                                    tvm::ffi::TensorView block_table, tvm::ffi::TensorView cu_seqlens_q,
                                    tvm::ffi::TensorView seq_lens, tvm::ffi::TensorView custom_mask,
                                    tvm::ffi::TensorView workspace, double scale, bool causal,
                                    int64_t sliding_window, double soft_cap, int64_t num_threads,
                                    tvm::ffi::TensorView error) {
  namespace d = prefill_attention_detail;
  using host::data_ptr;
  (void)workspace;
  constexpr const char* kOp = "paged_prefill_attention";
  const auto a = mllm_kernel::prefill_attention::VerifyPagedPrefill<kDLCPU>(
      out, lse, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, custom_mask, scale, causal, sliding_window,
      soft_cap, error);
  mllm_kernel::prefill_attention::VerifyNumThreads(kOp, num_threads);
  const auto* cq = data_ptr<const int32_t>(cu_seqlens_q);
  const auto* lens = data_ptr<const int32_t>(seq_lens);
  const auto* table = data_ptr<const int32_t>(block_table);
  d::CheckPrefixSums(kOp, "cu_seqlens_q", cq, a.batch, a.total_q, "total_q (q.shape[0])");
  const int64_t capacity = a.max_blocks * a.block_size;
  std::vector<d::RequestRows> requests(static_cast<size_t>(a.batch));
  int64_t mask_needed = 0;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t len = lens[b];
    host::ValueCheck(len >= 0 && len <= capacity, kOp, ": seq_lens[", b, "] = ", len,
                     " is outside [0, max_blocks_per_seq * block_size = ", capacity, "]");
    const int32_t* row = table + b * a.table_stride;
    for (int64_t j = 0; j < (len + a.block_size - 1) / a.block_size; ++j) {
      host::ValueCheck(row[j] >= 0 && row[j] < a.num_blocks, kOp, ": block_table[", b, ", ", j, "] = ", row[j],
                       " is not a block id in [0, num_blocks = ", a.num_blocks, ")");
    }
    const int64_t len_q = cq[b + 1] - cq[b];
    requests[b] = {cq[b], len_q, len, 0, row, mask_needed};
    mask_needed += len_q * len;
  }
  host::ValueCheck(a.mask_size == 0 || a.mask_size == mask_needed, kOp, ": custom_mask must hold the requests' ",
                   "[len_q, len_k] blocks, sum of len_q * len_k = ", mask_needed, " elements, got ", a.mask_size);
  if (a.empty()) return;
  const d::Problem pr{requests.data(), a.mask_size > 0 ? data_ptr<const uint8_t>(custom_mask) : nullptr, a};
  host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
    d::Run<T>(pr, data_ptr<T>(out), data_ptr<float>(lse), data_ptr<const T>(q), data_ptr<const T>(k_cache),
              data_ptr<const T>(v_cache), num_threads);
  });
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
