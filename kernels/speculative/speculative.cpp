/*!
 * \file kernels/speculative/speculative.cpp
 * \brief CPU speculative-decoding verification: chain rejection sampling and tree verification.
 *
 * Scalar C++ with the integer weights of speculative.hpp, so the tokens equal CUDA's for the
 * same uniforms. Draft ids are checked before anything is written (ValueError names the first
 * one outside [0, vocab)); uniforms outside [0, 1) raise too.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::{chain_speculative_sampling, tree_speculative_verify} (arguments: speculative.hpp).
 */
#include <hwy/base.h>  // hwy::float16_t / bfloat16_t and their float conversions

#include "speculative.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

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

inline float ToFloat(float v) { return v; }
inline float ToFloat(hwy::float16_t v) { return hwy::F32FromF16(v); }
inline float ToFloat(hwy::bfloat16_t v) { return hwy::F32FromBF16(v); }

/*! \brief argmax of a row: the first NaN if any (like torch.argmax), else the first index of the max. */
template <typename T>
int64_t ArgMax(const T* row, int64_t vocab) {
  int64_t best = 0;
  float best_v = ToFloat(row[0]);
  for (int64_t i = 1; i < vocab && !std::isnan(best_v); ++i) {
    const float v = ToFloat(row[i]);
    if (std::isnan(v) || v > best_v) best = i, best_v = v;
  }
  return best;
}

/*! \brief Checks one request's tree before anything is written: links in [-1, D) and never the
 *  root, every node reached at most once from the root, rows in [0, target_rows). */
template <typename IdT>
void CheckTree(const IdT* next_token, const IdT* next_sibling, const IdT* retrieve, int64_t b,
               const speculative::TreeArgs& a, std::vector<char>& seen) {
  const int64_t d = a.num_nodes;
  for (int64_t i = 0; i < d; ++i) {
    for (auto [links, name] : {std::pair{next_token, "next_token"}, {next_sibling, "next_sibling"}}) {
      const auto v = static_cast<int64_t>(links[i]);
      host::ValueCheck(v == -1 || (v > 0 && v < d), "tree_speculative_verify: ", name, "[", b, ", ", i, "] = ", v,
                       " must be -1 or a node index in [1, ", d, ")");
    }
    const auto row = static_cast<int64_t>(retrieve[i]);
    host::ValueCheck(row >= 0 && row < a.target_rows, "tree_speculative_verify: retrieve_index[", b, ", ", i,
                     "] = ", row, " is out of range [0, target rows=", a.target_rows, ")");
  }
  seen.assign(static_cast<size_t>(d), 0);
  std::vector<int64_t> stack{0};  // depth-first over first-child / next-sibling links
  seen[0] = 1;
  while (!stack.empty()) {
    const int64_t node = stack.back();
    stack.pop_back();
    for (auto next : {static_cast<int64_t>(next_token[node]), node == 0 ? -1 : static_cast<int64_t>(next_sibling[node])}) {
      if (next < 0) continue;
      host::ValueCheck(!seen[next], "tree_speculative_verify: request ", b, ": node ", next,
                       " is reached twice from the root (next_token / next_sibling do not form a tree)");
      seen[next] = 1;
      stack.push_back(next);
    }
  }
}

template <typename T, typename IdT>
void Tree(IdT* acc_index, IdT* acc_tokens, IdT* acc_length, const IdT* candidates, const IdT* retrieve,
          const IdT* next_token, const IdT* next_sibling, const T* target, const float* uniforms,
          const speculative::TreeArgs& a) {
  const int64_t d = a.num_nodes, w = a.out_width;
  std::vector<char> seen;
  for (int64_t b = 0; b < a.batch; ++b) {
    CheckTree(next_token + b * d, next_sibling + b * d, retrieve + b * d, b, a, seen);
    for (int64_t i = 0; !a.greedy && i < d; ++i) {
      const float u = uniforms[b * d + i];
      host::ValueCheck(u >= 0.0f && u < 1.0f, "tree_speculative_verify: uniforms[", b, ", ", i, "] = ", u,
                       " is outside [0, 1)");
    }
  }
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t base = b * d;
    IdT* index = acc_index + b * w;
    IdT* tokens = acc_tokens + b * w;
    int64_t cur = 0, depth = 0, token = 0;
    index[0] = 0;
    while (true) {
      const T* row = target + static_cast<int64_t>(retrieve[base + cur]) * a.target_stride;
      if (a.greedy) {
        token = ArgMax(row, a.vocab);
      } else {
        token = Draw(a.vocab, uniforms[base + cur], [&](int64_t i) { return speculative::Weight(ToFloat(row[i])); });
        if (token < 0) token = 0;  // a row without mass
      }
      int64_t next = -1;
      if (depth + 1 < w) {  // the first child, in sibling order, that carries the token
        for (int64_t c = next_token[base + cur]; c != -1; c = next_sibling[base + c]) {
          if (static_cast<int64_t>(candidates[base + c]) == token) {
            next = c;
            break;
          }
        }
      }
      if (next < 0) break;
      ++depth;
      index[depth] = static_cast<IdT>(next);
      tokens[depth - 1] = static_cast<IdT>(token);
      cur = next;
    }
    tokens[depth] = static_cast<IdT>(token);  // the correction or bonus token
    for (int64_t k = depth + 1; k < w; ++k) index[k] = tokens[k] = static_cast<IdT>(-1);
    acc_length[b] = static_cast<IdT>(depth);
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

/*!
 * \brief Tree verification (arguments: speculative.hpp). A malformed tree, a row index out of
 * range or a uniform outside [0, 1) raises ValueError before any write; workspace and error (CUDA's)
 * are ignored.
 */
inline void tree_speculative_verify(tvm::ffi::TensorView accepted_index, tvm::ffi::TensorView accepted_tokens,
                                    tvm::ffi::TensorView accepted_length, tvm::ffi::TensorView candidates,
                                    tvm::ffi::TensorView retrieve_index, tvm::ffi::TensorView next_token,
                                    tvm::ffi::TensorView next_sibling, tvm::ffi::TensorView target,
                                    tvm::ffi::TensorView uniforms, bool greedy, tvm::ffi::TensorView workspace,
                                    tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a = speculative::VerifyTree<kDLCPU>(accepted_index, accepted_tokens, accepted_length, candidates,
                                                 retrieve_index, next_token, next_sibling, target, uniforms, greedy,
                                                 workspace, error);
  if (a.empty()) return;
  host::DispatchFloat<kDLCPU>(a.target_dtype, [&]<typename T>() {
    host::DispatchIndex(a.id_dtype, [&]<typename IdT>() {
      speculative_detail::Tree(data_ptr<IdT>(accepted_index), data_ptr<IdT>(accepted_tokens),
                               data_ptr<IdT>(accepted_length), data_ptr<const IdT>(candidates),
                               data_ptr<const IdT>(retrieve_index), data_ptr<const IdT>(next_token),
                               data_ptr<const IdT>(next_sibling), data_ptr<const T>(target),
                               greedy ? nullptr : data_ptr<const float>(uniforms), a);
    });
  });
}

}  // namespace mllm_kernel::cpu
