/*!
 * \file kernels/decode_attention/decode_attention.hpp
 * \brief The argument contracts of decode_attention and merge_attention_states, shared by the
 * CPU (decode_attention.cpp) and CUDA (decode_attention.cuh) entry points, which take the same
 * arguments.
 *
 * decode_attention: one query token per request attends to the request's cached keys.
 *   out [B, H, D]: contiguous, q's dtype (written);  lse float32 [B, H]: contiguous (written);
 *   q [B, H, D]: any batch stride, heads and dims contiguous; float32, float16 or bfloat16
 *     (on CUDA a float32 q takes a float32 cache);
 *   k_cache, v_cache [num_blocks, block_size, KH, D]: q's dtype or both float8_e4m3fn, any
 *     block stride, the rest contiguous (the layout store_kv_cache writes; K and V may be views
 *     of one tensor);
 *   k_scale, v_scale float32 [KH], [1] or [0] with k_scale_value, v_scale_value: a float8
 *     cache's dequantization scales (mllm_kernel/cache_scale.hpp);
 *   block_table int32 [B, max_blocks]: any row stride; seq_lens int32 [B] contiguous;
 *   partial_out float32 [P], partial_lse float32 [P / D]: the split-KV workspace, P =
 *     B * H * num_splits * D when num_splits > 1 (written), unused (any size) otherwise;
 *   error int64 [3]: the device-error record CUDA fills for a bad block id or seq_len.
 *   H must be a multiple of KH; D one of kHeadDims. All on one device; nothing written
 *   shares memory with anything read (mllm_kernel/overlap.hpp).
 *
 * merge_attention_states: v [N, H, D] and lse float32 [N, H] (written, contiguous) from two
 *   partial states (v_a, lse_a), (v_b, lse_b) of the same shapes and dtype (v: float32, float16
 *   or bfloat16; any row stride; heads and dims contiguous).
 */
#ifndef MLLM_KERNEL_KERNELS_DECODE_ATTENTION_HPP_
#define MLLM_KERNEL_KERNELS_DECODE_ATTENTION_HPP_

#include <mllm_kernel/cache_scale.hpp>
#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace mllm_kernel::decode_attention {

/*! \brief The head dims the kernels are instantiated for. */
inline constexpr int64_t kHeadDims[] = {64, 128, 256};
/*! \brief Most split-KV chunks per (request, head) (bounds the merge's work per output). */
inline constexpr int64_t kMaxSplits = 128;

/*! \brief A verified decode_attention call; strides in elements. */
struct DecodeArgs {
  DLDataType dtype;        // q's and out's
  DLDataType cache_dtype;  // dtype, or float8_e4m3fn
  DLDevice device;
  int64_t batch, num_heads, num_kv_heads, head_dim, num_blocks, block_size, max_blocks;
  int64_t q_stride, k_block_stride, v_block_stride, table_stride;
  float scale;         // multiplies q . k
  float soft_cap;      // > 0: logits = cap * tanh(scale * q . k / cap)
  int64_t window;      // > 0: only the last `window` keys; else all of them
  int64_t num_splits;  // chunks of each request's keys, merged after (1: no workspace)
  host::CacheScale k_scale, v_scale;  // dequantization of a float8 cache (else 1)
  int64_t group() const { return num_heads / num_kv_heads; }
  bool fp8() const { return cache_dtype == host::kDType<host::float8_e4m3fn_tag>; }
  bool empty() const { return batch == 0 || num_heads == 0; }
};

template <DLDeviceType kDev>
DecodeArgs VerifyDecodeAttention(tvm::ffi::TensorView out, tvm::ffi::TensorView lse,
                                 tvm::ffi::TensorView q, tvm::ffi::TensorView k_cache,
                                 tvm::ffi::TensorView v_cache, tvm::ffi::TensorView block_table,
                                 tvm::ffi::TensorView seq_lens, tvm::ffi::TensorView partial_out,
                                 tvm::ffi::TensorView partial_lse, tvm::ffi::TensorView k_scale,
                                 tvm::ffi::TensorView v_scale, double k_scale_value, double v_scale_value,
                                 double scale, int64_t sliding_window, double soft_cap, int64_t num_splits,
                                 tvm::ffi::TensorView error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  constexpr const char* kOp = "decode_attention";
  SymbolicSize B{"batch"}, H{"num_heads"}, KH{"num_kv_heads"}, D{"head_dim"}, NB{"num_blocks"},
      BS{"block_size"}, MB{"max_blocks_per_seq"}, QS{"q_batch_stride"}, KS{"k_block_stride"},
      VS{"v_block_stride"}, TS{"block_table_row_stride"}, P{"workspace_size"}, PL{"workspace_rows"};
  SymbolicDType dtype, cache_dtype;
  SymbolicDevice device{"device"};
  TensorMatcher({B, H, D})
      .for_op(kOp)
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDev>(device)
      .with_strides({QS, D, 1})
      .verify(q, "q");
  TensorMatcher({NB, BS, KH, D})
      .for_op(kOp)
      .with_dtype<float, float16_tag, bfloat16_tag, float8_e4m3fn_tag>(cache_dtype)
      .with_device(device)
      .with_strides({KS, -1, -1, 1})
      .verify(k_cache, "k_cache");
  TensorMatcher({NB, BS, KH, D})
      .for_op(kOp)
      .with_dtype(cache_dtype)
      .with_device(device)
      .with_strides({VS, -1, -1, 1})
      .verify(v_cache, "v_cache");
  const bool fp8 = cache_dtype.unwrap() == kDType<float8_e4m3fn_tag>;
  TypeCheck(fp8 || cache_dtype.unwrap() == dtype.unwrap(), kOp, ": k_cache and v_cache must have q's dtype (",
             DTypeName(dtype.unwrap()), ") or be float8_e4m3fn, got ", DTypeName(cache_dtype.unwrap()));
  // CUDA's float32 kernel is a plain one: a float32 q reads a float32 cache there.
  TypeCheck(kDev != kDLCUDA || !fp8 || dtype.unwrap() != kDType<float>, kOp,
            ": a float32 q needs a float32 k_cache and v_cache on CUDA (float8 caches go with float16/bfloat16 q), "
            "got ", DTypeName(cache_dtype.unwrap()));
  TensorMatcher({B, MB}).for_op(kOp).with_dtype<int32_t>().with_device(device).with_strides({TS, 1}).verify(
      block_table, "block_table");
  TensorMatcher({B}).for_op(kOp).with_dtype<int32_t>().with_device(device).verify(seq_lens, "seq_lens");
  TensorMatcher({B, H, D}).for_op(kOp).with_dtype(dtype).with_device(device).verify(out, "out");
  TensorMatcher({B, H}).for_op(kOp).with_dtype<float>().with_device(device).verify(lse, "lse");
  TensorMatcher({P}).for_op(kOp).with_dtype<float>().with_device(device).verify(partial_out, "partial_out");
  TensorMatcher({PL}).for_op(kOp).with_dtype<float>().with_device(device).verify(partial_lse, "partial_lse");
  if constexpr (kDev == kDLCUDA) {
    TensorMatcher({3}).for_op(kOp).with_dtype<int64_t>().with_device(device).verify(error, "error");
  }

  const int64_t b = B.unwrap(), h = H.unwrap(), kh = KH.unwrap(), d = D.unwrap();
  const int64_t bs = BS.unwrap(), nb = NB.unwrap();
  ValueCheck(kh > 0 && h % kh == 0, kOp, ": num_heads (q.shape[1] = ", h,
             ") must be a positive multiple of num_kv_heads (k_cache.shape[2] = ", kh, ")");
  bool known_dim = false;
  for (const int64_t dim : kHeadDims) known_dim = known_dim || dim == d;
  ValueCheck(known_dim, kOp, ": head_dim (q.shape[2]) = ", d, " is not supported; expected 64, 128 or 256");
  ValueCheck(bs >= 1, kOp, ": block_size (k_cache.shape[1]) must be >= 1, got ", bs);
  // Token rows of one block must be [block_size, KH, D] packed, so a flat slot addresses them.
  ValueCheck(k_cache.stride(1) == kh * d && k_cache.stride(2) == d, kOp,
             ": k_cache must be contiguous within a block ([block_size, num_kv_heads, head_dim]), got strides ",
             k_cache.stride(0), ", ", k_cache.stride(1), ", ", k_cache.stride(2), ", ", k_cache.stride(3));
  ValueCheck(v_cache.stride(1) == kh * d && v_cache.stride(2) == d, kOp,
             ": v_cache must be contiguous within a block ([block_size, num_kv_heads, head_dim]), got strides ",
             v_cache.stride(0), ", ", v_cache.stride(1), ", ", v_cache.stride(2), ", ", v_cache.stride(3));
  ValueCheck(nb < (int64_t{1} << 31), kOp, ": num_blocks = ", nb, " does not fit the int32 block table");
  // The kernels compute in float32: the values must survive the conversion (1e39 would become
  // inf, 1e-46 zero) and so must scale / cap, the factor folded into q under a soft cap.
  const auto f32 = [](double x) { return static_cast<float>(x); };
  ValueCheck(std::isfinite(f32(scale)) && f32(scale) > 0.f, kOp,
             ": scale must be a positive finite float32 number, got ", scale);
  ValueCheck(soft_cap == 0.0 || (std::isfinite(f32(soft_cap)) && f32(soft_cap) >= std::numeric_limits<float>::min() &&
                                 std::isfinite(f32(scale) / f32(soft_cap))),
             kOp, ": logits_soft_cap must be 0 (off) or a positive normal float32 number with scale / cap finite, got ",
             soft_cap);
  const CacheScale ks = VerifyCacheScale<kDev>(kOp, "k_scale", k_scale, k_scale_value, device, kh, fp8);
  const CacheScale vs = VerifyCacheScale<kDev>(kOp, "v_scale", v_scale, v_scale_value, device, kh, fp8);
  ValueCheck(num_splits >= 1 && num_splits <= kMaxSplits, kOp, ": num_splits must be in [1, ", kMaxSplits,
             "], got ", num_splits);
  if (num_splits > 1) {
    ValueCheck(P.unwrap() == b * h * num_splits * d && PL.unwrap() == b * h * num_splits, kOp,
               ": the split-KV workspace must hold batch * num_heads * num_splits (* head_dim) floats: "
               "expected partial_out of ", b * h * num_splits * d, " and partial_lse of ", b * h * num_splits,
               ", got ", P.unwrap(), " and ", PL.unwrap());
  }
  CheckNoAliasing(kOp, {{out, "out"}, {lse, "lse"}, {partial_out, "partial_out"}, {partial_lse, "partial_lse"}},
                  {{q, "q"}, {k_cache, "k_cache"}, {v_cache, "v_cache"}, {block_table, "block_table"},
                   {seq_lens, "seq_lens"}, {k_scale, "k_scale"}, {v_scale, "v_scale"}});
  DecodeArgs a{};
  a.dtype = dtype.unwrap();
  a.cache_dtype = cache_dtype.unwrap();
  a.k_scale = ks;
  a.v_scale = vs;
  a.device = device.unwrap();
  a.batch = b;
  a.num_heads = h;
  a.num_kv_heads = kh;
  a.head_dim = d;
  a.num_blocks = nb;
  a.block_size = bs;
  a.max_blocks = MB.unwrap();
  a.q_stride = QS.unwrap();
  a.k_block_stride = KS.unwrap();
  a.v_block_stride = VS.unwrap();
  a.table_stride = TS.unwrap();
  a.scale = static_cast<float>(scale);
  a.soft_cap = static_cast<float>(soft_cap);
  a.window = sliding_window > 0 ? sliding_window : 0;
  a.num_splits = num_splits;
  return a;
}

/*! \brief A verified merge_attention_states call; strides in elements. */
struct MergeArgs {
  DLDataType dtype;
  DLDevice device;
  int64_t rows, num_heads, head_dim, a_stride, b_stride;
  bool empty() const { return rows == 0 || num_heads == 0 || head_dim == 0; }
};

template <DLDeviceType kDev>
MergeArgs VerifyMergeStates(tvm::ffi::TensorView v, tvm::ffi::TensorView lse, tvm::ffi::TensorView v_a,
                            tvm::ffi::TensorView lse_a, tvm::ffi::TensorView v_b,
                            tvm::ffi::TensorView lse_b) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  constexpr const char* kOp = "merge_attention_states";
  SymbolicSize N{"rows"}, H{"num_heads"}, D{"head_dim"}, AS{"v_a_row_stride"}, BSt{"v_b_row_stride"};
  SymbolicDType dtype;
  SymbolicDevice device{"device"};
  TensorMatcher({N, H, D})
      .for_op(kOp)
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDev>(device)
      .with_strides({AS, D, 1})
      .verify(v_a, "v_a");
  TensorMatcher({N, H, D}).for_op(kOp).with_dtype(dtype).with_device(device).with_strides({BSt, D, 1}).verify(
      v_b, "v_b");
  TensorMatcher({N, H}).for_op(kOp).with_dtype<float>().with_device(device).verify(lse_a, "lse_a").verify(
      lse_b, "lse_b");
  TensorMatcher({N, H, D}).for_op(kOp).with_dtype(dtype).with_device(device).verify(v, "v");
  TensorMatcher({N, H}).for_op(kOp).with_dtype<float>().with_device(device).verify(lse, "lse");
  CheckNoAliasing(kOp, {{v, "v"}, {lse, "lse"}},
                  {{v_a, "v_a"}, {lse_a, "lse_a"}, {v_b, "v_b"}, {lse_b, "lse_b"}});
  return {dtype.unwrap(), device.unwrap(), N.unwrap(), H.unwrap(), D.unwrap(), AS.unwrap(), BSt.unwrap()};
}

/*! \brief num_threads, the CPU's thread count (0 or 1: the calling thread), checked on every
 *  device: CUDA ignores the value but refuses a negative one as the CPU does. */
inline void VerifyNumThreads(int64_t num_threads) {
  host::ValueCheck(num_threads >= 0, "decode_attention: num_threads must be >= 0 (0 or 1: the calling thread), got ",
                   num_threads);
}

}  // namespace mllm_kernel::decode_attention

#endif  // MLLM_KERNEL_KERNELS_DECODE_ATTENTION_HPP_
