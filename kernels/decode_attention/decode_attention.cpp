/*!
 * \file kernels/decode_attention/decode_attention.cpp
 * \brief CPU decode attention over the paged KV cache and merge_attention_states (float32,
 *        float16, bfloat16), vectorized with Highway dynamic dispatch; float32 accumulation.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::decode_attention and mllm_kernel::cpu::merge_attention_states (contract:
 * decode_attention.hpp). The CPU never splits the keys (partial_out / partial_lse / num_splits
 * are taken for the CUDA signature and ignored) and raises on bad indices instead of recording
 * them (error is ignored too).
 */
#include "decode_attention.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "decode_attention-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "decode_attention-inl.h"
#include "mllm_kernel/cpu/parallel.hpp"

#if HWY_ONCE
namespace mllm_kernel::cpu {

namespace decode_attention_detail {

using mllm_kernel::decode_attention::DecodeArgs;

// Every seq_len, and every block id among the blocks that request reads, before anything is
// written (a bad index raises and leaves out / lse untouched). Unread table entries may hold
// anything (padding).
inline void CheckIndices(const DecodeArgs& a, const int32_t* block_table, const int32_t* seq_lens) {
  const int64_t capacity = a.max_blocks * a.block_size;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t len = seq_lens[b];
    host::ValueCheck(len >= 0 && len <= capacity, "decode_attention: seq_lens[", b, "] = ", len,
                     " is outside [0, max_blocks_per_seq * block_size = ", capacity, "]");
    const int64_t start = a.window > 0 && len > a.window ? len - a.window : 0;  // as AttendGroup
    if (start >= len) continue;
    const int32_t* row = block_table + b * a.table_stride;
    for (int64_t j = start / a.block_size; j <= (len - 1) / a.block_size; ++j) {
      host::ValueCheck(row[j] >= 0 && row[j] < a.num_blocks, "decode_attention: block_table[", b, ", ", j,
                       "] = ", row[j], " is not a block id in [0, num_blocks = ", a.num_blocks, ")");
    }
  }
}

}  // namespace decode_attention_detail

/*!
 * \brief out [B, H, D] = softmax(scale * q . K) V over each request's paged keys, and lse [B, H]
 * (natural log; -inf and out 0 for a request without keys). Arguments: decode_attention.hpp.
 *
 * num_threads: workers over (request, kv heads) items, from the pool of
 * mllm_kernel/cpu/parallel.hpp (0 or 1: the calling thread only). A seq_len outside [0, max_blocks_per_seq * block_size] or a block id outside
 * [0, num_blocks) among the blocks read raises ValueError before anything is written.
 */
inline void decode_attention(tvm::ffi::TensorView out, tvm::ffi::TensorView lse, tvm::ffi::TensorView q,
                             tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
                             tvm::ffi::TensorView block_table, tvm::ffi::TensorView seq_lens,
                             tvm::ffi::TensorView partial_out, tvm::ffi::TensorView partial_lse,
                             tvm::ffi::TensorView k_scale, tvm::ffi::TensorView v_scale, double k_scale_value,
                             double v_scale_value, double scale, int64_t sliding_window, double soft_cap,
                             int64_t num_splits, int64_t num_threads, tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a = mllm_kernel::decode_attention::VerifyDecodeAttention<kDLCPU>(
      out, lse, q, k_cache, v_cache, block_table, seq_lens, partial_out, partial_lse, k_scale, v_scale,
      k_scale_value, v_scale_value, scale, sliding_window, soft_cap, num_splits, error);
  mllm_kernel::decode_attention::VerifyNumThreads(num_threads);
  const auto* table = data_ptr<const int32_t>(block_table);
  const auto* lens = data_ptr<const int32_t>(seq_lens);
  decode_attention_detail::CheckIndices(a, table, lens);
  if (a.empty()) return;

  // Work items: a request and a run of its kv heads. One thread takes all kv heads of a request
  // per item: their token rows are contiguous, so the keys stream from memory in address order
  // (reading every num_kv_heads-th row span instead costs about twice the time). More threads
  // split the kv heads only as far as needed to give each thread an item.
  const int64_t wanted = std::max<int64_t>(1, std::min(num_threads, a.batch * a.num_kv_heads));
  int64_t splits = 1;
  while (a.batch * splits < wanted || a.num_kv_heads % splits != 0) ++splits;
  const int64_t kv_per_item = a.num_kv_heads / splits;
  const int64_t workers = std::min(wanted, a.batch * splits);
  const size_t per_worker = HWY_NAMESPACE::decode_attention_detail::ScratchFloats(
      static_cast<size_t>(kv_per_item * a.group()), static_cast<size_t>(a.group()),
      static_cast<size_t>(a.head_dim));
  std::vector<float> scratch(per_worker * static_cast<size_t>(workers));
  // The cache holds q's type, or float8 e4m3fn (a.fp8()): one instantiation each.
  const auto run = [&]<typename T, typename KV>() {
    using Types = decode_attention_detail::Types<T, KV>;
    HWY_EXPORT_T(Table, decode_attention_detail::AttendItems<Types>);
    std::atomic<int64_t> next{0};
    // Validation is done, so nothing below throws inside a worker.
    RunWorkers(workers, [&](int64_t worker) {
      HWY_DYNAMIC_DISPATCH_T(Table)(data_ptr<T>(out), data_ptr<float>(lse), data_ptr<const T>(q),
                                    data_ptr<const KV>(k_cache), data_ptr<const KV>(v_cache), table, lens, a,
                                    kv_per_item, &next, scratch.data() + per_worker * static_cast<size_t>(worker));
    });
  };
  host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
    if (a.fp8()) {
      run.template operator()<T, float8_e4m3fn_t>();
    } else {
      run.template operator()<T, T>();
    }
  });
}

/*!
 * \brief (v, lse) = the attention over the union of two disjoint key sets from their partial
 * states: v = (e^lse_a v_a + e^lse_b v_b) / (e^lse_a + e^lse_b), lse = log(e^lse_a + e^lse_b),
 * computed in float32; both -inf gives v = 0, lse = -inf. Arguments: decode_attention.hpp.
 */
inline void merge_attention_states(tvm::ffi::TensorView v, tvm::ffi::TensorView lse, tvm::ffi::TensorView v_a,
                                   tvm::ffi::TensorView lse_a, tvm::ffi::TensorView v_b,
                                   tvm::ffi::TensorView lse_b) {
  using host::data_ptr;
  const auto a = mllm_kernel::decode_attention::VerifyMergeStates<kDLCPU>(v, lse, v_a, lse_a, v_b, lse_b);
  if (a.empty()) return;
  host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
    HWY_EXPORT_T(Table, decode_attention_detail::MergeStates<T>);
    HWY_DYNAMIC_DISPATCH_T(Table)(data_ptr<T>(v), data_ptr<float>(lse), data_ptr<const T>(v_a),
                                  data_ptr<const float>(lse_a), data_ptr<const T>(v_b),
                                  data_ptr<const float>(lse_b), a.rows, a.num_heads, a.head_dim, a.a_stride,
                                  a.b_stride);
  });
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
