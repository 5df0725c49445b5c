/*!
 * \file kernels/prefill_attention/prefill_attention-inl.h
 * \brief Highway per-target body of the CPU prefill attention; prefill_attention.cpp's
 * HWY_TARGET_INCLUDE, so <hwy/foreach_target.h> re-includes it once per SIMD target (a toggling
 * guard, not #pragma once).
 *
 * One work item is (request, kv head, block of up to QueriesPerItem queries): its rows are the
 * block's queries times the kv head's G query heads. The item walks the keys any of its rows can
 * see in chunks of kChunk: each chunk's K and V rows are converted to float32 once and serve
 * every row (a K/V row comes from memory once per item, not once per query and head). The
 * queries are held transposed, so the chunk's logits come out as [key, row] with vector lanes
 * over rows: no horizontal sums, and the masks and the online-softmax step (running max m,
 * sum l) take a vector of rows at a time. Then each row's float32 accumulator o [D] updates.
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

inline constexpr int64_t kQueryBlock = 16;  // queries per work item at an even group size

/*! \brief Queries per work item: whole pairs of 16-lane vectors of rows (queries x group), so
 *  that an odd group (MHA's 1) pads no rows: kQueryBlock, doubled for odd groups. */
inline constexpr int64_t QueriesPerItem(size_t group) { return group % 2 == 0 ? kQueryBlock : 2 * kQueryBlock; }
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

inline constexpr size_t kRowAlign = 32;  // rows are padded to whole pairs of the widest vectors (2 x 16 lanes)

/*! \brief rows padded to kRowAlign. */
inline constexpr size_t PaddedRows(size_t rows) { return (rows + kRowAlign - 1) / kRowAlign * kRowAlign; }

// Scratch floats per worker, at most rp = PaddedRows(QueriesPerItem(group) * group) rows: q
// transposed [D, rp], o [rp, D], m, l, alpha, positions [rp], logits [kChunk, rp], K, V [kChunk, D].
inline constexpr size_t ScratchFloats(size_t group, size_t head_dim) {
  const size_t rp = PaddedRows(static_cast<size_t>(QueriesPerItem(group)) * group);
  return 2 * rp * head_dim + 4 * rp + rp * kChunk + 2 * kChunk * head_dim;
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
using mllm_kernel::cpu::prefill_attention_detail::QueriesPerItem;
using mllm_kernel::cpu::prefill_attention_detail::Problem;
using mllm_kernel::cpu::prefill_attention_detail::RequestRows;

// At most 16 float lanes: every head_dim (64, 128, 256) and kChunk is a multiple of Lanes().
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
using DI = hn::RebindToSigned<DF>;  // row positions, lane for lane with the logits

// The 4 x 2 register tile of both products: c_j0 += a_j x0, c_j1 += a_j x1 for 4 scalars a_j
// (broadcast) and 2 vectors. (Tiles are named variables, not arrays: SVE/RVV vectors cannot be
// array elements.)
HWY_INLINE void Tile4x2(DF df, float a0, float a1, float a2, float a3, VF x0, VF x1, VF& c00, VF& c01, VF& c10,
                        VF& c11, VF& c20, VF& c21, VF& c30, VF& c31) {
  const VF b0 = hn::Set(df, a0), b1 = hn::Set(df, a1), b2 = hn::Set(df, a2), b3 = hn::Set(df, a3);
  c00 = hn::MulAdd(b0, x0, c00);
  c01 = hn::MulAdd(b0, x1, c01);
  c10 = hn::MulAdd(b1, x0, c10);
  c11 = hn::MulAdd(b1, x1, c11);
  c20 = hn::MulAdd(b2, x0, c20);
  c21 = hn::MulAdd(b2, x1, c21);
  c30 = hn::MulAdd(b3, x0, c30);
  c31 = hn::MulAdd(b3, x1, c31);
}

// The logits of a chunk, transposed: s[t * rp + r] = dot(q_r, k_t) for the chunk's kChunk keys
// (rows of k, d apart; rows past the chunk's keys are zeros) and rp rows, whose queries are
// columns of qt [d, rp] (rp a multiple of 2 N). Lanes run over rows, so a dot product needs no
// horizontal sum: tiles of 4 keys x 2 row vectors, each step 2 loads of qt and 4 broadcast keys
// for 8 FMAs.
HWY_INLINE void LogitsT(const float* HWY_RESTRICT qt, size_t rp, const float* HWY_RESTRICT k, size_t d,
                        float* HWY_RESTRICT s) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (size_t t = 0; t < kChunk; t += 4) {
    const float* k0 = k + t * d;
    for (size_t r = 0; r < rp; r += 2 * N) {
      VF a00 = hn::Zero(df), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
      for (size_t i = 0; i < d; ++i) {
        const VF q0 = hn::LoadU(df, qt + i * rp + r), q1 = hn::LoadU(df, qt + i * rp + r + N);
        Tile4x2(df, k0[i], k0[d + i], k0[2 * d + i], k0[3 * d + i], q0, q1, a00, a01, a10, a11, a20, a21, a30, a31);
      }
      float* st = s + t * rp + r;
      hn::StoreU(a00, df, st);
      hn::StoreU(a01, df, st + N);
      hn::StoreU(a10, df, st + rp);
      hn::StoreU(a11, df, st + rp + N);
      hn::StoreU(a20, df, st + 2 * rp);
      hn::StoreU(a21, df, st + 2 * rp + N);
      hn::StoreU(a30, df, st + 3 * rp);
      hn::StoreU(a31, df, st + 3 * rp + N);
    }
  }
}

// The online-softmax step of rows [r, r + N) over the chunk's kChunk logits (-inf where masked or
// past the keys; s transposed, rows rp apart), overwritten with p = exp(s - m_new); returns
// alpha = exp(m_old - m_new), which rescales what o and l hold. A NaN logit stays NaN (hn::Exp
// would map it to 0).
HWY_INLINE VF SoftmaxStepT(float* HWY_RESTRICT s, size_t rp, float* HWY_RESTRICT m, float* HWY_RESTRICT l) {
  const DF df;
  const VF neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  VF vmax = hn::LoadU(df, m);
  const VF m_old = vmax;
  for (size_t t = 0; t < kChunk; ++t) vmax = hn::Max(vmax, hn::LoadU(df, s + t * rp));
  const VF ref = hn::IfThenZeroElse(hn::Eq(vmax, neg_inf), vmax);  // no key yet: subtract 0, not -inf
  const VF alpha = hn::Exp(df, hn::Sub(m_old, ref));
  VF vsum = hn::Zero(df);
  for (size_t t = 0; t < kChunk; ++t) {
    const VF x = hn::Sub(hn::LoadU(df, s + t * rp), ref);
    const VF p = hn::IfThenElse(hn::IsNaN(x), x, hn::Exp(df, x));
    hn::StoreU(p, df, s + t * rp);
    vsum = hn::Add(vsum, p);
  }
  hn::StoreU(hn::MulAdd(hn::LoadU(df, l), alpha, vsum), df, l);
  hn::StoreU(vmax, df, m);
  return alpha;
}

// o_r = o_r * alpha_r + sum_{t < n} p[t * rp + r] v_t for 4 rows of o (d apart), 2 vectors
// of d per pass: 8 accumulators share each V load.
HWY_INLINE void Accumulate4(float* HWY_RESTRICT o, const float* HWY_RESTRICT alpha, const float* HWY_RESTRICT p,
                            size_t rp, const float* HWY_RESTRICT v, size_t n, size_t d) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF w0 = hn::Set(df, alpha[0]), w1 = hn::Set(df, alpha[1]), w2 = hn::Set(df, alpha[2]), w3 = hn::Set(df, alpha[3]);
  for (size_t i = 0; i < d; i += 2 * N) {
    VF a0 = hn::Mul(hn::LoadU(df, o + i), w0), b0 = hn::Mul(hn::LoadU(df, o + i + N), w0);
    VF a1 = hn::Mul(hn::LoadU(df, o + d + i), w1), b1 = hn::Mul(hn::LoadU(df, o + d + i + N), w1);
    VF a2 = hn::Mul(hn::LoadU(df, o + 2 * d + i), w2), b2 = hn::Mul(hn::LoadU(df, o + 2 * d + i + N), w2);
    VF a3 = hn::Mul(hn::LoadU(df, o + 3 * d + i), w3), b3 = hn::Mul(hn::LoadU(df, o + 3 * d + i + N), w3);
    for (size_t t = 0; t < n; ++t) {
      const float* pt = p + t * rp;
      const VF v0 = hn::LoadU(df, v + t * d + i), v1 = hn::LoadU(df, v + t * d + i + N);
      Tile4x2(df, pt[0], pt[1], pt[2], pt[3], v0, v1, a0, b0, a1, b1, a2, b2, a3, b3);
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
HWY_INLINE void Accumulate1(float* HWY_RESTRICT o, float alpha, const float* HWY_RESTRICT p, size_t rp,
                            const float* HWY_RESTRICT v, size_t n, size_t d) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF w = hn::Set(df, alpha);
  for (size_t i = 0; i < d; i += 2 * N) {
    VF a = hn::Mul(hn::LoadU(df, o + i), w), b = hn::Mul(hn::LoadU(df, o + i + N), w);
    for (size_t t = 0; t < n; ++t) {
      const VF pv = hn::Set(df, p[t * rp]);
      a = hn::MulAdd(pv, hn::LoadU(df, v + t * d + i), a);
      b = hn::MulAdd(pv, hn::LoadU(df, v + t * d + i + N), b);
    }
    hn::StoreU(a, df, o + i);
    hn::StoreU(b, df, o + i + N);
  }
}

HWY_INLINE void Accumulate(float* HWY_RESTRICT o, size_t rows, const float* HWY_RESTRICT alpha,
                           const float* HWY_RESTRICT p, size_t rp, const float* HWY_RESTRICT v, size_t n, size_t d) {
  size_t r = 0;
  for (; r + 4 <= rows; r += 4) Accumulate4(o + r * d, alpha + r, p + r, rp, v, n, d);
  for (; r < rows; ++r) Accumulate1(o + r * d, alpha[r], p + r, rp, v, n, d);
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
  const int64_t per_item = QueriesPerItem(group);
  const int64_t queries = rq.len_q - j0 < per_item ? rq.len_q - j0 : per_item;
  const size_t rows = static_cast<size_t>(queries) * group;  // row r: query j0 + r / G, head kvh G + r % G
  const bool upper = (a.causal && pr.mask == nullptr) || a.window > 0;

  const size_t rp = mllm_kernel::cpu::prefill_attention_detail::PaddedRows(rows);
  float* qt = scratch;              // [d, rp] queries, float32, scale (/ cap) folded in, transposed
  float* o = qt + d * rp;           // [rp, d] unnormalized outputs
  float* m = o + rp * d;            // [rp] running max
  float* l = m + rp;                // [rp] running sum
  float* alpha = l + rp;            // [rp] this chunk's rescale factors
  int32_t* pos = reinterpret_cast<int32_t*>(alpha + rp);  // [rp] each row's position among the keys
  float* s = alpha + 2 * rp;        // [kChunk, rp] logits, then probabilities (transposed)
  float* kf = s + kChunk * rp;      // [kChunk, d] the chunk's keys
  float* vf = kf + kChunk * d;      // [kChunk, d] and values

  const float cap = a.soft_cap;
  const float qscale = cap > 0.0f ? a.scale / cap : a.scale;
  const int64_t shift = rq.len_k - rq.len_q;  // query j sits at position j + shift
  const VF vscale = hn::Set(df, qscale);
  for (size_t r = 0; r < rp; ++r) {  // padded rows: zero queries, never stored
    float* row = o + r * d;          // the row's float32 query on its way into qt, then its o
    if (r < rows) {
      const int64_t token = rq.q_start + j0 + static_cast<int64_t>(r / group);
      const T* src = q + token * a.q_stride + (kvh * static_cast<int64_t>(group) + static_cast<int64_t>(r % group)) * a.head_dim;
      for (size_t i = 0; i < d; i += N) hn::StoreU(hn::Mul(LoadF32(df, src + i), vscale), df, row + i);
      for (size_t i = 0; i < d; ++i) qt[i * rp + r] = row[i];
    } else {
      for (size_t i = 0; i < d; ++i) qt[i * rp + r] = 0.0f;
    }
    for (size_t i = 0; i < d; i += N) hn::StoreU(hn::Zero(df), df, row + i);
    m[r] = kNegInf;
    l[r] = 0.0f;
    pos[r] = static_cast<int32_t>(j0 + static_cast<int64_t>((r < rows ? r : rows - 1) / group) + shift);
  }

  // Keys any row of the block can see: [lo, hi).
  const int64_t pos_first = j0 + shift, pos_last = j0 + queries - 1 + shift;
  int64_t hi = rq.len_k, lo = 0;
  if (upper) hi = pos_last + 1 < hi ? pos_last + 1 : hi;
  if (a.window > 0 && pos_first - a.window + 1 > lo) lo = pos_first - a.window + 1;
  const int64_t row_elems = a.num_kv_heads * a.head_dim;  // a token's row (paged, in a block)
  const DI di;
  const VF neg_inf = hn::Set(df, kNegInf);
  // Keys (int32 by the contract) and positions fit int32; a window wider than every key keeps all.
  const auto vwindow = hn::Set(di, static_cast<int32_t>(a.window < rq.len_k + 1 ? a.window : rq.len_k + 1));
  for (int64_t c0 = lo; c0 < hi; c0 += static_cast<int64_t>(kChunk)) {
    const size_t n = static_cast<size_t>(hi - c0 < static_cast<int64_t>(kChunk) ? hi - c0 : kChunk);
    for (size_t t = 0; t < kChunk; ++t) {  // the chunk's K and V rows as float32 (zeros past n)
      if (t >= n) {
        for (size_t i = 0; i < d; i += N) {
          hn::StoreU(hn::Zero(df), df, kf + t * d + i);
          hn::StoreU(hn::Zero(df), df, vf + t * d + i);
        }
        continue;
      }
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
    LogitsT(qt, rp, kf, d, s);
    if (cap > 0.0f) {  // before the masks: cap * tanh(-inf) would be -cap
      for (size_t t = 0; t < n; ++t) {
        for (size_t r = 0; r < rows; ++r) s[t * rp + r] = cap * std::tanh(s[t * rp + r]);
      }
    }
    // Masks: keys past n; the causal and window rules by row position (vectors); a custom mask
    // per element. A chunk whose keys all pass every row's rules needs no test.
    const int64_t last = c0 + static_cast<int64_t>(kChunk) - 1;
    const bool whole = n == kChunk && pr.mask == nullptr && (!upper || last <= pos_first) &&
                       (a.window <= 0 || c0 > pos_last - a.window);
    if (!whole) {
      for (size_t t = 0; t < kChunk; ++t) {
        const int64_t key = c0 + static_cast<int64_t>(t);
        float* st = s + t * rp;
        if (t >= n) {
          for (size_t r = 0; r < rp; r += N) hn::StoreU(neg_inf, df, st + r);
          continue;
        }
        const auto vkey = hn::Set(di, static_cast<int32_t>(key));
        for (size_t r = 0; r < rp; r += N) {
          const auto vpos = hn::LoadU(di, pos + r);
          auto keep = hn::FirstN(df, N);
          if (upper) keep = hn::RebindMask(df, hn::Ge(vpos, vkey));  // key <= pos
          if (a.window > 0) keep = hn::And(keep, hn::RebindMask(df, hn::Gt(vkey, hn::Sub(vpos, vwindow))));
          hn::StoreU(hn::IfThenElse(keep, hn::LoadU(df, st + r), neg_inf), df, st + r);
        }
        if (pr.mask != nullptr) {
          for (size_t r = 0; r < rows; ++r) {
            const int64_t j = j0 + static_cast<int64_t>(r / group);
            if (pr.mask[rq.mask_offset + j * rq.len_k + key] == 0) st[r] = kNegInf;
          }
        }
      }
    }
    for (size_t r = 0; r < rp; r += N) hn::StoreU(SoftmaxStepT(s + r, rp, m + r, l + r), df, alpha + r);
    Accumulate(o, rows, alpha, s, rp, vf, n, d);
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
