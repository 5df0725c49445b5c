/*!
 * \file kernels/prefill_attention/prefill_attention-inl.h
 * \brief Highway per-target body of the CPU prefill attention; prefill_attention.cpp's
 * HWY_TARGET_INCLUDE, so <hwy/foreach_target.h> re-includes it once per SIMD target (a toggling
 * guard, not #pragma once).
 *
 * One work item is (request, kv head, block of up to kQueryBlock queries): its rows are the
 * block's queries times the kv head's G query heads. The item walks the keys any of its rows can
 * see in chunks of kChunk: each chunk's K and V rows are converted to float32 once and serve
 * every row (a K/V row comes from memory once per item, not once per query and head); per row,
 * the logits, the per-key masks, an online-softmax step (running max m, sum l) and the float32
 * accumulator o [D] update.
 */
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "prefill_attention.hpp"

#ifndef MLLM_KERNEL_PREFILL_ATTENTION_ITEMS_
#define MLLM_KERNEL_PREFILL_ATTENTION_ITEMS_
namespace mllm_kernel::cpu::prefill_attention_detail {

inline constexpr int64_t kQueryBlock = 16;  // queries per work item
inline constexpr size_t kChunk = 16;       // keys per online-softmax step

/*! \brief One request's clamped-free (validated) geometry and where its keys live. */
struct RequestRows {
  int64_t q_start, len_q, len_k;
  int64_t k_start;         // ragged: the first key row
  const int32_t* table;    // paged: the block-table row (nullptr: ragged)
  int64_t mask_offset;     // custom mask: the request's first entry
};

/*! \brief Everything a work item reads besides the tensors' data pointers. */
struct Problem {
  const RequestRows* requests;
  const uint8_t* mask;  // nullptr: no custom mask
  mllm_kernel::prefill_attention::PrefillArgs args;
};

// Scratch floats per worker: q, o [rows, D], m, l, alpha [rows], logits [rows, kChunk], K, V [kChunk, D].
inline constexpr size_t ScratchFloats(size_t group, size_t head_dim) {
  const size_t rows = static_cast<size_t>(kQueryBlock) * group;
  return 2 * rows * head_dim + 3 * rows + rows * kChunk + 2 * kChunk * head_dim;
}

}  // namespace mllm_kernel::cpu::prefill_attention_detail
#endif

#if defined(MLLM_KERNEL_PREFILL_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MLLM_KERNEL_PREFILL_ATTENTION_INL_H_
#undef MLLM_KERNEL_PREFILL_ATTENTION_INL_H_
#else
#define MLLM_KERNEL_PREFILL_ATTENTION_INL_H_
#endif
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>  // per target, like this file
#include <mllm_kernel/cpu/simd_io-inl.h>

HWY_BEFORE_NAMESPACE();
namespace mllm_kernel::cpu::HWY_NAMESPACE {
namespace prefill_attention_detail {
namespace hn = hwy::HWY_NAMESPACE;
using mllm_kernel::cpu::prefill_attention_detail::kChunk;
using mllm_kernel::cpu::prefill_attention_detail::kQueryBlock;
using mllm_kernel::cpu::prefill_attention_detail::Problem;
using mllm_kernel::cpu::prefill_attention_detail::RequestRows;

// At most 16 float lanes: every head_dim (64, 128, 256) and kChunk is a multiple of Lanes().
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;

// s[r * kChunk + t] = dot(q_r, k_t) for `rows` rows of q (d apart) and the chunk's n keys (rows
// of k, d apart). Register tiles of 4 rows x 2 keys: 8 independent FMA chains and 6 loads per 8
// FMAs, one horizontal sum per dot product. (Tiles are named variables, not arrays: SVE/RVV
// vectors cannot be array elements.)
HWY_INLINE void Logits4x2(const float* HWY_RESTRICT q, const float* HWY_RESTRICT k, size_t d, float* HWY_RESTRICT s) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF a00 = hn::Zero(df), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
  for (size_t i = 0; i < d; i += N) {
    const VF k0 = hn::LoadU(df, k + i), k1 = hn::LoadU(df, k + d + i);
    const VF q0 = hn::LoadU(df, q + i), q1 = hn::LoadU(df, q + d + i);
    const VF q2 = hn::LoadU(df, q + 2 * d + i), q3 = hn::LoadU(df, q + 3 * d + i);
    a00 = hn::MulAdd(q0, k0, a00);
    a01 = hn::MulAdd(q0, k1, a01);
    a10 = hn::MulAdd(q1, k0, a10);
    a11 = hn::MulAdd(q1, k1, a11);
    a20 = hn::MulAdd(q2, k0, a20);
    a21 = hn::MulAdd(q2, k1, a21);
    a30 = hn::MulAdd(q3, k0, a30);
    a31 = hn::MulAdd(q3, k1, a31);
  }
  s[0] = hn::ReduceSum(df, a00);
  s[1] = hn::ReduceSum(df, a01);
  s[kChunk] = hn::ReduceSum(df, a10);
  s[kChunk + 1] = hn::ReduceSum(df, a11);
  s[2 * kChunk] = hn::ReduceSum(df, a20);
  s[2 * kChunk + 1] = hn::ReduceSum(df, a21);
  s[3 * kChunk] = hn::ReduceSum(df, a30);
  s[3 * kChunk + 1] = hn::ReduceSum(df, a31);
}

// One row against up to `n` keys, two at a time (two FMA chains).
HWY_INLINE void LogitsRow(const float* HWY_RESTRICT q, const float* HWY_RESTRICT k, size_t n, size_t d,
                          float* HWY_RESTRICT s) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t t = 0;
  for (; t + 2 <= n; t += 2) {
    VF a0 = hn::Zero(df), a1 = a0;
    for (size_t i = 0; i < d; i += N) {
      const VF qv = hn::LoadU(df, q + i);
      a0 = hn::MulAdd(qv, hn::LoadU(df, k + t * d + i), a0);
      a1 = hn::MulAdd(qv, hn::LoadU(df, k + (t + 1) * d + i), a1);
    }
    s[t] = hn::ReduceSum(df, a0);
    s[t + 1] = hn::ReduceSum(df, a1);
  }
  if (t < n) {
    VF a = hn::Zero(df);
    for (size_t i = 0; i < d; i += N) a = hn::MulAdd(hn::LoadU(df, q + i), hn::LoadU(df, k + t * d + i), a);
    s[t] = hn::ReduceSum(df, a);
  }
}

HWY_INLINE void Logits(const float* HWY_RESTRICT q, size_t rows, const float* HWY_RESTRICT k, size_t n, size_t d,
                       float* HWY_RESTRICT s) {
  size_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    size_t t = 0;
    for (; t + 2 <= n; t += 2) Logits4x2(q + r * d, k + t * d, d, s + r * kChunk + t);
    if (t < n) {
      for (size_t rr = r; rr < r + 4; ++rr) LogitsRow(q + rr * d, k + t * d, n - t, d, s + rr * kChunk + t);
    }
  }
  for (; r < rows; ++r) LogitsRow(q + r * d, k, n, d, s + r * kChunk);
}

// The online-softmax step of one row over kChunk logits (-inf where masked or past the keys),
// overwritten with p = exp(s - m_new); returns alpha = exp(m_old - m_new), which rescales what o
// and l hold. A NaN logit stays NaN (hn::Exp would map it to 0).
HWY_INLINE float SoftmaxStep(float* HWY_RESTRICT s, float& m, float& l) {
  const DF df;
  const size_t N = hn::Lanes(df);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  VF vmax = hn::Set(df, kNegInf);
  for (size_t t = 0; t < kChunk; t += N) vmax = hn::Max(vmax, hn::LoadU(df, s + t));
  const float chunk_max = hn::ReduceMax(df, vmax);
  const float m_new = m < chunk_max ? chunk_max : m;
  const float ref = m_new == kNegInf ? 0.0f : m_new;  // no key yet: subtract 0, not -inf
  const float alpha = std::exp(m - ref);
  const VF vref = hn::Set(df, ref);
  VF vsum = hn::Zero(df);
  for (size_t t = 0; t < kChunk; t += N) {
    const VF x = hn::Sub(hn::LoadU(df, s + t), vref);
    const VF p = hn::IfThenElse(hn::IsNaN(x), x, hn::Exp(df, x));
    hn::StoreU(p, df, s + t);
    vsum = hn::Add(vsum, p);
  }
  l = l * alpha + hn::ReduceSum(df, vsum);
  m = m_new;
  return alpha;
}

// o_r = o_r * alpha_r + sum_{t < n} p[r * kChunk + t] v_t for 4 rows of o (d apart), 2 vectors
// of d per pass: 8 accumulators share each V load.
HWY_INLINE void Accumulate4(float* HWY_RESTRICT o, const float* HWY_RESTRICT alpha, const float* HWY_RESTRICT p,
                            const float* HWY_RESTRICT v, size_t n, size_t d) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF w0 = hn::Set(df, alpha[0]), w1 = hn::Set(df, alpha[1]), w2 = hn::Set(df, alpha[2]), w3 = hn::Set(df, alpha[3]);
  for (size_t i = 0; i < d; i += 2 * N) {
    VF a0 = hn::Mul(hn::LoadU(df, o + i), w0), b0 = hn::Mul(hn::LoadU(df, o + i + N), w0);
    VF a1 = hn::Mul(hn::LoadU(df, o + d + i), w1), b1 = hn::Mul(hn::LoadU(df, o + d + i + N), w1);
    VF a2 = hn::Mul(hn::LoadU(df, o + 2 * d + i), w2), b2 = hn::Mul(hn::LoadU(df, o + 2 * d + i + N), w2);
    VF a3 = hn::Mul(hn::LoadU(df, o + 3 * d + i), w3), b3 = hn::Mul(hn::LoadU(df, o + 3 * d + i + N), w3);
    for (size_t t = 0; t < n; ++t) {
      const VF v0 = hn::LoadU(df, v + t * d + i), v1 = hn::LoadU(df, v + t * d + i + N);
      const VF p0 = hn::Set(df, p[t]), p1 = hn::Set(df, p[kChunk + t]);
      const VF p2 = hn::Set(df, p[2 * kChunk + t]), p3 = hn::Set(df, p[3 * kChunk + t]);
      a0 = hn::MulAdd(p0, v0, a0);
      b0 = hn::MulAdd(p0, v1, b0);
      a1 = hn::MulAdd(p1, v0, a1);
      b1 = hn::MulAdd(p1, v1, b1);
      a2 = hn::MulAdd(p2, v0, a2);
      b2 = hn::MulAdd(p2, v1, b2);
      a3 = hn::MulAdd(p3, v0, a3);
      b3 = hn::MulAdd(p3, v1, b3);
    }
    hn::StoreU(a0, df, o + i);
    hn::StoreU(b0, df, o + i + N);
    hn::StoreU(a1, df, o + d + i);
    hn::StoreU(b1, df, o + d + i + N);
    hn::StoreU(a2, df, o + 2 * d + i);
    hn::StoreU(b2, df, o + 2 * d + i + N);
    hn::StoreU(a3, df, o + 3 * d + i);
    hn::StoreU(b3, df, o + 3 * d + i + N);
  }
}

// The same for one row.
HWY_INLINE void Accumulate1(float* HWY_RESTRICT o, float alpha, const float* HWY_RESTRICT p,
                            const float* HWY_RESTRICT v, size_t n, size_t d) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF w = hn::Set(df, alpha);
  for (size_t i = 0; i < d; i += 2 * N) {
    VF a = hn::Mul(hn::LoadU(df, o + i), w), b = hn::Mul(hn::LoadU(df, o + i + N), w);
    for (size_t t = 0; t < n; ++t) {
      const VF pv = hn::Set(df, p[t]);
      a = hn::MulAdd(pv, hn::LoadU(df, v + t * d + i), a);
      b = hn::MulAdd(pv, hn::LoadU(df, v + t * d + i + N), b);
    }
    hn::StoreU(a, df, o + i);
    hn::StoreU(b, df, o + i + N);
  }
}

HWY_INLINE void Accumulate(float* HWY_RESTRICT o, size_t rows, const float* HWY_RESTRICT alpha,
                           const float* HWY_RESTRICT p, const float* HWY_RESTRICT v, size_t n, size_t d) {
  size_t r = 0;
  for (; r + 4 <= rows; r += 4) Accumulate4(o + r * d, alpha + r, p + r * kChunk, v, n, d);
  for (; r < rows; ++r) Accumulate1(o + r * d, alpha[r], p + r * kChunk, v, n, d);
}

// Work item `item` = (request b, kv head, query block); the caller validated every index.
template <typename T>
HWY_INLINE void AttendItem(T* HWY_RESTRICT out, float* HWY_RESTRICT lse, const T* q, const T* k, const T* v,
                           const Problem& pr, int64_t b, int64_t kvh, int64_t j0, float* HWY_RESTRICT scratch) {
  const DF df;
  const size_t N = hn::Lanes(df);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const auto& a = pr.args;
  const RequestRows& rq = pr.requests[b];
  const auto d = static_cast<size_t>(a.head_dim);
  const auto group = static_cast<size_t>(a.group());
  const int64_t queries = rq.len_q - j0 < kQueryBlock ? rq.len_q - j0 : kQueryBlock;
  const size_t rows = static_cast<size_t>(queries) * group;  // row r: query j0 + r / G, head kvh G + r % G
  const int64_t shift = rq.len_k - rq.len_q;                   // query j sits at position j + shift
  const bool upper = (a.causal && pr.mask == nullptr) || a.window > 0;

  float* qf = scratch;              // [rows, d] queries, float32, scale (/ cap) folded in
  float* o = qf + rows * d;         // [rows, d] unnormalized outputs
  float* m = o + rows * d;          // [rows] running max
  float* l = m + rows;              // [rows] running sum
  float* s = l + rows;              // [rows, kChunk] logits, then probabilities
  float* kf = s + rows * kChunk;    // [kChunk, d] the chunk's keys
  float* vf = kf + kChunk * d;      // [kChunk, d] and values
  float* alpha = vf + kChunk * d;   // [rows] this chunk's rescale factors

  const float cap = a.soft_cap;
  const VF vscale = hn::Set(df, cap > 0.0f ? a.scale / cap : a.scale);
  for (size_t r = 0; r < rows; ++r) {
    const int64_t token = rq.q_start + j0 + static_cast<int64_t>(r / group);
    const T* src = q + token * a.q_stride + (kvh * static_cast<int64_t>(group) + static_cast<int64_t>(r % group)) * a.head_dim;
    for (size_t i = 0; i < d; i += N) {
      hn::StoreU(hn::Mul(LoadF32(df, src + i), vscale), df, qf + r * d + i);
      hn::StoreU(hn::Zero(df), df, o + r * d + i);
    }
    m[r] = kNegInf;
    l[r] = 0.0f;
  }

  // Keys any row of the block can see: [lo, hi).
  const int64_t pos_first = j0 + shift, pos_last = j0 + queries - 1 + shift;
  int64_t hi = rq.len_k, lo = 0;
  if (upper) hi = pos_last + 1 < hi ? pos_last + 1 : hi;
  if (a.window > 0 && pos_first - a.window + 1 > lo) lo = pos_first - a.window + 1;
  const int64_t row_elems = a.num_kv_heads * a.head_dim;  // a token's row (paged, in a block)
  for (int64_t c0 = lo; c0 < hi; c0 += static_cast<int64_t>(kChunk)) {
    const size_t n = static_cast<size_t>(hi - c0 < static_cast<int64_t>(kChunk) ? hi - c0 : kChunk);
    for (size_t t = 0; t < n; ++t) {  // the chunk's K and V rows as float32
      const int64_t key = c0 + static_cast<int64_t>(t);
      const T *krow, *vrow;
      if (rq.table != nullptr) {
        const int64_t block = rq.table[key / a.block_size];
        const int64_t slot = (key % a.block_size) * row_elems + kvh * a.head_dim;
        krow = k + block * a.k_stride + slot;
        vrow = v + block * a.v_stride + slot;
      } else {
        krow = k + (rq.k_start + key) * a.k_stride + kvh * a.head_dim;
        vrow = v + (rq.k_start + key) * a.v_stride + kvh * a.head_dim;
      }
      for (size_t i = 0; i < d; i += N) {
        hn::StoreU(LoadF32(df, krow + i), df, kf + t * d + i);
        hn::StoreU(LoadF32(df, vrow + i), df, vf + t * d + i);
      }
    }
    Logits(qf, rows, kf, n, d, s);
    for (size_t r = 0; r < rows; ++r) {
      float* sr = s + r * kChunk;
      const int64_t j = j0 + static_cast<int64_t>(r / group), pos = j + shift;
      const int64_t last = c0 + static_cast<int64_t>(kChunk) - 1;
      // A chunk whose keys all pass this row's rules needs no per-key test.
      const bool whole = n == kChunk && pr.mask == nullptr && (!upper || last <= pos) &&
                         (a.window <= 0 || c0 > pos - a.window);
      if (cap > 0.0f) {  // before the masks: cap * tanh(-inf) would be -cap
        for (size_t t = 0; t < n; ++t) sr[t] = cap * std::tanh(sr[t]);
      }
      if (!whole) {
        for (size_t t = 0; t < kChunk; ++t) {
          const int64_t key = c0 + static_cast<int64_t>(t);
          bool keep = t < n;
          if (keep && pr.mask != nullptr) keep = pr.mask[rq.mask_offset + j * rq.len_k + key] != 0;
          if (keep && upper) keep = key <= pos;
          if (keep && a.window > 0) keep = key > pos - a.window;
          if (!keep) sr[t] = kNegInf;
        }
      }
      alpha[r] = SoftmaxStep(sr, m[r], l[r]);
    }
    Accumulate(o, rows, alpha, s, vf, n, d);
  }

  for (size_t r = 0; r < rows; ++r) {
    const int64_t token = rq.q_start + j0 + static_cast<int64_t>(r / group);
    const int64_t head = kvh * static_cast<int64_t>(group) + static_cast<int64_t>(r % group);
    T* dst = out + (token * a.num_heads + head) * a.head_dim;
    // No key: 0 and -inf. NaN stays NaN (l is NaN then).
    const VF inv = hn::Set(df, l[r] == 0.0f ? 0.0f : 1.0f / l[r]);
    for (size_t i = 0; i < d; i += N) StoreF32(df, hn::Mul(hn::LoadU(df, o + r * d + i), inv), dst + i);
    lse[token * a.num_heads + head] = l[r] == 0.0f ? kNegInf : m[r] + std::log(l[r]);
  }
}

// Worker loop: items from the shared counter; item i = (entry i / KH of `blocks`, kv head i % KH),
// blocks[e] = request << 32 | first query of the block.
template <typename T>
HWY_NOINLINE void AttendItems(T* HWY_RESTRICT out, float* HWY_RESTRICT lse, const T* q, const T* k, const T* v,
                              const Problem& pr, const int64_t* blocks, int64_t num_items,
                              std::atomic<int64_t>* next, float* HWY_RESTRICT scratch) {
  for (int64_t i = next->fetch_add(1, std::memory_order_relaxed); i < num_items;
       i = next->fetch_add(1, std::memory_order_relaxed)) {
    const int64_t entry = blocks[i / pr.args.num_kv_heads];
    AttendItem(out, lse, q, k, v, pr, entry >> 32, i % pr.args.num_kv_heads, entry & 0xFFFFFFFF, scratch);
  }
}

}  // namespace prefill_attention_detail
}  // namespace mllm_kernel::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MLLM_KERNEL_PREFILL_ATTENTION_INL_H_ toggle
