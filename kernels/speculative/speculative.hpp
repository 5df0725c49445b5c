/*!
 * \file kernels/speculative/speculative.hpp
 * \brief The argument contracts of chain_speculative_sampling and tree_speculative_verify, and the
 * arithmetic both devices share (speculative.cpp, speculative.cuh), so the same uniforms give the
 * same tokens on each.
 *
 * draft_probs [batch, n, vocab] and target_probs [batch, n + 1, vocab]: float32, unit last
 * stride, any other strides; draft_token_ids [batch, n]: int32/int64, any strides; uniforms
 * float32 [batch, n + 1], contiguous; out_tokens [batch, n + 1] of draft_token_ids' dtype and
 * out_accepted [batch] int32/int64, contiguous (written); error: int64 [3], the device-error
 * record {flag, flattened index, id} CUDA fills for a draft id outside [0, vocab) (the CPU raises
 * instead). All on one device; the written tensors share no memory with the others or each other.
 */
#ifndef MLLM_KERNEL_KERNELS_SPECULATIVE_HPP_
#define MLLM_KERNEL_KERNELS_SPECULATIVE_HPP_

#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <utility>

#ifdef __CUDACC__
#define MLLM_KERNEL_SPEC_HD __host__ __device__ __forceinline__
#else
#define MLLM_KERNEL_SPEC_HD inline
#endif

namespace mllm_kernel::speculative {

/*!
 * \brief Draws use integer weights: a probability w (clamped to [0, 1], NaN as 0) times 2^40,
 * truncated. Integer sums are exact and order-free, so the CPU and every CUDA plan pick the same
 * token for the same uniform. A weight below 2^-40 (~9e-13) counts as 0, which moves at most
 * vocab * 2^-40 of mass (1.4e-7 at vocab 152k): less than float32 rounding of the probs themselves.
 */
inline constexpr float kWeightScale = 0x1p40f;

MLLM_KERNEL_SPEC_HD uint64_t Weight(float w) {
  w = w > 0.0f ? (w < 1.0f ? w : 1.0f) : 0.0f;  // NaN fails `w > 0` and becomes 0
  return static_cast<uint64_t>(w * kWeightScale);
}

/*! \brief The residual weight max(0, p - q) of a rejected position (float32 subtraction). */
MLLM_KERNEL_SPEC_HD uint64_t ResidualWeight(float p, float q) { return Weight(p - q); }

/*! \brief A uniform made usable: NaN and values outside [0, 1) are clamped (CUDA cannot raise). */
MLLM_KERNEL_SPEC_HD float ClampUniform(float u) {
  constexpr float kBelowOne = 0x1.fffffep-1f;
  return u > 0.0f ? (u < kBelowOne ? u : kBelowOne) : 0.0f;
}

/*! \brief The draw's threshold: the token picked is the first whose running weight sum exceeds
 *  it. total > 0 and u < 1 make it < total, so a token is always found. */
MLLM_KERNEL_SPEC_HD uint64_t DrawTarget(float u, uint64_t total) {
  return static_cast<uint64_t>(static_cast<double>(ClampUniform(u)) * static_cast<double>(total));
}

/*! \brief The accept test of draft token x: u * q(x) < p(x), float32, with q clamped at 0 (NaN as
 *  0). Strict, so a token the target gives probability 0 is never accepted; with q(x) = 0 < p(x)
 *  it always is. */
MLLM_KERNEL_SPEC_HD bool Accepts(float u, float p, float q) { return ClampUniform(u) * (q > 0.0f ? q : 0.0f) < p; }

/*! \brief The longest row a draw takes: vocab * 2^40 must stay below 2^64 (uint64 sums). */
inline constexpr int64_t kMaxDrawVocab = (int64_t{1} << 24) - 1;

/*! \brief A verified call. Strides in elements. */
struct ChainArgs {
  DLDataType id_dtype, accepted_dtype;
  DLDevice device;
  int64_t batch, num_draft, vocab;
  int64_t draft_stride_b, draft_stride_n, target_stride_b, target_stride_n, ids_stride_b, ids_stride_n;
  bool empty() const { return batch == 0; }
};

/*! \brief chain_speculative_sampling(out_tokens, out_accepted, draft_probs, draft_token_ids,
 *  target_probs, uniforms, error). */
template <DLDeviceType kDev>
ChainArgs VerifyChain(tvm::ffi::TensorView out_tokens, tvm::ffi::TensorView out_accepted,
                      tvm::ffi::TensorView draft_probs, tvm::ffi::TensorView draft_token_ids,
                      tvm::ffi::TensorView target_probs, tvm::ffi::TensorView uniforms, tvm::ffi::TensorView error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  constexpr const char* op = "chain_speculative_sampling";
  SymbolicSize batch{"batch"}, n{"num_draft"}, n1{"num_draft + 1"}, vocab{"vocab"};
  SymbolicSize dsb{"draft_probs_stride0"}, dsn{"draft_probs_stride1"};
  SymbolicSize tsb{"target_probs_stride0"}, tsn{"target_probs_stride1"};
  SymbolicSize isb{"draft_token_ids_stride0"}, isn{"draft_token_ids_stride1"};
  SymbolicDType id_dtype, accepted_dtype;
  SymbolicDevice device{"device"};
  TensorMatcher({batch, n, vocab})
      .for_op(op)
      .with_dtype<float>()
      .with_device<kDev>(device)
      .with_strides({dsb, dsn, 1})
      .verify(draft_probs, "draft_probs");
  TensorMatcher({batch, n})
      .for_op(op)
      .with_dtype<int32_t, int64_t>(id_dtype)
      .with_device(device)
      .with_strides({isb, isn})
      .verify(draft_token_ids, "draft_token_ids");
  TensorMatcher({batch, n1, vocab})
      .for_op(op)
      .with_dtype<float>()
      .with_device(device)
      .with_strides({tsb, tsn, 1})
      .verify(target_probs, "target_probs");
  ValueCheck(n1.unwrap() == n.unwrap() + 1, op, ": argument 'target_probs': dim 1 must be num_draft + 1 = ",
             n.unwrap() + 1, " (draft_probs has ", n.unwrap(), " positions), got ", n1.unwrap());
  ValueCheck(vocab.unwrap() > 0, op, ": argument 'target_probs': the vocab dim must be non-empty");
  ValueCheck(vocab.unwrap() <= kMaxDrawVocab, op, ": argument 'target_probs': vocab ", vocab.unwrap(),
             " is over 2^24 - 1 (draws sum 2^40-scaled integer weights in 64 bits)");
  TensorMatcher({batch, n1}).for_op(op).with_dtype<float>().with_device(device).verify(uniforms, "uniforms");
  TensorMatcher({batch, n1}).for_op(op).with_dtype(id_dtype).with_device(device).verify(out_tokens, "out_tokens");
  TensorMatcher({batch})
      .for_op(op)
      .with_dtype<int32_t, int64_t>(accepted_dtype)
      .with_device(device)
      .verify(out_accepted, "out_accepted");
  if constexpr (kDev == kDLCUDA) {
    TensorMatcher({3}).for_op(op).with_dtype<int64_t>().with_device(device).verify(error, "error");
    ValueCheck(vocab.unwrap() <= 0x7fffffff, op, ": vocab ", vocab.unwrap(), " is over 2^31 - 1 on CUDA");
  }
  CheckNoAliasing(op, {{out_tokens, "out_tokens"}, {out_accepted, "out_accepted"}},
                  {{draft_probs, "draft_probs"},
                   {draft_token_ids, "draft_token_ids"},
                   {target_probs, "target_probs"},
                   {uniforms, "uniforms"},
                   {error, "error"}});
  return {id_dtype.unwrap(), accepted_dtype.unwrap(), device.unwrap(), batch.unwrap(), n.unwrap(), vocab.unwrap(),
          dsb.unwrap(),      dsn.unwrap(),            tsb.unwrap(),    tsn.unwrap(),   isb.unwrap(), isn.unwrap()};
}

/*! \brief CUDA's tree workspace: int64 picks per node (the slices of a row's argmax). */
inline constexpr int kTreePicksPerNode = 16;

/*! \brief A verified tree_speculative_verify call. target's rows are target_stride apart. */
struct TreeArgs {
  DLDataType id_dtype, target_dtype;
  DLDevice device;
  int64_t batch, num_nodes, target_rows, vocab, target_stride, out_width;
  bool greedy;
  bool empty() const { return batch == 0; }
};

/*! \brief tree_speculative_verify(accepted_index, accepted_tokens, accepted_length, candidates,
 *  retrieve_index, next_token, next_sibling, target, uniforms, greedy, workspace, error).
 *
 * candidates, retrieve_index, next_token, next_sibling: [batch, D] int32/int64, contiguous;
 * target: [rows, vocab] float32/float16/bfloat16 (probs; logits too when greedy), unit last
 * stride; uniforms: float32 [batch, D] (read only when !greedy); accepted_index / accepted_tokens
 * [batch, W] and accepted_length [batch]: the ids' dtype, contiguous, written; W - 1 is the
 * deepest path followed; workspace: int64 [batch * D * kTreePicksPerNode], CUDA's per-node picks (ignored on the CPU). */
template <DLDeviceType kDev>
TreeArgs VerifyTree(tvm::ffi::TensorView accepted_index, tvm::ffi::TensorView accepted_tokens,
                    tvm::ffi::TensorView accepted_length, tvm::ffi::TensorView candidates,
                    tvm::ffi::TensorView retrieve_index, tvm::ffi::TensorView next_token,
                    tvm::ffi::TensorView next_sibling, tvm::ffi::TensorView target, tvm::ffi::TensorView uniforms,
                    bool greedy, tvm::ffi::TensorView workspace, tvm::ffi::TensorView error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  constexpr const char* op = "tree_speculative_verify";
  SymbolicSize batch{"batch"}, nodes{"num_nodes"}, rows{"target_rows"}, vocab{"vocab"}, stride{"target_row_stride"};
  SymbolicSize width{"max_depth + 1"};
  SymbolicDType id_dtype, target_dtype;
  SymbolicDevice device{"device"};
  TensorMatcher({batch, nodes})
      .for_op(op)
      .with_dtype<int32_t, int64_t>(id_dtype)
      .with_device<kDev>(device)
      .verify(candidates, "candidates");
  for (auto [t, name] : {std::pair{retrieve_index, "retrieve_index"}, {next_token, "next_token"},
                         {next_sibling, "next_sibling"}}) {
    TensorMatcher({batch, nodes}).for_op(op).with_dtype(id_dtype).with_device(device).verify(t, name);
  }
  ValueCheck(nodes.unwrap() > 0, op, ": argument 'candidates': a tree needs its root node (num_nodes > 0)");
  TensorMatcher({rows, vocab})
      .for_op(op)
      .with_dtype<float, float16_tag, bfloat16_tag>(target_dtype)
      .with_device(device)
      .with_strides({stride, 1})
      .verify(target, "target");
  ValueCheck(vocab.unwrap() > 0, op, ": argument 'target': the vocab dim must be non-empty");
  ValueCheck(greedy || vocab.unwrap() <= kMaxDrawVocab, op, ": argument 'target': vocab ", vocab.unwrap(),
             " is over 2^24 - 1 (draws sum 2^40-scaled integer weights in 64 bits)");
  if (!greedy) {
    TensorMatcher({batch, nodes}).for_op(op).with_dtype<float>().with_device(device).verify(uniforms, "uniforms");
  }
  TensorMatcher({batch, width}).for_op(op).with_dtype(id_dtype).with_device(device).verify(accepted_index,
                                                                                          "accepted_index");
  ValueCheck(width.unwrap() > 0, op, ": argument 'accepted_index': needs room for the root (max_depth >= 0)");
  TensorMatcher({batch, width}).for_op(op).with_dtype(id_dtype).with_device(device).verify(accepted_tokens,
                                                                                           "accepted_token_ids");
  TensorMatcher({batch}).for_op(op).with_dtype(id_dtype).with_device(device).verify(accepted_length,
                                                                                    "accepted_length");
  if constexpr (kDev == kDLCUDA) {
    TensorMatcher({3}).for_op(op).with_dtype<int64_t>().with_device(device).verify(error, "error");
    ValueCheck(vocab.unwrap() <= 0x7fffffff, op, ": vocab ", vocab.unwrap(), " is over 2^31 - 1 on CUDA");
    SymbolicSize picks{"batch * num_nodes * 16"};
    picks.set_value(batch.unwrap() * nodes.unwrap() * kTreePicksPerNode);
    TensorMatcher({picks}).for_op(op).with_dtype<int64_t>().with_device(device).verify(workspace, "workspace");
  }
  CheckNoAliasing(op,
                  {{accepted_index, "accepted_index"},
                   {accepted_tokens, "accepted_token_ids"},
                   {accepted_length, "accepted_length"},
                   {workspace, "workspace"}},
                  {{candidates, "candidates"},
                   {retrieve_index, "retrieve_index"},
                   {next_token, "next_token"},
                   {next_sibling, "next_sibling"},
                   {target, "target"},
                   {uniforms, "uniforms"},
                   {error, "error"}});
  return {id_dtype.unwrap(), target_dtype.unwrap(), device.unwrap(), batch.unwrap(), nodes.unwrap(),
          rows.unwrap(),     vocab.unwrap(),        stride.unwrap(), width.unwrap(), greedy};
}

}  // namespace mllm_kernel::speculative

#undef MLLM_KERNEL_SPEC_HD

#endif  // MLLM_KERNEL_KERNELS_SPECULATIVE_HPP_
