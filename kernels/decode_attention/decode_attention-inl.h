/*!
 * \file kernels/decode_attention/decode_attention-inl.h
 * \brief Highway per-target body of the CPU decode attention and merge_attention_states kernels;
 * decode_attention.cpp's HWY_TARGET_INCLUDE, so <hwy/foreach_target.h> re-includes it once per
 * SIMD target (a toggling guard, not #pragma once).
 *
 * decode: one work item is a request and a run of its kv heads (all of them unless more items
 * are needed to feed the threads). The item walks the request's keys in chunks of 16 or 32 tokens;
 * per chunk, each kv head's G = num_heads / num_kv_heads query heads take their logits, online
 * softmax step (running max m, running sum l) and float32 accumulator o [G, head_dim] update
 * together, so each K/V row comes from memory once per group, not once per query head.
 */
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "decode_attention.hpp"

#ifndef MLLM_KERNEL_DECODE_ATTENTION_TYPES_
#define MLLM_KERNEL_DECODE_ATTENTION_TYPES_
namespace mllm_kernel::cpu::decode_attention_detail {
// The element types of one instantiation as one template argument (HWY_EXPORT_T takes a
// function name, which cannot contain the comma of two): Q of q and out, KV of the caches.
template <typename QType, typename KVType>
struct Types {
  using Q = QType;
  using KV = KVType;
};
}  // namespace mllm_kernel::cpu::decode_attention_detail
#endif

#if defined(MLLM_KERNEL_DECODE_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MLLM_KERNEL_DECODE_ATTENTION_INL_H_
#undef MLLM_KERNEL_DECODE_ATTENTION_INL_H_
#else
#define MLLM_KERNEL_DECODE_ATTENTION_INL_H_
#endif
#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>  // per target, like this file
#include <mllm_kernel/cpu/simd_io-inl.h>

HWY_BEFORE_NAMESPACE();
namespace mllm_kernel::cpu::HWY_NAMESPACE {
namespace decode_attention_detail {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 float lanes (all of AVX-512, a cap elsewhere): Lanes() is then a power of two
// <= 16, so the 4-vector steps below divide every head_dim (64, 128, 256) and one vector
// divides a chunk (kMinChunk or kChunk keys). No tails anywhere in the decode kernel.
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;

inline constexpr size_t kChunk = 32;   // most keys per online-softmax step
inline constexpr size_t kMinChunk = 16;  // fewest, for wide rows (see ChunkKeys)
inline constexpr size_t kKeyPad = 8;   // a chunk's key count is padded to a multiple of this
inline constexpr size_t kMaxTile = 4;  // query heads per register tile

// Keys per chunk: the next chunk's K and V rows are prefetched while this one computes, so two
// chunks of rows should fit in L2 (half of a 512 KiB one: 32 keys of 2 KiB rows, bf16 with 8
// kv heads of 128); fuller chunks amortize the softmax step. row_bytes: one token's K row.
inline constexpr size_t ChunkKeys(size_t row_bytes) {
  return 2 * kChunk * row_bytes <= (size_t{128} << 10) ? kChunk : kMinChunk;
}

// Scratch floats one work item of `heads` query heads (kv heads in the item * group) needs;
// the entry point allocates them per thread.
inline constexpr size_t ScratchFloats(size_t heads, size_t group, size_t head_dim) {
  return heads * (2 * head_dim + 2) + group * kChunk;
}

// The I-th argument. Register tiles are named variables, not arrays: SVE/RVV vectors are
// sizeless types that cannot be array elements.
template <size_t I, class V, class... Rest>
HWY_INLINE V Pick(V v, Rest... rest) {
  if constexpr (I == 0) {
    return v;
  } else {
    return Pick<I - 1>(rest...);
  }
}

// s[h * kChunk + t] = dot(q_h, k_t) for HT query heads (rows of q, d apart) and TT keys (at
// kp[t] + off): HT * TT independent FMA chains; each key vector is promoted once for the HT heads.
template <size_t HT, size_t TT, typename T>
HWY_INLINE void LogitsTile(const float* HWY_RESTRICT q, const T* const* kp, size_t off, size_t d,
                           float* HWY_RESTRICT s) {
  static_assert(HT * TT <= 8 && HT <= kMaxTile && TT <= kKeyPad);
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF z = hn::Zero(df);
  VF a0 = z, a1 = z, a2 = z, a3 = z, a4 = z, a5 = z, a6 = z, a7 = z;
  for (size_t i = 0; i < d; i += N) {
#define MLLM_DA_KEY(t) [[maybe_unused]] const VF k##t = (t) < TT ? LoadF32(df, kp[(t) % TT] + off + i) : z
#define MLLM_DA_QRY(h) [[maybe_unused]] const VF q##h = (h) < HT ? hn::LoadU(df, q + ((h) % HT) * d + i) : z
#define MLLM_DA_FMA(j)                                                                            \
  if constexpr ((j) < HT * TT) {                                                                  \
    a##j = hn::MulAdd(Pick<(j) / TT>(q0, q1, q2, q3), Pick<(j) % TT>(k0, k1, k2, k3, k4, k5, k6, k7), \
                      a##j);                                                                      \
  }
    MLLM_DA_KEY(0); MLLM_DA_KEY(1); MLLM_DA_KEY(2); MLLM_DA_KEY(3);
    MLLM_DA_KEY(4); MLLM_DA_KEY(5); MLLM_DA_KEY(6); MLLM_DA_KEY(7);
    MLLM_DA_QRY(0); MLLM_DA_QRY(1); MLLM_DA_QRY(2); MLLM_DA_QRY(3);
    MLLM_DA_FMA(0) MLLM_DA_FMA(1) MLLM_DA_FMA(2) MLLM_DA_FMA(3)
    MLLM_DA_FMA(4) MLLM_DA_FMA(5) MLLM_DA_FMA(6) MLLM_DA_FMA(7)
#undef MLLM_DA_KEY
#undef MLLM_DA_QRY
#undef MLLM_DA_FMA
  }
#define MLLM_DA_SUM(j) \
  if constexpr ((j) < HT * TT) s[((j) / TT) * kChunk + (j) % TT] = hn::ReduceSum(df, a##j);
  MLLM_DA_SUM(0) MLLM_DA_SUM(1) MLLM_DA_SUM(2) MLLM_DA_SUM(3)
  MLLM_DA_SUM(4) MLLM_DA_SUM(5) MLLM_DA_SUM(6) MLLM_DA_SUM(7)
#undef MLLM_DA_SUM
}

// Prefetches the next chunk's rows (the item's kv heads of each token: one contiguous span) in
// address order, a few lines per Step(), one Step() per register tile of this chunk's work.
// Without it the loads stall on memory: the blocks are scattered and the item reads each span
// head by head, which the hardware prefetchers do not follow. Finer steps matter too: a burst of
// requests stalls on the full miss queue instead of overlapping with the FMAs.
template <typename T>
struct RowPrefetcher {
  const T* const* kp;  // the next chunk's rows (kp[t] + kv0 * head_dim: the item's span)
  const T* const* vp;
  size_t rows = 0, span_bytes = 0, lines_per_step = 0;
  size_t t = 0, off = 0;  // cursor

  HWY_INLINE void Step() {
    constexpr size_t kLine = 64;
    for (size_t i = 0; i < lines_per_step && t < rows; ++i) {
      hwy::Prefetch(reinterpret_cast<const char*>(kp[t]) + off);
      hwy::Prefetch(reinterpret_cast<const char*>(vp[t]) + off);
      off += kLine;
      if (off >= span_bytes) {
        off = 0;
        ++t;
      }
    }
  }
};

// o[h] += sum_{t < n} p[h * kChunk + t] * v_t for HT heads (rows of o, d apart) and values at
// vp[t] + off, DV vectors of the head dim per pass: HT * DV accumulators stay in registers
// across the n keys.
template <size_t HT, size_t DV, typename T>
HWY_INLINE void ValuesTile(const float* HWY_RESTRICT p, const T* const* vp, size_t off, size_t n,
                           size_t d, RowPrefetcher<T>& prefetch, float* HWY_RESTRICT o) {
  static_assert(HT * DV <= 8 && HT <= kMaxTile && DV <= 4);
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF z = hn::Zero(df);
  for (size_t i = 0; i < d; i += DV * N) {
    prefetch.Step();
#define MLLM_DA_OPTR(j) (o + ((j) / DV) * d + i + ((j) % DV) * N)
#define MLLM_DA_LOAD(j) [[maybe_unused]] VF a##j = (j) < HT * DV ? hn::LoadU(df, MLLM_DA_OPTR(j)) : z
    MLLM_DA_LOAD(0); MLLM_DA_LOAD(1); MLLM_DA_LOAD(2); MLLM_DA_LOAD(3);
    MLLM_DA_LOAD(4); MLLM_DA_LOAD(5); MLLM_DA_LOAD(6); MLLM_DA_LOAD(7);
#undef MLLM_DA_LOAD
    for (size_t t = 0; t < n; ++t) {
#define MLLM_DA_VAL(c) [[maybe_unused]] const VF v##c = (c) < DV ? LoadF32(df, vp[t] + off + i + ((c) % DV) * N) : z
#define MLLM_DA_PRB(h) [[maybe_unused]] const VF p##h = (h) < HT ? hn::Set(df, p[((h) % HT) * kChunk + t]) : z
#define MLLM_DA_FMA(j)                                                                                \
  if constexpr ((j) < HT * DV) {                                                                      \
    a##j = hn::MulAdd(Pick<(j) / DV>(p0, p1, p2, p3), Pick<(j) % DV>(v0, v1, v2, v3), a##j);          \
  }
      MLLM_DA_VAL(0); MLLM_DA_VAL(1); MLLM_DA_VAL(2); MLLM_DA_VAL(3);
      MLLM_DA_PRB(0); MLLM_DA_PRB(1); MLLM_DA_PRB(2); MLLM_DA_PRB(3);
      MLLM_DA_FMA(0) MLLM_DA_FMA(1) MLLM_DA_FMA(2) MLLM_DA_FMA(3)
      MLLM_DA_FMA(4) MLLM_DA_FMA(5) MLLM_DA_FMA(6) MLLM_DA_FMA(7)
#undef MLLM_DA_VAL
#undef MLLM_DA_PRB
#undef MLLM_DA_FMA
    }
#define MLLM_DA_STORE(j) \
  if constexpr ((j) < HT * DV) hn::StoreU(a##j, df, MLLM_DA_OPTR(j));
    MLLM_DA_STORE(0) MLLM_DA_STORE(1) MLLM_DA_STORE(2) MLLM_DA_STORE(3)
    MLLM_DA_STORE(4) MLLM_DA_STORE(5) MLLM_DA_STORE(6) MLLM_DA_STORE(7)
#undef MLLM_DA_STORE
#undef MLLM_DA_OPTR
  }
}

// ValuesTile for a single head: 4 vectors of d per pass, even and odd keys in separate
// accumulators so that 8 FMA chains still run (4 would wait on the FMA latency).
template <typename T>
HWY_INLINE void ValuesTileOne(const float* HWY_RESTRICT p, const T* const* vp, size_t off, size_t n,
                              size_t d, RowPrefetcher<T>& prefetch, float* HWY_RESTRICT o) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (size_t i = 0; i < d; i += 4 * N) {
    prefetch.Step();
    VF a0 = hn::LoadU(df, o + i), a1 = hn::LoadU(df, o + i + N);
    VF a2 = hn::LoadU(df, o + i + 2 * N), a3 = hn::LoadU(df, o + i + 3 * N);
    VF b0 = hn::Zero(df), b1 = b0, b2 = b0, b3 = b0;
    size_t t = 0;
    for (; t + 2 <= n; t += 2) {
      const T* v = vp[t] + off + i;
      const T* w = vp[t + 1] + off + i;
      const VF pv = hn::Set(df, p[t]), pw = hn::Set(df, p[t + 1]);
      a0 = hn::MulAdd(pv, LoadF32(df, v), a0);
      a1 = hn::MulAdd(pv, LoadF32(df, v + N), a1);
      a2 = hn::MulAdd(pv, LoadF32(df, v + 2 * N), a2);
      a3 = hn::MulAdd(pv, LoadF32(df, v + 3 * N), a3);
      b0 = hn::MulAdd(pw, LoadF32(df, w), b0);
      b1 = hn::MulAdd(pw, LoadF32(df, w + N), b1);
      b2 = hn::MulAdd(pw, LoadF32(df, w + 2 * N), b2);
      b3 = hn::MulAdd(pw, LoadF32(df, w + 3 * N), b3);
    }
    if (t < n) {
      const T* v = vp[t] + off + i;
      const VF pv = hn::Set(df, p[t]);
      a0 = hn::MulAdd(pv, LoadF32(df, v), a0);
      a1 = hn::MulAdd(pv, LoadF32(df, v + N), a1);
      a2 = hn::MulAdd(pv, LoadF32(df, v + 2 * N), a2);
      a3 = hn::MulAdd(pv, LoadF32(df, v + 3 * N), a3);
    }
    hn::StoreU(hn::Add(a0, b0), df, o + i);
    hn::StoreU(hn::Add(a1, b1), df, o + i + N);
    hn::StoreU(hn::Add(a2, b2), df, o + i + 2 * N);
    hn::StoreU(hn::Add(a3, b3), df, o + i + 3 * N);
  }
}

// ChunkLogits' Step() calls per kKeyPad keys of one group: one per LogitsTile.
HWY_INLINE size_t TilesPerKeyPad(size_t group) {
  return group / 4 * (kKeyPad / 2) + (group % 4 >= 2 ? kKeyPad / 4 : 0) + group % 2;
}

// The logits of one kv head's group for the chunk (keys at kp[t] + off), kKeyPad keys at a
// time (they stay in L1 across the head tiles). Tile shapes: 4 heads x 2 keys keeps 8 FMA
// chains busy with about one load per FMA; smaller remainders of the group trade heads for keys.
template <typename T>
HWY_INLINE void ChunkLogits(const float* q, const T* const* kp, size_t off, size_t n_pad, size_t group,
                            size_t d, RowPrefetcher<T>& prefetch, float* s) {
  for (size_t t0 = 0; t0 < n_pad; t0 += kKeyPad) {
    size_t g = 0;
    for (; g + 4 <= group; g += 4) {
      for (size_t t = t0; t < t0 + kKeyPad; t += 2) {
        prefetch.Step();
        LogitsTile<4, 2>(q + g * d, kp + t, off, d, s + g * kChunk + t);
      }
    }
    if (g + 2 <= group) {
      for (size_t t = t0; t < t0 + kKeyPad; t += 4) {
        prefetch.Step();
        LogitsTile<2, 4>(q + g * d, kp + t, off, d, s + g * kChunk + t);
      }
      g += 2;
    }
    if (g < group) {
      prefetch.Step();
      LogitsTile<1, 8>(q + g * d, kp + t0, off, d, s + g * kChunk + t0);
    }
  }
}

template <typename T>
HWY_INLINE void ChunkValues(const float* p, const T* const* vp, size_t off, size_t n, size_t group,
                            size_t d, RowPrefetcher<T>& prefetch, float* o) {
  size_t g = 0;
  for (; g + 4 <= group; g += 4) ValuesTile<4, 2>(p + g * kChunk, vp, off, n, d, prefetch, o + g * d);
  if (g + 2 <= group) {
    ValuesTile<2, 4>(p + g * kChunk, vp, off, n, d, prefetch, o + g * d);
    g += 2;
  }
  if (g < group) ValuesTileOne(p + g * kChunk, vp, off, n, d, prefetch, o + g * d);
}

// ChunkValues' Step() calls for one group: one per ValuesTile(One) pass over DV (4) vectors of d.
HWY_INLINE size_t ValuePasses(size_t group, size_t d, size_t lanes) {
  return group / 4 * (d / (2 * lanes)) + (group % 4 >= 2 ? d / (4 * lanes) : 0) + group % 2 * (d / (4 * lanes));
}

// The online-softmax update of one head for one chunk. s: the chunk's logits, -inf past the
// last key up to `chunk`; overwritten with p = exp(s - m_new). Returns alpha = exp(m_old -
// m_new), the factor that rescales what o and l accumulated so far.
HWY_INLINE float SoftmaxStep(float* HWY_RESTRICT s, size_t chunk, float& m, float& l) {
  const DF df;
  const size_t N = hn::Lanes(df);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  auto vmax = hn::Set(df, kNegInf);
  for (size_t t = 0; t < chunk; t += N) vmax = hn::Max(vmax, hn::LoadU(df, s + t));
  const float chunk_max = hn::ReduceMax(df, vmax);
  const float m_new = m < chunk_max ? chunk_max : m;
  // All logits -inf so far (only from infinite inputs): subtract 0, not -inf (-inf - -inf = NaN).
  const float ref = m_new == kNegInf ? 0.0f : m_new;
  const float alpha = std::exp(m - ref);  // m = -inf (no keys yet): 0
  const auto vref = hn::Set(df, ref);
  auto vsum = hn::Zero(df);
  for (size_t t = 0; t < chunk; t += N) {
    const auto x = hn::Sub(hn::LoadU(df, s + t), vref);
    // hn::Exp maps NaN to 0; keep a NaN logit (NaN/inf in q or k) visible in the output.
    const auto p = hn::IfThenElse(hn::IsNaN(x), x, hn::Exp(df, x));
    hn::StoreU(p, df, s + t);
    vsum = hn::Add(vsum, p);
  }
  l = l * alpha + hn::ReduceSum(df, vsum);
  m = m_new;
  return alpha;
}

// Where one request's token rows live in the paged cache.
template <typename T>
struct ChunkRows {
  const T* k_base;       // k_cache + kv0 * head_dim: the item's first kv head
  const T* v_base;
  const int32_t* table;  // the request's block table row
  int64_t block_size, row_stride, k_block_stride, v_block_stride, len;

  // Row pointers of tokens c0 .. min(c0 + chunk, len) - 1; returns their count.
  HWY_INLINE size_t Fill(int64_t c0, size_t chunk, const T** kp, const T** vp) const {
    const auto n = static_cast<size_t>(len - c0 < static_cast<int64_t>(chunk) ? len - c0 : chunk);
    for (size_t t = 0; t < n; ++t) {
      const int64_t token = c0 + static_cast<int64_t>(t);
      const int64_t block = table[token / block_size];
      const int64_t slot = (token % block_size) * row_stride;
      kp[t] = k_base + block * k_block_stride + slot;
      vp[t] = v_base + block * v_block_stride + slot;
    }
    return n;
  }
};

// The scale of kv head h (a float8 cache's; 1 otherwise).
HWY_INLINE float ScaleOf(const host::CacheScale& c, int64_t h) {
  return c.value * (c.data != nullptr ? c.data[h * c.stride] : 1.0f);
}

// Work item: kv heads kv0 .. kv0 + kv_count - 1 of request b, i.e. query heads kv0 * G ..
// (kv0 + kv_count) * G - 1. Indices were validated by the caller (decode_attention.cpp). T: q's
// and out's element type; KV: the cache's (T, or float8 e4m3fn, dequantized by the scales).
template <typename T, typename KV>
HWY_INLINE void AttendItem(T* HWY_RESTRICT out, float* HWY_RESTRICT lse, const T* q, const KV* k_cache,
                           const KV* v_cache, const int32_t* block_table, const int32_t* seq_lens,
                           const mllm_kernel::decode_attention::DecodeArgs& a, int64_t b, int64_t kv0,
                           size_t kv_count, float* HWY_RESTRICT scratch) {
  const DF df;
  const size_t N = hn::Lanes(df);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const auto d = static_cast<size_t>(a.head_dim);
  const auto group = static_cast<size_t>(a.group());
  const size_t heads = kv_count * group;
  const int64_t head0 = kv0 * static_cast<int64_t>(group);
  T* out_rows = out + (b * a.num_heads + head0) * a.head_dim;
  float* lse_rows = lse + b * a.num_heads + head0;

  const int64_t len = seq_lens[b];
  const int64_t start = a.window > 0 && len > a.window ? len - a.window : 0;
  if (start >= len) {  // no keys: out 0, lse -inf
    for (size_t i = 0; i < heads * d; i += N) StoreF32(df, hn::Zero(df), out_rows + i);
    for (size_t h = 0; h < heads; ++h) lse_rows[h] = kNegInf;
    return;
  }

  float* qf = scratch;           // [heads, d] the queries, float32, scale folded in
  float* o = qf + heads * d;     // [heads, d] unnormalized outputs
  float* m = o + heads * d;      // [heads] running max
  float* l = m + heads;          // [heads] running sum of exp(logit - m)
  float* s = l + heads;          // [G, kChunk] one group's logits, then probabilities

  // With a soft cap, fold 1/cap in too: logit = cap * tanh(q' . k) with q' = q * scale / cap.
  // A float8 cache's k scale folds in the same way (per kv head).
  const float cap = a.soft_cap;
  const T* q_rows = q + b * a.q_stride + head0 * a.head_dim;
  for (size_t h = 0; h < heads; ++h) {
    const float k_scale = ScaleOf(a.k_scale, kv0 + static_cast<int64_t>(h / group));
    const auto vscale = hn::Set(df, (cap > 0.0f ? a.scale / cap : a.scale) * k_scale);
    for (size_t i = h * d; i < (h + 1) * d; i += N) {
      hn::StoreU(hn::Mul(LoadF32(df, q_rows + i), vscale), df, qf + i);
      hn::StoreU(hn::Zero(df), df, o + i);
    }
  }
  for (size_t h = 0; h < heads; ++h) {
    m[h] = kNegInf;
    l[h] = 0.0f;
  }

  // Row pointers of this chunk and of the next one (prefetched while this one computes).
  const ChunkRows<KV> rows{k_cache + kv0 * a.head_dim, v_cache + kv0 * a.head_dim,
                          block_table + b * a.table_stride, a.block_size, a.num_kv_heads * a.head_dim,
                          a.k_block_stride, a.v_block_stride, len};
  const size_t span_bytes = kv_count * d * sizeof(KV);  // the item's part of a token row
  // Sized by the whole row, not the item's span: the chunking (hence the rounding) must not
  // depend on how many threads split the kv heads.
  const size_t chunk = ChunkKeys(static_cast<size_t>(a.num_kv_heads) * d * sizeof(KV));
  const KV* kp_buf[2][kChunk];
  const KV* vp_buf[2][kChunk];
  size_t n = rows.Fill(start, chunk, kp_buf[0], vp_buf[0]);
  for (int64_t c0 = start, cur = 0; c0 < len; c0 += static_cast<int64_t>(chunk), cur ^= 1) {
    const KV** kp = kp_buf[cur];
    const KV* const* vp = vp_buf[cur];
    // Key tiles run past n up to a multiple of kKeyPad: repeat the last key (its logits land
    // past n and are masked below) instead of a scalar tail.
    const size_t n_pad = (n + kKeyPad - 1) / kKeyPad * kKeyPad;
    for (size_t t = n; t < n_pad; ++t) kp[t] = kp[n - 1];

    RowPrefetcher<KV> prefetch{kp_buf[cur ^ 1], vp_buf[cur ^ 1]};
    if (c0 + static_cast<int64_t>(chunk) < len) {
      prefetch.rows = rows.Fill(c0 + static_cast<int64_t>(chunk), chunk, kp_buf[cur ^ 1], vp_buf[cur ^ 1]);
      prefetch.span_bytes = span_bytes;
      // Spread the lines evenly over this chunk's Step() calls.
      const size_t steps = kv_count * ((n_pad / kKeyPad) * TilesPerKeyPad(group) + ValuePasses(group, d, N));
      const size_t lines = prefetch.rows * ((prefetch.span_bytes + 63) / 64);
      prefetch.lines_per_step = (lines + steps - 1) / steps;
    }

    for (size_t j = 0; j < kv_count; ++j) {
      const size_t off = j * d;  // this kv head's elements within a token row span
      float* og = o + j * group * d;
      ChunkLogits(qf + j * group * d, kp, off, n_pad, group, d, prefetch, s);
      for (size_t g = 0; g < group; ++g) {
        float* sg = s + g * kChunk;
        if (cap > 0.0f) {
          const auto vcap = hn::Set(df, cap);
          for (size_t t = 0; t < chunk; t += N) {
            hn::StoreU(hn::Mul(vcap, hn::Tanh(df, hn::LoadU(df, sg + t))), df, sg + t);
          }
        }
        for (size_t t = n; t < chunk; ++t) sg[t] = kNegInf;  // exp -> 0 past the last key
        const float alpha = SoftmaxStep(sg, chunk, m[j * group + g], l[j * group + g]);
        if (alpha != 1.0f) {  // the max grew: rescale what is accumulated
          const auto va = hn::Set(df, alpha);
          float* ogg = og + g * d;
          for (size_t i = 0; i < d; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, ogg + i), va), df, ogg + i);
        }
      }
      ChunkValues(s, vp, off, n, group, d, prefetch, og);
    }
    n = prefetch.rows;
  }

  for (size_t h = 0; h < heads; ++h) {
    // l >= 1 whenever the max is finite (the max key contributes exp(0)); l = 0 only when every
    // logit was -inf: out 0 then, as for no keys.
    const float v_scale = ScaleOf(a.v_scale, kv0 + static_cast<int64_t>(h / group));
    const auto vinv = hn::Set(df, l[h] == 0.0f ? 0.0f : v_scale / l[h]);
    const float* oh = o + h * d;
    for (size_t i = 0; i < d; i += N) StoreF32(df, hn::Mul(hn::LoadU(df, oh + i), vinv), out_rows + h * d + i);
    lse_rows[h] = m[h] + std::log(l[h]);
  }
}

// The exported decode entry (HWY_EXPORT_T in decode_attention.cpp), run by every worker thread:
// takes items (request b, kv heads [kv0, kv0 + kv_per_item)) from the shared counter until none
// are left; kv_per_item divides num_kv_heads. out [B, H, D] and lse [B, H] contiguous; each item
// writes its own rows. scratch: ScratchFloats(kv_per_item * G, G, D) floats.
template <class Elems>
void AttendItems(typename Elems::Q* out, float* lse, const typename Elems::Q* q, const typename Elems::KV* k_cache,
                 const typename Elems::KV* v_cache,
                 const int32_t* block_table, const int32_t* seq_lens,
                 const mllm_kernel::decode_attention::DecodeArgs& a, int64_t kv_per_item,
                 std::atomic<int64_t>* next, float* scratch) {
  const int64_t per_request = a.num_kv_heads / kv_per_item;
  const int64_t items = a.batch * per_request;
  for (int64_t item = next->fetch_add(1, std::memory_order_relaxed); item < items;
       item = next->fetch_add(1, std::memory_order_relaxed)) {
    AttendItem(out, lse, q, k_cache, v_cache, block_table, seq_lens, a, item / per_request,
               item % per_request * kv_per_item, static_cast<size_t>(kv_per_item), scratch);
  }
}

// The exported merge entry: v [N, H, D] and lse [N, H] contiguous; v_a / v_b rows a_stride /
// b_stride elements apart, heads D apart. Any D (tails via LoadN/StoreN).
template <typename T>
void MergeStates(T* v, float* lse, const T* v_a, const float* lse_a, const T* v_b, const float* lse_b,
                 int64_t rows, int64_t heads, int64_t dim, int64_t a_stride, int64_t b_stride) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto d = static_cast<size_t>(dim);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t i_out = r * heads + h;
      T* vo = v + i_out * dim;
      const T* va = v_a + r * a_stride + h * dim;
      const T* vb = v_b + r * b_stride + h * dim;
      const float la = lse_a[i_out], lb = lse_b[i_out];
      if (la == kNegInf && lb == kNegInf) {  // neither state saw a key
        for (size_t i = 0; i < d; i += N) StoreF32N(df, hn::Zero(df), vo + i, d - i < N ? d - i : N);
        lse[i_out] = kNegInf;
        continue;
      }
      // NaN and +inf flow through, unspecialized: NaN - mx or inf - inf makes NaN weights.
      const float mx = la < lb ? lb : la;
      const float wa = std::exp(la - mx), wb = std::exp(lb - mx);
      const float sum = wa + wb;
      const float ca = wa / sum, cb = wb / sum;
      lse[i_out] = mx + std::log(sum);
      const auto vca = hn::Set(df, ca), vcb = hn::Set(df, cb);
      size_t i = 0;
      for (; i + N <= d; i += N) {
        StoreF32(df, hn::MulAdd(LoadF32(df, va + i), vca, hn::Mul(LoadF32(df, vb + i), vcb)), vo + i);
      }
      if (i < d) {
        const size_t rest = d - i;
        StoreF32N(df, hn::MulAdd(LoadF32N(df, va + i, rest), vca, hn::Mul(LoadF32N(df, vb + i, rest), vcb)),
                  vo + i, rest);
      }
    }
  }
}

}  // namespace decode_attention_detail
}  // namespace mllm_kernel::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // MLLM_KERNEL_DECODE_ATTENTION_INL_H_
