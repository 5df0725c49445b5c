/*!
 * \file kernels/prefill_attention/prefill_attention.hpp
 * \brief The argument contracts of prefill_attention (ragged K/V) and paged_prefill_attention
 * (decode_attention's paged cache), shared by the CPU (prefill_attention.cpp) and CUDA
 * (prefill_attention.cuh) entry points, which take the same arguments.
 *
 * Both: a ragged batch of B requests; request i's queries are rows [cu_seqlens_q[i],
 * cu_seqlens_q[i + 1]) of q, its len_k keys come from k/v rows [cu_seqlens_k[i], cu_seqlens_k[i + 1])
 * (ragged) or from its block_table row with len_k = seq_lens[i] (paged).
 *   out [TQ, H, D]: contiguous, q's dtype (written);  lse float32 [TQ, H]: contiguous (written);
 *   q [TQ, H, D]: any token stride, heads and dims contiguous; float16/bfloat16 (and float32 on
 *     the CPU);
 *   ragged: k, v [TK, KH, D] of q's dtype, any token stride, heads and dims contiguous;
 *     cu_seqlens_q, cu_seqlens_k int32 [B + 1] contiguous;
 *   paged: k_cache, v_cache [num_blocks, block_size, KH, D] of q's dtype (decode_attention's
 *     layout); block_table int32 [B, max_blocks] (any row stride); cu_seqlens_q int32 [B + 1];
 *     seq_lens int32 [B]; custom_mask uint8 [M] (0 or 1; M = 0: none): request i's [len_q, len_k]
 *     block, query-major, the blocks concatenated in request order (M = sum len_q * len_k);
 *   error int64 [3]: the device-error record CUDA fills for a bad length, block id or mask size.
 *   H must be a multiple of KH; D one of kHeadDims. All on one device; nothing written shares
 *   memory with anything read.
 *
 * Masking, for query j of a request (0-based) at position pos = j + len_k - len_q (the causal
 * diagonal aligned to the bottom right, as FlashAttention does): causal keeps keys t <= pos; a
 * custom mask replaces that rule (key t is kept where mask[j, t] is 1); sliding_window W > 0
 * keeps only pos - W < t <= pos on top of either. A query without keys gets out 0, lse -inf.
 */
#ifndef MLLM_KERNEL_KERNELS_PREFILL_ATTENTION_HPP_
#define MLLM_KERNEL_KERNELS_PREFILL_ATTENTION_HPP_

#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace mllm_kernel::prefill_attention {

/*! \brief The head dims the kernels are instantiated for. */
inline constexpr int64_t kHeadDims[] = {64, 128, 256};

/*! \brief A verified call; strides in elements. */
struct PrefillArgs {
  DLDataType dtype;
  DLDevice device;
  bool paged;
  int64_t batch, total_q, num_heads, num_kv_heads, head_dim;
  int64_t total_k;                            // ragged: rows of k and v
  int64_t num_blocks, block_size, max_blocks;  // paged
  int64_t q_stride, k_stride, v_stride;       // per token (ragged k, v) or per block (paged)
  int64_t table_stride;
  int64_t mask_size;  // custom_mask's elements (0: none)
  float scale;        // multiplies q . k
  float soft_cap;     // > 0: logits = cap * tanh(scale * q . k / cap)
  int64_t window;     // > 0: only keys pos - window < t <= pos
  bool causal;
  int64_t group() const { return num_heads / num_kv_heads; }
  bool empty() const { return batch == 0 || total_q == 0 || num_heads == 0; }
};

namespace detail {

// q, out, lse, the scalars and the head mapping: what both forms share. The caller has bound
// TQ, H, KH, D and dtype through q and its K/V tensors.
template <DLDeviceType kDev>
void VerifyCommon(const char* op, PrefillArgs& a, tvm::ffi::TensorView out, tvm::ffi::TensorView lse,
                  tvm::ffi::TensorView q, host::SymbolicSize& TQ, host::SymbolicSize& H, host::SymbolicSize& KH,
                  host::SymbolicSize& D, host::SymbolicDType& dtype, host::SymbolicDevice& device,
                  const char* kv_heads_of, double scale, bool causal, int64_t sliding_window, double soft_cap) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  TensorMatcher({TQ, H, D}).for_op(op).with_dtype(dtype).with_device(device).verify(out, "out");
  TensorMatcher({TQ, H}).for_op(op).with_dtype<float>().with_device(device).verify(lse, "lse");
  const int64_t h = H.unwrap(), kh = KH.unwrap(), d = D.unwrap();
  ValueCheck(kh > 0 && h % kh == 0, op, ": num_heads (q.shape[1] = ", h,
             ") must be a positive multiple of num_kv_heads (", kv_heads_of, " = ", kh, ")");
  bool known_dim = false;
  for (const int64_t dim : kHeadDims) known_dim = known_dim || dim == d;
  ValueCheck(known_dim, op, ": head_dim (q.shape[2]) = ", d, " is not supported; expected 64, 128 or 256");
  // The kernels compute in float32 (see decode_attention.hpp for why scale / cap must be finite).
  const auto f32 = [](double x) { return static_cast<float>(x); };
  ValueCheck(std::isfinite(f32(scale)) && f32(scale) > 0.f, op, ": scale must be a positive finite float32 number, got ",
             scale);
  ValueCheck(soft_cap == 0.0 || (std::isfinite(f32(soft_cap)) && f32(soft_cap) >= std::numeric_limits<float>::min() &&
                                 std::isfinite(f32(scale) / f32(soft_cap))),
             op, ": logits_soft_cap must be 0 (off) or a positive normal float32 number with scale / cap finite, got ",
             soft_cap);
  a.dtype = dtype.unwrap();
  a.device = device.unwrap();
  a.total_q = TQ.unwrap();
  a.num_heads = h;
  a.num_kv_heads = kh;
  a.head_dim = d;
  a.q_stride = q.stride(0);
  a.scale = f32(scale);
  a.soft_cap = f32(soft_cap);
  a.window = sliding_window > 0 ? sliding_window : 0;
  a.causal = causal;
}

template <DLDeviceType kDev>
void VerifyQ(const char* op, tvm::ffi::TensorView q, host::SymbolicSize& TQ, host::SymbolicSize& H,
             host::SymbolicSize& D, host::SymbolicDType& dtype, host::SymbolicDevice& device) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize QS{"q_token_stride"};
  // float32 attention runs on the CPU only; CUDA kernels are instantiated for 16-bit types.
  if constexpr (kDev == kDLCUDA) {
    TensorMatcher({TQ, H, D}).for_op(op).with_dtype<float16_tag, bfloat16_tag>(dtype).with_device<kDev>(device)
        .with_strides({QS, D, 1}).verify(q, "q");
  } else {
    TensorMatcher({TQ, H, D}).for_op(op).with_dtype<float, float16_tag, bfloat16_tag>(dtype).with_device<kDev>(device)
        .with_strides({QS, D, 1}).verify(q, "q");
  }
}

}  // namespace detail

template <DLDeviceType kDev>
PrefillArgs VerifyPrefill(tvm::ffi::TensorView out, tvm::ffi::TensorView lse, tvm::ffi::TensorView q,
                          tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView cu_seqlens_q,
                          tvm::ffi::TensorView cu_seqlens_k, double scale, bool causal, int64_t sliding_window,
                          double soft_cap, tvm::ffi::TensorView error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  constexpr const char* kOp = "prefill_attention";
  SymbolicSize TQ{"total_q"}, H{"num_heads"}, KH{"num_kv_heads"}, D{"head_dim"}, TK{"total_k"}, B1{"batch + 1"},
      KS{"k_token_stride"}, VS{"v_token_stride"};
  SymbolicDType dtype;
  SymbolicDevice device{"device"};
  detail::VerifyQ<kDev>(kOp, q, TQ, H, D, dtype, device);
  TensorMatcher({TK, KH, D}).for_op(kOp).with_dtype(dtype).with_device(device).with_strides({KS, D, 1}).verify(k, "k");
  TensorMatcher({TK, KH, D}).for_op(kOp).with_dtype(dtype).with_device(device).with_strides({VS, D, 1}).verify(v, "v");
  TensorMatcher({B1}).for_op(kOp).with_dtype<int32_t>().with_device(device).verify(cu_seqlens_q, "cu_seqlens_q");
  TensorMatcher({B1}).for_op(kOp).with_dtype<int32_t>().with_device(device).verify(cu_seqlens_k, "cu_seqlens_k");
  if constexpr (kDev == kDLCUDA) {
    TensorMatcher({3}).for_op(kOp).with_dtype<int64_t>().with_device(device).verify(error, "error");
  }
  PrefillArgs a{};
  detail::VerifyCommon<kDev>(kOp, a, out, lse, q, TQ, H, KH, D, dtype, device, "k.shape[1]", scale, causal,
                             sliding_window, soft_cap);
  ValueCheck(B1.unwrap() >= 1, kOp, ": cu_seqlens_q must hold batch + 1 >= 1 prefix sums, got 0 elements");
  ValueCheck(TK.unwrap() < (int64_t{1} << 31) && a.total_q < (int64_t{1} << 31), kOp,
             ": total_q and total_k must be < 2^31 (int32 prefix sums), got ", a.total_q, " and ", TK.unwrap());
  CheckNoAliasing(kOp, {{out, "out"}, {lse, "lse"}},
                  {{q, "q"}, {k, "k"}, {v, "v"}, {cu_seqlens_q, "cu_seqlens_q"}, {cu_seqlens_k, "cu_seqlens_k"}});
  a.paged = false;
  a.batch = B1.unwrap() - 1;
  a.total_k = TK.unwrap();
  a.k_stride = KS.unwrap();
  a.v_stride = VS.unwrap();
  return a;
}

template <DLDeviceType kDev>
PrefillArgs VerifyPagedPrefill(tvm::ffi::TensorView out, tvm::ffi::TensorView lse, tvm::ffi::TensorView q,
                               tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
                               tvm::ffi::TensorView block_table, tvm::ffi::TensorView cu_seqlens_q,
                               tvm::ffi::TensorView seq_lens, tvm::ffi::TensorView custom_mask, double scale,
                               bool causal, int64_t sliding_window, double soft_cap, tvm::ffi::TensorView error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  constexpr const char* kOp = "paged_prefill_attention";
  SymbolicSize TQ{"total_q"}, H{"num_heads"}, KH{"num_kv_heads"}, D{"head_dim"}, NB{"num_blocks"},
      BS{"block_size"}, B{"batch"}, MB{"max_blocks_per_seq"}, KS{"k_block_stride"}, VS{"v_block_stride"},
      TS{"block_table_row_stride"}, M{"custom_mask_size"};
  SymbolicDType dtype;
  SymbolicDevice device{"device"};
  detail::VerifyQ<kDev>(kOp, q, TQ, H, D, dtype, device);
  TensorMatcher({NB, BS, KH, D}).for_op(kOp).with_dtype(dtype).with_device(device).with_strides({KS, -1, -1, 1})
      .verify(k_cache, "k_cache");
  TensorMatcher({NB, BS, KH, D}).for_op(kOp).with_dtype(dtype).with_device(device).with_strides({VS, -1, -1, 1})
      .verify(v_cache, "v_cache");
  TensorMatcher({B, MB}).for_op(kOp).with_dtype<int32_t>().with_device(device).with_strides({TS, 1}).verify(
      block_table, "block_table");
  TensorMatcher({B}).for_op(kOp).with_dtype<int32_t>().with_device(device).verify(seq_lens, "seq_lens");
  SymbolicSize B1{"batch + 1"};
  TensorMatcher({B1}).for_op(kOp).with_dtype<int32_t>().with_device(device).verify(cu_seqlens_q, "cu_seqlens_q");
  TensorMatcher({M}).for_op(kOp).with_dtype<uint8_t>().with_device(device).verify(custom_mask, "custom_mask");
  if constexpr (kDev == kDLCUDA) {
    TensorMatcher({3}).for_op(kOp).with_dtype<int64_t>().with_device(device).verify(error, "error");
  }
  PrefillArgs a{};
  detail::VerifyCommon<kDev>(kOp, a, out, lse, q, TQ, H, KH, D, dtype, device, "k_cache.shape[2]", scale, causal,
                             sliding_window, soft_cap);
  ValueCheck(B1.unwrap() == B.unwrap() + 1, kOp, ": cu_seqlens_q must hold batch + 1 = ", B.unwrap() + 1,
             " prefix sums (batch = seq_lens.shape[0]), got ", B1.unwrap());
  const int64_t kh = KH.unwrap(), d = D.unwrap(), bs = BS.unwrap();
  ValueCheck(bs >= 1, kOp, ": block_size (k_cache.shape[1]) must be >= 1, got ", bs);
  // Token rows of one block must be [block_size, KH, D] packed, so a flat slot addresses them.
  ValueCheck(k_cache.stride(1) == kh * d && k_cache.stride(2) == d, kOp,
             ": k_cache must be contiguous within a block ([block_size, num_kv_heads, head_dim])");
  ValueCheck(v_cache.stride(1) == kh * d && v_cache.stride(2) == d, kOp,
             ": v_cache must be contiguous within a block ([block_size, num_kv_heads, head_dim])");
  ValueCheck(NB.unwrap() < (int64_t{1} << 31), kOp, ": num_blocks = ", NB.unwrap(), " does not fit the int32 block table");
  // The Hopper kernel's paged copies address a row within its block in int elements.
  ValueCheck(bs * kh * d < (int64_t{1} << 31), kOp, ": block_size * num_kv_heads * head_dim must be < 2^31, got ",
             bs * kh * d);
  ValueCheck(MB.unwrap() * bs < (int64_t{1} << 31) && a.total_q < (int64_t{1} << 31), kOp,
             ": max_blocks_per_seq * block_size and total_q must be < 2^31, got ", MB.unwrap() * bs, " and ",
             a.total_q);
  CheckNoAliasing(kOp, {{out, "out"}, {lse, "lse"}},
                  {{q, "q"}, {k_cache, "k_cache"}, {v_cache, "v_cache"}, {block_table, "block_table"},
                   {cu_seqlens_q, "cu_seqlens_q"}, {seq_lens, "seq_lens"}, {custom_mask, "custom_mask"}});
  a.paged = true;
  a.batch = B.unwrap();
  a.num_blocks = NB.unwrap();
  a.block_size = bs;
  a.max_blocks = MB.unwrap();
  a.k_stride = KS.unwrap();
  a.v_stride = VS.unwrap();
  a.table_stride = TS.unwrap();
  a.mask_size = M.unwrap();
  return a;
}

/*! \brief num_threads, the CPU's thread count (0 or 1: the calling thread), checked on every
 *  device: CUDA ignores the value but refuses a negative one as the CPU does. */
inline void VerifyNumThreads(const char* op, int64_t num_threads) {
  host::ValueCheck(num_threads >= 0, op, ": num_threads must be >= 0 (0 or 1: the calling thread), got ", num_threads);
}

}  // namespace mllm_kernel::prefill_attention

#endif  // MLLM_KERNEL_KERNELS_PREFILL_ATTENTION_HPP_
