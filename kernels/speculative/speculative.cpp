/*!
 * \file kernels/speculative/speculative.cpp
 * \brief CPU speculative-decoding verification: chain rejection sampling.
 *
 * Scalar C++ with the integer weights of speculative.hpp, so the tokens equal CUDA's for the
 * same uniforms. Draft ids are checked before anything is written (ValueError names the first
 * one outside [0, vocab)); uniforms outside [0, 1) raise too.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::chain_speculative_sampling (arguments: speculative.hpp).
 */
#include "speculative.hpp"

#include <cmath>
#include <cstdint>

namespace mllm_kernel::cpu {

namespace speculative_detail {

using speculative::ChainArgs;

/*! \brief The first index whose running weight exceeds DrawTarget(u, total); -1 if total is 0.
 *  weight(i) gives token i's integer weight. */
template <typename WeightFn>
int64_t Draw(int64_t vocab, float u, WeightFn weight) {
  uint64_t total = 0;
  for (int64_t i = 0; i < vocab; ++i) total += weight(i);
  if (total == 0) return -1;
  const uint64_t target = speculative::DrawTarget(u, total);
  uint64_t running = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    running += weight(i);
    if (running > target) return i;
  }
  return vocab - 1;  // unreachable: target < total
}

template <typename IdT, typename AccT>
void Chain(IdT* out_tokens, AccT* out_accepted, const float* draft, const IdT* ids, const float* target,
           const float* uniforms, const ChainArgs& a) {
  const int64_t n = a.num_draft;
  for (int64_t b = 0; b < a.batch; ++b) {  // validate first: a bad call writes nothing
    for (int64_t j = 0; j < n; ++j) {
      const auto id = static_cast<int64_t>(ids[b * a.ids_stride_b + j * a.ids_stride_n]);
      host::ValueCheck(id >= 0 && id < a.vocab, "chain_speculative_sampling: draft_token_ids[", b, ", ", j, "] = ", id,
                       " is out of range [0, vocab=", a.vocab, ")");
    }
    for (int64_t j = 0; j <= n; ++j) {
      const float u = uniforms[b * (n + 1) + j];
      host::ValueCheck(u >= 0.0f && u < 1.0f, "chain_speculative_sampling: uniforms[", b, ", ", j, "] = ", u,
                       " is outside [0, 1)");
    }
  }
  for (int64_t b = 0; b < a.batch; ++b) {
    const float* u = uniforms + b * (n + 1);
    IdT* out = out_tokens + b * (n + 1);
    int64_t j = 0;
    for (; j < n; ++j) {  // accept drafts while u * q(x) < p(x)
      const auto x = static_cast<int64_t>(ids[b * a.ids_stride_b + j * a.ids_stride_n]);
      const float p = target[b * a.target_stride_b + j * a.target_stride_n + x];
      const float q = draft[b * a.draft_stride_b + j * a.draft_stride_n + x];
      if (!speculative::Accepts(u[j], p, q)) break;
      out[j] = static_cast<IdT>(x);
    }
    const float* p_row = target + b * a.target_stride_b + j * a.target_stride_n;
    int64_t token = -1;
    if (j < n) {  // rejected at j: draw from normalize(max(0, p - q))
      const float* q_row = draft + b * a.draft_stride_b + j * a.draft_stride_n;
      token = Draw(a.vocab, u[n], [&](int64_t i) { return speculative::ResidualWeight(p_row[i], q_row[i]); });
    }
    if (token < 0) {  // all accepted (the bonus token), or a residual without mass: draw from p
      token = Draw(a.vocab, u[n], [&](int64_t i) { return speculative::Weight(p_row[i]); });
    }
    out[j] = static_cast<IdT>(token < 0 ? 0 : token);  // p without mass: token 0, as CUDA
    for (int64_t k = j + 1; k <= n; ++k) out[k] = static_cast<IdT>(-1);
    out_accepted[b] = static_cast<AccT>(j);
  }
}

}  // namespace speculative_detail

/*!
 * \brief Chain speculative sampling (arguments: speculative.hpp). A draft id outside [0, vocab)
 * or a uniform outside [0, 1) raises ValueError before any write; error (the CUDA export's
 * record) is ignored.
 */
inline void chain_speculative_sampling(tvm::ffi::TensorView out_tokens, tvm::ffi::TensorView out_accepted,
                                       tvm::ffi::TensorView draft_probs, tvm::ffi::TensorView draft_token_ids,
                                       tvm::ffi::TensorView target_probs, tvm::ffi::TensorView uniforms,
                                       tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a = speculative::VerifyChain<kDLCPU>(out_tokens, out_accepted, draft_probs, draft_token_ids,
                                                  target_probs, uniforms, error);
  if (a.empty()) return;
  host::DispatchIndex(a.id_dtype, [&]<typename IdT>() {
    host::DispatchIndex(a.accepted_dtype, [&]<typename AccT>() {
      speculative_detail::Chain(data_ptr<IdT>(out_tokens), data_ptr<AccT>(out_accepted),
                                data_ptr<const float>(draft_probs), data_ptr<const IdT>(draft_token_ids),
                                data_ptr<const float>(target_probs), data_ptr<const float>(uniforms), a);
    });
  });
}

}  // namespace mllm_kernel::cpu
