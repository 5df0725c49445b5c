/*!
 * \file kernels/decode_attention/decode_attention.cuh
 * \brief CUDA decode attention over the paged KV cache (split-KV with an LSE merge) and
 * merge_attention_states, on torch's current stream (arguments: decode_attention.hpp).
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * mllm_kernel::gpu::decode_attention and mllm_kernel::gpu::merge_attention_states.
 *
 * One CTA serves one (request, KV head, split) and up to 16 query heads of that KV group, so
 * the group's heads share one pass over the pages: they are the 16 rows of m16n8k16 tensor-core
 * products S = q K^T and O += P V (rows past the group are zeros). The CTA's warps take its key
 * tiles (16 keys) in turn; each warp streams its tiles through its own ring in shared memory with
 * cp.async (both of its stages in flight while it waits) and keeps its own online-softmax state (in
 * log2 units); the warps' states are merged at the end. With num_splits > 1 the splits of a
 * (request, KV head) run as one thread-block cluster on sm_90 where the grid is small (up to 8
 * splits, one CTA per SM) and merge through distributed shared memory at the kernel's end;
 * otherwise each CTA writes a float32 partial state and MergeSplitsKernel combines them. A float8 cache's tiles are converted in registers and
 * multiplied in float16 (see e4m3x2_to_f16x2).
 *
 * float32 q (with a float32 cache) runs DecodeFloatKernel instead: plain float32 arithmetic,
 * for float32 models; same splits, masking and error records.
 *
 * Bad indices never reach memory: a block id outside [0, num_blocks) masks that block's keys
 * and a seq_len outside [0, max_blocks * block_size] is clamped; the first is recorded in
 * `error` (int64 [3]: {flag, index, value}; index = b << 32 | j for block_table[b, j], -(b + 1)
 * for seq_lens[b]). The host never reads it here (no sync): the Python wrapper does.
 */
#ifndef MLLM_KERNEL_KERNELS_DECODE_ATTENTION_CUH_
#define MLLM_KERNEL_KERNELS_DECODE_ATTENTION_CUH_

#include <mllm_kernel/utils.cuh>

#include "decode_attention.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace mllm_kernel::gpu {

namespace decode_attention_detail {

using device::bf16_t;
using device::cp_async_16;
using device::cp_async_commit;
using device::cp_async_wait;
using device::FastDivmod;
using device::fp16_t;
using device::ldmatrix_x4;
using device::ldmatrix_x4_trans;
using device::mma_16816;
using device::pack2;
using device::swizzle;

// Warps per CTA. Measured on an H100 (benchmarks/RESULTS.md): what counts is warps per SM. 6
// warps with 2 stages (100 KiB, 2 CTAs per SM at head_dim 128) beat 4 x 3 by 0-14% and 2 x 4, 2 x 6, 4 x 4 and 1 x 6 by far. GPUs that cannot
// give a block that much shared memory (sm_86/89: 99 KiB; sm_80: 163 KiB) run 2 warps a CTA.
constexpr int kWarpsLarge = 6;
constexpr int kWarpsSmall = 2;
constexpr int kTile = 16;    // keys per warp tile: the k of one m16n8k16 product P . V
constexpr int kRows = 16;    // query heads per CTA: the m of the tensor-core products
constexpr int kChunk = device::kChunkElems;  // 16-bit elements per 16-byte chunk
constexpr int kStages = 2;   // tiles a warp holds in shared memory, all in flight while it waits

// Shared memory of a CTA: q [kRows, D] (16-bit), then each warp's ring of K and V tiles [kTile, D]
// of the cache's type, then for a float8 cache q's per-row scales. The epilogue reuses the regions
// for the warps' partial states ([kRows, D + 8] floats a warp).
template <int D>
constexpr int kWarpBytes = kStages * 2 * kTile * D * 2;  // sized for 16-bit tiles (the epilogue needs it)
template <int D, int kWarps, bool kFp8>
constexpr int kSmemBytes = kRows * D * 2 + kWarps * kWarpBytes<D> + (kFp8 ? kRows * 4 : 0);
template <int D>
constexpr int kEpilogueStride = D + 8;  // floats; the pad spreads the rows' float2 stores over banks
static_assert(kRows * (kEpilogueStride<64> + 2) * 4 <= kWarpBytes<64>,
              "a warp's epilogue state must fit its ring (head_dim 64 is the tightest)");
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---------------------------------------------------------------------------- helpers

/*! \brief Weights of two softmax states with maxima m_a, m_b (log2 units): e^(m - max). An
 * empty state (-inf) weighs 0; two empty states give 0 and 0 (never NaN). */
__device__ __forceinline__ float2 state_weights(float m_a, float m_b) {
  const float m = fmaxf(m_a, m_b);
  if (m == -INFINITY) return make_float2(0.f, 0.f);
  return make_float2(exp2f(m_a - m), exp2f(m_b - m));
}

/*! \brief The merge of split states by their lse (natural log): each weighs e^(lse - m), m the
 * largest lse (all -inf: every weight 0); out = sum of weighted outputs * merged_inv(total). No
 * key anywhere gives 0 and -inf; a NaN lse makes the row NaN (callers set total to NaN: fmaxf
 * alone would drop it). Shared by MergeSplitsKernel and the cluster merge. */
__device__ __forceinline__ float split_weight(float lse, float m) { return m == -INFINITY ? 0.f : expf(lse - m); }
__device__ __forceinline__ float merged_inv(float total) { return total == 0.f ? 0.f : 1.f / total; }
__device__ __forceinline__ float merged_lse(float m, float total) {
  return total == 0.f ? -INFINITY : m + logf(total);
}

/*! \brief Splits merged in one cluster at most. Measured (H200, benchmarks/RESULTS.md): clusters
 * of 2 to 8 splits take 0.5-1.1 µs off the merge kernel's path; 16 gained nothing. */
constexpr int kMaxClusterSplits = 8;

template <typename T, typename KV>
struct DecodeParams {
  T* out;
  float* lse;
  const T* q;
  const KV* k_cache;
  const KV* v_cache;
  const int32_t* block_table;
  const int32_t* seq_lens;
  float* partial_out;
  float* partial_lse;
  int64_t* error;
  int64_t q_stride, k_block_stride, v_block_stride, table_stride;
  int num_heads, num_kv_heads, group, head_chunks, num_blocks, max_blocks, window, num_splits;
  int64_t max_keys;  // max_blocks * block_size
  FastDivmod block_size;
  float q_scale;      // multiplies q . k: scale * log2(e), or scale / cap with a soft cap
  float logit_scale;  // 1, or cap * log2(e) after tanh with a soft cap
  bool soft_cap;
  bool cluster_merge;  // the splits are one cluster and merge in it (else: MergeSplitsKernel)
  host::CacheScale k_scale, v_scale;  // a float8 cache's dequantization (value 1, no tensor, else)
};

// ---------------------------------------------------------------------------- float8

// A float8 cache is read straight into the tensor cores' registers, converted there by one
// instruction per pair (no pass through shared memory). The products run in float16 for either
// q type: every e4m3 value is a float16 value (NaN stays NaN), a bfloat16 q row becomes float16
// exactly after scaling by a power of two, and P (in [0, 1]) keeps more bits in float16.
//
// S = q K^T sums over the dims in any order, so each lane takes 16 consecutive dims of a K row
// (one 16-byte read) and the dims of q are read in the same order. O = P V needs pairs of keys
// at one dim: a lane reads a run of dims from each of its 4 key rows, pairs the bytes with prmt,
// and the output dims come out permuted (undone by the epilogue, see fp8_out_dim).

/*! \brief Two e4m3 values (low byte first) as a float16 pair (exact). */
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t pair) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t out;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(out) : "h"(pair));
  return out;
#else
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
#endif
}

/*! \brief Offset (in 16-byte chunks) of chunk c of row r in a float8 tile [kTile, D]. Chunks are
 * XOR-swizzled within each 128 bytes so that every 8 lanes of the K reads (2 rows x 4 chunks) and
 * of the V reads (4 even or odd rows x 2 chunks) touch 8 different bank groups. */
template <int D>
__device__ __forceinline__ int fp8_slot(int r, int c) {
  constexpr int kRowChunks = D / 16;
  const int sw = (((r >> 1) & 3) << 1) ^ (kRowChunks >= 8 ? (r & 1) << 2 : 0);
  return (r * kRowChunks + c) ^ sw;
}

/*! \brief The dim that column `col` (0-7) of output tile j holds in the float8 path: lane column
 * col reads J = min(D / 8, 16) consecutive V dims per 128 (tile j takes the (j % J)-th). */
template <int D>
__device__ __forceinline__ int fp8_out_dim(int j, int col) {
  constexpr int J = D / 8 < 16 ? D / 8 : 16;
  return (j / J) * 8 * J + col * J + j % J;
}

// ---------------------------------------------------------------------------- decode

/*!
 * One CTA: (request b, KV head, head chunk, split). Its kWarps warps take the split's key tiles
 * in turn; each warp streams its tiles through its own ring with cp.async and computes
 * S = q K^T and O += P V with m16n8k16 tensor-core products (the CTA's <= 16 query heads are the
 * rows; unused rows are zeros). Online softmax per warp in log2 units; the warps' states are
 * merged in the epilogue. Fragment layouts are the PTX ISA's for mma.m16n8k16: a lane holds
 * rows lane / 4 and lane / 4 + 8, columns 2 (lane % 4) and 2 (lane % 4) + 1 of each 8 columns.
 * A float8 cache's tiles go from shared memory to registers without ldmatrix (see e4m3x2_to_f16x2).
 */
/*! \brief The cluster merge at DecodeKernel's end: the cluster holds every split of the CTA's
 * heads (rows row0 + g of out and lse), each split's rows (split_out[g * kStride + d]) and lses
 * (split_lse[g]) in its shared memory. Block `rank` merges its share of the (row, dim) outputs,
 * all of its peer loads in flight at once (each takes hundreds of cycles). Not inlined: its
 * registers would otherwise count against the main loop's, which then spilled. */
template <int kThreads, int D, int kStride, typename T>
__device__ __noinline__ void MergeClusterSplits(T* out, float* lse, int64_t row0, const float* split_out,
                                                const float* split_lse, int heads) {
  device::cluster_sync();
  const int n = static_cast<int>(device::cluster_size()), rank = static_cast<int>(device::cluster_rank());
  for (int idx = rank * kThreads + threadIdx.x; idx < heads * D; idx += n * kThreads) {
    const int g = idx / D, d = idx % D;
    float lses[kMaxClusterSplits], values[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      lses[s] = s < n ? *device::cluster_peer(split_lse + g, s) : -INFINITY;
      values[s] = s < n ? *device::cluster_peer(split_out + g * kStride + d, s) : 0.f;
    }
    float m = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      m = fmaxf(m, lses[s]);
      nan |= lses[s] != lses[s];
    }
    float total = 0.f, value = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      const float w = split_weight(lses[s], m);
      total += w;
      value = fmaf(w, values[s], value);
    }
    if (nan) total = NAN;
    out[(row0 + g) * D + d] = device::from_float<T>(value * merged_inv(total));
    if (d == 0) lse[row0 + g] = merged_lse(m, total);
  }
  device::cluster_sync();  // no block exits while a peer may still read its shared memory
}

template <typename T, typename KV, int D, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, D <= 128 ? 2 : 1) DecodeKernel(const DecodeParams<T, KV> p) {
  constexpr bool kFp8 = sizeof(KV) == 1;
  using MmaT = std::conditional_t<kFp8, fp16_t, T>;  // the tensor cores' input type
  constexpr int kThreads = kWarps * 32;
  constexpr int kChunks = D / kChunk;                 // 16-byte chunks per row of T: 8, 16, 32
  constexpr int kKVChunkElems = 16 / sizeof(KV);      // cache values per 16-byte chunk
  constexpr int kKVChunks = D / kKVChunkElems;        // 16-byte chunks per cache row
  constexpr int kRowsPerPass = 32 / kKVChunks;        // tile rows a warp copies per instruction
  constexpr int kPasses = kTile / kRowsPerPass;       // copy instructions per tile (K or V)
  constexpr int kRingTile = kTile * kKVChunks;        // chunks of a K or V tile in the ring
  extern __shared__ __align__(128) unsigned char smem[];
  uint4* q_tile = reinterpret_cast<uint4*>(smem);  // [kRows, D], swizzled
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint4* ring = q_tile + kRows * kChunks + warp * (kWarpBytes<D> / 16);  // this warp's region
  // float8 only: q's per-row factors (powers of two, see the prologue), after the rings.
  float* q_row_scale = reinterpret_cast<float*>(q_tile + kRows * kChunks + kWarps * (kWarpBytes<D> / 16));
  // Where chunk c of tile row r sits in a ring tile (16-bit tiles: read by ldmatrix).
  const auto ring_slot = [](int r, int c) { return kFp8 ? fp8_slot<D>(r, c) : swizzle<D>(r, c); };

  const int split = blockIdx.x;
  const int kvh = blockIdx.y / p.head_chunks;
  const int head0 = kvh * p.group + (blockIdx.y % p.head_chunks) * kRows;
  const int heads = min(kRows, kvh * p.group + p.group - head0);
  const int b = blockIdx.z;

  device::pdl_wait_primary();  // q, the cache and seq_lens may come from the previous kernel

  // seq_len -> block table -> K/V is a chain of dependent loads: at short contexts it is the
  // kernel's run time, so it starts first and q's copy (cp.async) runs beside it.
  int64_t len = p.seq_lens[b];
  // A float8 cache's scales: k's folds into the logits' factor, v's into the output.
  const auto scale_of = [kvh](const host::CacheScale& c) {
    return c.value * (c.data != nullptr ? c.data[kvh * c.stride] : 1.f);
  };
  const float q_scale = kFp8 ? p.q_scale * scale_of(p.k_scale) : p.q_scale;
  const float v_scale = kFp8 ? scale_of(p.v_scale) : 1.f;
  // q rows of this CTA's heads into shared memory (zero-filled past `heads`): the first copy group.
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const T* src = r < heads ? p.q + b * p.q_stride + static_cast<int64_t>(head0 + r) * D + c * kChunk : p.q;
    cp_async_16(q_tile + swizzle<D>(r, c), src, r < heads);
  }
  cp_async_commit();

  // Keys [first, last) of this split, cut into tiles of kTile keys.
  if (len < 0 || len > p.max_keys) {
    if (threadIdx.x == 0 && split == 0 && blockIdx.y == 0) device::record_error(p.error, -(b + 1), len);
    len = len < 0 ? 0 : p.max_keys;
  }
  const int64_t begin = p.window > 0 && len > p.window ? len - p.window : 0;
  // Whole tiles per split, so that tiles stay aligned with blocks of 16 keys or more (a tile
  // that straddles two blocks costs a second block-table lookup per row); trailing splits may
  // be empty.
  const int64_t chunk = ((len - begin + p.num_splits - 1) / p.num_splits + kTile - 1) / kTile * kTile;
  const int64_t first = begin + split * chunk;
  const int64_t last = min(len, first + chunk);
  const int tiles = last > first ? static_cast<int>((last - first + kTile - 1) / kTile) : 0;
  const int my_tiles = tiles > warp ? (tiles - warp + kWarps - 1) / kWarps : 0;

  const int32_t* table = p.block_table + b * p.table_stride;
  const int64_t row_elems = static_cast<int64_t>(p.num_kv_heads) * D;  // a token's row in a block
  const int my_chunk = lane % kKVChunks;
  const KV* k_head = p.k_cache + static_cast<int64_t>(kvh) * D + my_chunk * kKVChunkElems;
  const KV* v_head = p.v_cache + static_cast<int64_t>(kvh) * D + my_chunk * kKVChunkElems;
  auto tile_start = [&](int i) { return first + static_cast<int64_t>(warp + i * kWarps) * kTile; };
  auto key_of = [&](int i, int pass) {  // key index of this lane's row in the warp's i-th tile
    return tile_start(i) + pass * kRowsPerPass + lane / kKVChunks;
  };
  // Every tile inside one block (blocks of a multiple of kTile keys, tiles starting at a multiple
  // of kTile; a sliding window may shift them): one block id per tile, rows at fixed strides.
  const bool whole_tiles = p.block_size.d % kTile == 0 && first % kTile == 0;
  const int64_t lane_row = (lane / kKVChunks) * row_elems;  // this lane's first row in a tile

  // Block ids of a tile's rows (-1: past `last`; whole tiles: the tile's id in ids[0]), per stage;
  // loaded kStages tiles ahead of the tile's copies, so that the table's latency hides behind
  // the tiles in between.
  int32_t blocks[kStages][kPasses];
  auto load_blocks = [&](int i, int32_t(&ids)[kPasses]) {
    if (whole_tiles) {
      ids[0] = i < my_tiles ? table[p.block_size.div(static_cast<uint32_t>(tile_start(i)))] : -1;
      return;
    }
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int64_t t = key_of(i, pass);
      ids[pass] = i < my_tiles && t < last ? table[p.block_size.div(static_cast<uint32_t>(t))] : -1;
    }
  };
  uint32_t key_mask[kStages];  // bit r: row r of the tile in that stage is a key (warp-uniform)

  // Copies the warp's i-th tile into `stage` (rows past `last` or in a bad block zero-fill) as one
  // commit group; past the warp's last tile the group is empty, so that wait counts stay uniform.
  auto issue = [&](int i, int stage, const int32_t(&ids)[kPasses]) {
    if (i >= my_tiles) {  // uniform over the warp
      cp_async_commit();
      return;
    }
    uint4* k_tile = ring + stage * 2 * kRingTile;
    uint4* v_tile = k_tile + kRingTile;
    if (whole_tiles) {
      const int64_t t0 = tile_start(i);
      const int32_t block = ids[0];
      const bool valid = block >= 0 && block < p.num_blocks;  // uniform over the warp
      const int rows = static_cast<int>(min(static_cast<int64_t>(kTile), last - t0));
      const uint32_t j = p.block_size.div(static_cast<uint32_t>(t0));
      if (!valid && lane == 0) device::record_error(p.error, (static_cast<int64_t>(b) << 32) | j, block);
      const int64_t offset = valid ? (t0 - static_cast<int64_t>(j) * p.block_size.d) * row_elems + lane_row : 0;
      const KV* k_src = valid ? k_head + block * p.k_block_stride + offset : p.k_cache;
      const KV* v_src = valid ? v_head + block * p.v_block_stride + offset : p.v_cache;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int row = pass * kRowsPerPass + lane / kKVChunks;
        const int64_t step = valid ? pass * kRowsPerPass * row_elems : 0;
        cp_async_16(k_tile + ring_slot(row, my_chunk), k_src + step, valid && row < rows);
        cp_async_16(v_tile + ring_slot(row, my_chunk), v_src + step, valid && row < rows);
      }
      key_mask[stage] = valid ? (rows == kTile ? 0xffffu : (1u << rows) - 1) : 0u;
      cp_async_commit();
      return;
    }
    uint32_t mask = 0;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = pass * kRowsPerPass + lane / kKVChunks;
      const int64_t t = key_of(i, pass);
      const int32_t block = ids[pass];
      const bool valid = block >= 0 && block < p.num_blocks;
      const KV* k_src = p.k_cache;
      const KV* v_src = p.v_cache;
      const uint32_t j = p.block_size.div(static_cast<uint32_t>(t));
      if (valid) {
        const int64_t offset = (t - static_cast<int64_t>(j) * p.block_size.d) * row_elems;
        k_src = k_head + block * p.k_block_stride + offset;
        v_src = v_head + block * p.v_block_stride + offset;
      } else if (block != -1 || t < last) {
        if (my_chunk == 0) device::record_error(p.error, (static_cast<int64_t>(b) << 32) | j, block);
      }
      cp_async_16(k_tile + ring_slot(row, my_chunk), k_src, valid);
      cp_async_16(v_tile + ring_slot(row, my_chunk), v_src, valid);
      const uint32_t ballot = __ballot_sync(device::kFullMask, valid);
#pragma unroll
      for (int r = 0; r < kRowsPerPass; ++r) mask |= ((ballot >> (r * kKVChunks)) & 1u) << (pass * kRowsPerPass + r);
    }
    key_mask[stage] = mask;
    cp_async_commit();
  };

  // Per lane: rows r0 = lane / 4 and r0 + 8 of the running max m (log2 units), sum l and O.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  // The logits' factor per row r0, r0 + 8 (a float8 path's q rows carry their own factor).
  float row_q_scale[2] = {q_scale, q_scale};

  auto consume = [&](int stage) {
    const uint4* k_tile = ring + stage * 2 * kRingTile;
    const uint4* v_tile = k_tile + kRingTile;
    // S [16 heads, 16 keys] = q K^T, as two 16x8 products per 16 dims, the even and odd 16 dims
    // into separate sums (halves the chain of dependent products).
    float s2[2][2][4] = {};
    if constexpr (kFp8) {
      // Lane (col, t) takes dims 64 G + 16 t + [0, 16) of K rows col and 8 + col; the 4 dims of
      // one 4-byte word are k = 2t, 2t + 1, 2t + 8, 2t + 9 of one product, and q's A fragments
      // sit in that dim order in shared memory (see the prologue).
      const int col = lane / 4, t = lane % 4;
#pragma unroll
      for (int g = 0; g < D / 64; ++g) {
        uint4 kw[2];
#pragma unroll
        for (int n = 0; n < 2; ++n) kw[n] = k_tile[fp8_slot<D>(8 * n + col, 4 * g + t)];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint4 q4 = q_tile[(4 * g + i) * 32 + lane];
          const uint32_t a[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            const uint32_t w = reinterpret_cast<const uint32_t*>(&kw[n])[i];
            mma_16816<MmaT>(s2[i % 2][n], a, e4m3x2_to_f16x2(static_cast<uint16_t>(w)),
                            e4m3x2_to_f16x2(static_cast<uint16_t>(w >> 16)));
          }
        }
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t a[4], kb[4];
        ldmatrix_x4(a, q_tile + swizzle<D>(lane % 16, 2 * ks + lane / 16));
        const int mat = lane / 8;
        ldmatrix_x4(kb, k_tile + swizzle<D>((mat / 2) * 8 + lane % 8, 2 * ks + mat % 2));
        mma_16816<MmaT>(s2[ks % 2][0], a, kb[0], kb[1]);
        mma_16816<MmaT>(s2[ks % 2][1], a, kb[2], kb[3]);
      }
    }
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) s[n][c] = s2[0][n][c] + s2[1][n][c];
    }
    // Logits in log2 units, masked keys -inf; the running state's rescale per row.
    const uint32_t mask = key_mask[stage];
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float x = s[n][c] * row_q_scale[c / 2];
        if (p.soft_cap) x = tanhf(x);
        const int col = n * 8 + (lane % 4) * 2 + (c & 1);
        s[n][c] = (mask >> col) & 1u ? x * p.logit_scale : -INFINITY;
        row_max[c / 2] = fmaxf(row_max[c / 2], s[n][c]);
      }
    }
    float rescale[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(device::kFullMask, row_max[h], 1));
      row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(device::kFullMask, row_max[h], 2));
      const float m_new = fmaxf(m[h], row_max[h]);
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // no key yet: everything stays 0
      rescale[h] = exp2f(m[h] - m_use[h]);
      m[h] = m_new;
      l[h] *= rescale[h];
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[n][c] = exp2f(s[n][c] - m_use[c / 2]);
        l[c / 2] += s[n][c];
      }
    }
    // O's rescale (D / 2 multiplies a lane) only when a row's max grew somewhere in the warp:
    // past the first tiles it rarely does.
    if (__any_sync(device::kFullMask, rescale[0] != 1.f || rescale[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][0] *= rescale[0];
        o[n][1] *= rescale[0];
        o[n][2] *= rescale[1];
        o[n][3] *= rescale[1];
      }
    }
    // O [16 heads, D] += P V: P's accumulator layout is the A operand's (keys as k).
    const uint32_t pa[4] = {pack2<MmaT>(s[0][0], s[0][1]), pack2<MmaT>(s[0][2], s[0][3]),
                            pack2<MmaT>(s[1][0], s[1][1]), pack2<MmaT>(s[1][2], s[1][3])};
    if constexpr (kFp8) {
      // Lane (col, t) reads D / 8 dims (from fp8_out_dim) of V rows 2t, 2t + 1, 2t + 8, 2t + 9;
      // prmt pairs the rows' bytes per dim: the B fragments {2t, 2t + 1} and {2t + 8, 2t + 9}.
      constexpr int kWords = D / 32;  // 4-byte words a lane reads of each row
      const int col = lane / 4, t = lane % 4;
      const unsigned char* v_bytes = reinterpret_cast<const unsigned char*>(v_tile);
      uint32_t vw[4][kWords];
#pragma unroll
      for (int ri = 0; ri < 4; ++ri) {
        const int r = (ri / 2) * 8 + 2 * t + ri % 2;
        if constexpr (D == 64) {  // 8 bytes: half of chunk col / 2
          const uint2 x =
              *reinterpret_cast<const uint2*>(v_bytes + 16 * fp8_slot<D>(r, col / 2) + 8 * (col % 2));
          vw[ri][0] = x.x;
          vw[ri][1] = x.y;
        } else {  // 16 bytes per 128 dims: chunk 8 piece + col
#pragma unroll
          for (int piece = 0; piece < D / 128; ++piece) {
            const uint4 x = *reinterpret_cast<const uint4*>(v_bytes + 16 * fp8_slot<D>(r, 8 * piece + col));
            vw[ri][4 * piece] = x.x;
            vw[ri][4 * piece + 1] = x.y;
            vw[ri][4 * piece + 2] = x.z;
            vw[ri][4 * piece + 3] = x.w;
          }
        }
      }
#pragma unroll
      for (int w = 0; w < kWords; ++w) {
        // Bytes (row 2t, row 2t + 1) of dims 0, 1 of the word, then of dims 2, 3; same for 2t + 8, 2t + 9.
        const uint32_t lo[2] = {__byte_perm(vw[0][w], vw[1][w], 0x5140), __byte_perm(vw[0][w], vw[1][w], 0x7362)};
        const uint32_t hi[2] = {__byte_perm(vw[2][w], vw[3][w], 0x5140), __byte_perm(vw[2][w], vw[3][w], 0x7362)};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int shift = 16 * (e % 2);
          mma_16816<MmaT>(o[4 * w + e], pa, e4m3x2_to_f16x2(static_cast<uint16_t>(lo[e / 2] >> shift)),
                          e4m3x2_to_f16x2(static_cast<uint16_t>(hi[e / 2] >> shift)));
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < D / 8; n += 2) {
        uint32_t vb[4];
        const int mat = lane / 8;
        ldmatrix_x4_trans(vb, v_tile + swizzle<D>((mat % 2) * 8 + lane % 8, n + mat / 2));
        mma_16816<MmaT>(o[n], pa, vb[0], vb[1]);
        mma_16816<MmaT>(o[n + 1], pa, vb[2], vb[3]);
      }
    }
  };

  // Pipeline: every stage is filled before the first tile is consumed, and a stage is refilled
  // (tile i + kStages) as soon as tile i is consumed, so that kStages tiles are in flight while a
  // warp waits. Unrolled over the stages so that key_mask and blocks are indexed by constants
  // (they stay in registers).
#pragma unroll
  for (int s = 0; s < kStages; ++s) load_blocks(s, blocks[s]);
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    issue(s, s, blocks[s]);
    load_blocks(s + kStages, blocks[s]);
  }
  cp_async_wait<kStages>();  // this thread's part of q (the oldest group)
  __syncthreads();           // every thread's part
  if constexpr (kFp8) {
    // q -> float16 in place for the float16 products. A bfloat16 row is first multiplied by
    // 2^-e (e from the row's largest finite |q|: it lands in [2^14, 2^15)), which is exact and
    // keeps it in float16's range; 2^e moves into that row's logit factor.
    if constexpr (!std::is_same_v<T, fp16_t>) {
      constexpr int kWords = D / 64;  // bfloat16 pairs per lane
      uint32_t* words = reinterpret_cast<uint32_t*>(q_tile);
      for (int r = warp; r < kRows; r += kWarps) {
        float2 x[kWords];
        float largest = 0.f;
#pragma unroll
        for (int k = 0; k < kWords; ++k) {
          const int wi = lane * kWords + k;  // the row's word wi: chunk wi / 4, word wi % 4
          const uint32_t* pair = &words[4 * swizzle<D>(r, wi / 4) + wi % 4];
          x[k] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(pair));
          if (fabsf(x[k].x) < INFINITY) largest = fmaxf(largest, fabsf(x[k].x));
          if (fabsf(x[k].y) < INFINITY) largest = fmaxf(largest, fabsf(x[k].y));
        }
        largest = device::warp_reduce_max(largest);
        int e = 0;
        if (largest > 0.f) {
          int exponent;
          frexpf(largest, &exponent);  // largest in [2^(exponent - 1), 2^exponent)
          e = max(-100, min(113, exponent - 15));  // 2^e and 2^-e stay normal floats
        }
        const float down = __int_as_float((127 - e) << 23);  // 2^-e, exact
#pragma unroll
        for (int k = 0; k < kWords; ++k) {
          const int wi = lane * kWords + k;
          const __half2 h = __floats2half2_rn(x[k].x * down, x[k].y * down);
          words[4 * swizzle<D>(r, wi / 4) + wi % 4] = *reinterpret_cast<const uint32_t*>(&h);
        }
        if (lane == 0) q_row_scale[r] = __int_as_float((127 + e) << 23);
      }
      __syncthreads();
      row_q_scale[0] = q_scale * q_row_scale[lane / 4];
      row_q_scale[1] = q_scale * q_row_scale[lane / 4 + 8];
    }
    // q as the products' A fragments, in the K reads' dim order: entry (16-dim step ks = 4 G + i,
    // lane (g, t)) holds rows g and g + 8 at dims p, p + 1 then p + 2, p + 3, p = 64 G + 16 t + 4 i.
    // One 16-byte read per product, no register moves.
    constexpr int kFrags = D / 16 * 32;
    constexpr int kPerThread = (kFrags + kThreads - 1) / kThreads;
    const uint32_t* words = reinterpret_cast<const uint32_t*>(q_tile);
    const auto word_at = [&](int r, int dim) { return words[4 * swizzle<D>(r, dim / 8) + (dim % 8) / 2]; };
    uint4 frag[kPerThread];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int f = threadIdx.x + k * kThreads;
      if (f < kFrags) {
        const int ks = f / 32, g = (f % 32) / 4, t = f % 4;
        const int dim = (ks / 4) * 64 + 16 * t + 4 * (ks % 4);
        frag[k] = make_uint4(word_at(g, dim), word_at(g + 8, dim), word_at(g, dim + 2), word_at(g + 8, dim + 2));
      }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int f = threadIdx.x + k * kThreads;
      if (f < kFrags) q_tile[f] = frag[k];
    }
    __syncthreads();
  }
  for (int i0 = 0; i0 < my_tiles; i0 += kStages) {
#pragma unroll
    for (int j = 0; j < kStages; ++j) {
      if (i0 + j < my_tiles) {  // uniform over the warp
        cp_async_wait<kStages - 1>();
        __syncwarp();  // every lane's copies of tile i0 + j landed
        consume(j);
        __syncwarp();  // every lane is done reading stage j
        issue(i0 + j + kStages, j, blocks[j]);
        load_blocks(i0 + j + 2 * kStages, blocks[j]);
      }
    }
  }
  cp_async_wait<0>();
  device::pdl_launch_dependents();

  // Merge the warps' states: rows' maxima and sums, then each warp's O scaled to the common max.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(device::kFullMask, l[h], 1);
    l[h] += __shfl_xor_sync(device::kFullMask, l[h], 2);
  }
  __syncthreads();  // every warp is done with its ring
  constexpr int kStride = kEpilogueStride<D>;
  float* warp_o = reinterpret_cast<float*>(smem);        // [kWarps][kRows][kStride]
  float* warp_m = warp_o + kWarps * kRows * kStride;     // [kWarps][kRows]
  float* warp_l = warp_m + kWarps * kRows;               // [kWarps][kRows]
  float* split_lse = warp_l + kWarps * kRows;            // [kRows]: the CTA's lse (cluster merge)
  static_assert((kWarps * kRows * (kStride + 2) + kRows) * 4 <= kSmemBytes<D, kWarps, kFp8>,
                "the epilogue's states must fit the CTA's shared memory");
  const int r0 = lane / 4;
  if (lane % 4 == 0) {
    warp_m[warp * kRows + r0] = m[0];
    warp_m[warp * kRows + r0 + 8] = m[1];
    warp_l[warp * kRows + r0] = l[0];
    warp_l[warp * kRows + r0 + 8] = l[1];
  }
  __syncthreads();
  float weight[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, warp_m[w * kRows + r0 + 8 * h]);
    weight[h] = state_weights(m[h], m_all).x;
  }
  float* my_rows = warp_o + (warp * kRows + r0) * kStride;
  if constexpr (kFp8) {  // column c of tile n holds dim fp8_out_dim(n, c): pair tiles n, n + 1
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float* at = my_rows + fp8_out_dim<D>(n, (lane % 4) * 2 + c);
        *reinterpret_cast<float2*>(at) = make_float2(o[n][c] * weight[0], o[n + 1][c] * weight[0]);
        *reinterpret_cast<float2*>(at + 8 * kStride) =
            make_float2(o[n][c + 2] * weight[1], o[n + 1][c + 2] * weight[1]);
      }
    }
  } else {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      float* row = my_rows + n * 8 + (lane % 4) * 2;
      *reinterpret_cast<float2*>(row) = make_float2(o[n][0] * weight[0], o[n][1] * weight[0]);
      *reinterpret_cast<float2*>(row + 8 * kStride) = make_float2(o[n][2] * weight[1], o[n][3] * weight[1]);
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kRows * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    if (g >= heads) break;  // idx grows with g
    float m_all = -INFINITY, l_all = 0.f, value = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_all = fmaxf(m_all, warp_m[w * kRows + g]);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      l_all += warp_l[w * kRows + g] * state_weights(warp_m[w * kRows + g], m_all).x;
      value += warp_o[(w * kRows + g) * kStride + d];
    }
    // No key: 0 and -inf. A NaN (from q or an attended key) stays NaN: fmaxf skipped it in the
    // maxima, but the sums carry it.
    value = l_all == 0.f ? 0.f : value / l_all * v_scale;
    const float lse = l_all == 0.f ? -INFINITY : (m_all + log2f(l_all)) * kLn2;
    const int64_t h = static_cast<int64_t>(b) * p.num_heads + head0 + g;
    if (p.num_splits == 1) {
      p.out[h * D + d] = device::from_float<T>(value);
      if (d == 0) p.lse[h] = lse;
    } else if (p.cluster_merge) {  // in place: only this thread reads warp 0's (g, d)
      warp_o[g * kStride + d] = value;
      if (d == 0) split_lse[g] = lse;
    } else {
      p.partial_out[(h * p.num_splits + split) * D + d] = value;
      if (d == 0) p.partial_lse[h * p.num_splits + split] = lse;
    }
  }
  if (p.cluster_merge) {
    MergeClusterSplits<kThreads, D, kStride>(p.out, p.lse, static_cast<int64_t>(b) * p.num_heads + head0, warp_o,
                                             split_lse, heads);
  }
}

// ---------------------------------------------------------------------------- merges

/*! \brief One CTA per (request, head): out = sum_s w_s o_s / sum_s w_s over the splits' partial
 * states, w_s = e^(lse_s - max lse) (natural log). It runs after the decode kernel, on the
 * critical path of every split call, and reads partials that sit in L2: its time is load
 * latency, so the splits are spread over kMergeWarps warps whose lanes hold D / 32 dims each and
 * keep kMergeUnroll rows in flight. Every warp derives the max and the sum from all the lses
 * itself (no barrier); one barrier sums the warps' rows. A NaN lse makes the row NaN (fmaxf
 * alone would drop it). */
constexpr int kMergeWarps = 4;
constexpr int kMergeUnroll = 8;

template <typename T, int D>
__global__ void __launch_bounds__(kMergeWarps * 32) MergeSplitsKernel(T* out, float* lse, const float* partial_out,
                                                                      const float* partial_lse, int num_splits) {
  constexpr int kDims = D / 32;  // per lane: 2, 4 or 8 consecutive floats
  __shared__ float sums[kMergeWarps][D];
  device::pdl_wait_primary();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x;
  const float* lses = partial_lse + row * num_splits;
  const float* rows_of = partial_out + row * num_splits * D + lane * kDims;
  // kMergeUnroll rows a warp, all loads in flight; the first batch is issued before the lse
  // reductions, which do not depend on it.
  float x[kMergeUnroll][kDims];
  const auto load_rows = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
      const int s = s0 + u * kMergeWarps;
#pragma unroll
      for (int i = 0; i < kDims; i += 2) {
        const float2 v = s < num_splits ? *reinterpret_cast<const float2*>(rows_of + s * D + i) : float2{0.f, 0.f};
        x[u][i] = v.x;
        x[u][i + 1] = v.y;
      }
    }
  };
  load_rows(warp);
  float m = -INFINITY;
  bool nan = false;
  for (int s = lane; s < num_splits; s += 32) {
    m = fmaxf(m, lses[s]);
    nan |= lses[s] != lses[s];
  }
  m = device::warp_reduce_max(m);
  nan = __any_sync(device::kFullMask, nan);
  float total = 0.f;
  for (int s = lane; s < num_splits; s += 32) total += split_weight(lses[s], m);
  total = device::warp_reduce_sum(total);
  if (nan) total = NAN;
  float o[kDims] = {};
  for (int s0 = warp; s0 < num_splits; s0 += kMergeWarps * kMergeUnroll) {
    if (s0 != warp) load_rows(s0);
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
      const int s = s0 + u * kMergeWarps;
      const float w = s < num_splits ? split_weight(lses[s], m) : 0.f;
#pragma unroll
      for (int i = 0; i < kDims; ++i) o[i] = fmaf(w, x[u][i], o[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kDims; ++i) sums[warp][lane * kDims + i] = o[i];
  __syncthreads();
  const float inv = merged_inv(total);  // NaN stays NaN
  for (int d = threadIdx.x; d < D; d += kMergeWarps * 32) {
    float value = 0.f;
#pragma unroll
    for (int w = 0; w < kMergeWarps; ++w) value += sums[w][d];
    out[row * D + d] = device::from_float<T>(value * inv);
  }
  if (threadIdx.x == 0) lse[row] = merged_lse(m, total);
}

/*! \brief One warp per (row, head): the union of two partial states (merge_attention_states). */
template <typename T>
__global__ void MergeStatesKernel(T* v, float* lse, const T* v_a, const float* lse_a, const T* v_b,
                                  const float* lse_b, int64_t rows, int heads, int head_dim,
                                  int64_t a_stride, int64_t b_stride) {
  device::pdl_wait_primary();
  const int warps = blockDim.x / device::kWarpThreads;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / device::kWarpThreads;
  const int lane = threadIdx.x % device::kWarpThreads;
  if (idx >= rows * heads) return;
  const int64_t r = idx / heads;
  const int h = static_cast<int>(idx % heads);
  const float la = lse_a[idx], lb = lse_b[idx];
  float2 w = state_weights(la * kLog2e, lb * kLog2e);
  if (la != la || lb != lb) w = make_float2(NAN, NAN);  // fmaxf would drop a NaN: keep it
  const float total = w.x + w.y;
  const float inv = total > 0.f ? 1.f / total : (total == 0.f ? 0.f : NAN);
  const T* a = v_a + r * a_stride + static_cast<int64_t>(h) * head_dim;
  const T* bb = v_b + r * b_stride + static_cast<int64_t>(h) * head_dim;
  for (int d = lane; d < head_dim; d += device::kWarpThreads) {
    const float o = (w.x * device::to_float(a[d]) + w.y * device::to_float(bb[d])) * inv;
    v[idx * head_dim + d] = device::from_float<T>(o);
  }
  if (lane == 0) lse[idx] = total == 0.f ? -INFINITY : fmaxf(la, lb) + logf(total);
}

// ---------------------------------------------------------------------------- float32

/*! \brief float32 attention (no tensor cores: a correctness mode, e.g. to match a float32 model
 * token for token). One CTA per (split, query head, request); its warps take the split's keys in
 * turn, each lane holding D / 32 dims of q and of its running output; a warp-wide sum gives each
 * logit. The warps' online-softmax states (log2 units) merge through shared memory into out / lse,
 * or into the split's float32 partial state for MergeSplitsKernel. Bad indices: as DecodeKernel. */
constexpr int kFloatWarps = 4;

template <int D>
__global__ void __launch_bounds__(kFloatWarps * 32) DecodeFloatKernel(DecodeParams<float, float> p) {
  constexpr int kDims = D / 32;
  __shared__ float warp_o[kFloatWarps][D];
  __shared__ float warp_m[kFloatWarps], warp_l[kFloatWarps];
  device::pdl_wait_primary();
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kvh = h / p.group;

  int64_t len = p.seq_lens[b];
  if (len < 0 || len > p.max_keys) {
    if (threadIdx.x == 0 && split == 0 && h == 0) device::record_error(p.error, -(b + 1), len);
    len = len < 0 ? 0 : p.max_keys;
  }
  const int64_t begin = p.window > 0 && len > p.window ? len - p.window : 0;
  const int64_t chunk = (len - begin + p.num_splits - 1) / p.num_splits;
  const int64_t first = begin + split * chunk;
  const int64_t last = min(len, first + chunk);

  float q[kDims], o[kDims];
  const float* q_row = p.q + b * p.q_stride + static_cast<int64_t>(h) * D + lane * kDims;
#pragma unroll
  for (int i = 0; i < kDims; ++i) {
    q[i] = q_row[i];
    o[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int32_t* table = p.block_table + b * p.table_stride;
  const int64_t row_elems = static_cast<int64_t>(p.num_kv_heads) * D;
  for (int64_t t = first + warp; t < last; t += kFloatWarps) {
    const uint32_t j = p.block_size.div(static_cast<uint32_t>(t));
    const int32_t block = table[j];
    if (block < 0 || block >= p.num_blocks) {  // warp-uniform: the key is skipped
      if (lane == 0) device::record_error(p.error, (static_cast<int64_t>(b) << 32) | j, block);
      continue;
    }
    const int64_t offset = (t - static_cast<int64_t>(j) * p.block_size.d) * row_elems + kvh * D + lane * kDims;
    const float* k = p.k_cache + block * p.k_block_stride + offset;
    const float* v = p.v_cache + block * p.v_block_stride + offset;
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kDims; ++i) dot = fmaf(q[i], k[i], dot);
    dot = device::warp_reduce_sum(dot);
    const float x = p.soft_cap ? p.logit_scale * tanhf(dot * p.q_scale) : dot * p.q_scale;
    const float m_new = fmaxf(m, x);
    const float keep = exp2f(m - m_new), e = exp2f(x - m_new);  // keep: 0 while m is -inf
    l = fmaf(l, keep, e);
#pragma unroll
    for (int i = 0; i < kDims; ++i) o[i] = fmaf(o[i], keep, e * v[i]);
    m = m_new;
  }
#pragma unroll
  for (int i = 0; i < kDims; ++i) warp_o[warp][lane * kDims + i] = o[i];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
  __syncthreads();
  float m_all = -INFINITY;
#pragma unroll
  for (int w = 0; w < kFloatWarps; ++w) m_all = fmaxf(m_all, warp_m[w]);
  float weight[kFloatWarps], l_all = 0.f;
#pragma unroll
  for (int w = 0; w < kFloatWarps; ++w) {
    weight[w] = warp_m[w] == -INFINITY ? 0.f : exp2f(warp_m[w] - m_all);
    l_all = fmaf(warp_l[w], weight[w], l_all);
  }
  const float inv = l_all == 0.f ? 0.f : 1.f / l_all;  // no keys: out 0; NaN stays NaN
  const float lse = l_all == 0.f ? -INFINITY : (m_all + log2f(l_all)) * kLn2;
  const int64_t row = static_cast<int64_t>(b) * p.num_heads + h;
  float* dst = p.num_splits > 1 ? p.partial_out + (row * p.num_splits + split) * D : p.out + row * D;
  for (int d = threadIdx.x; d < D; d += kFloatWarps * 32) {
    float value = 0.f;
#pragma unroll
    for (int w = 0; w < kFloatWarps; ++w) value = fmaf(warp_o[w][d], weight[w], value);
    dst[d] = value * inv;
  }
  if (threadIdx.x == 0) (p.num_splits > 1 ? p.partial_lse[row * p.num_splits + split] : p.lse[row]) = lse;
}

// ---------------------------------------------------------------------------- launch

// Small grids (one CTA per SM at most) on sm_90 run the splits of a (request, KV head) as one
// cluster that merges them itself (p.cluster_merge), which saves the merge kernel's launch and
// wait (0.5-1.1 µs, measured). Clusters are placed densely (two CTAs of one cluster share an SM where
// they fit, leaving other SMs idle), so such a launch asks for more than half an SM's shared
// memory: each CTA gets an SM of its own. Only where all of the grid's clusters fit at once.
template <typename T, typename KV, int D, int kWarps>
void LaunchDecode(DecodeParams<T, KV>& p, DLDevice device, int batch) {
  constexpr bool kFp8 = sizeof(KV) == 1;
  constexpr int kThreads = kWarps * 32;
  auto kernel = DecodeKernel<T, KV, D, kWarps>;
  host::PreferMaxSharedMemoryCarveout(kernel, device.device_id);
  p.head_chunks = (p.group + kRows - 1) / kRows;
  const int64_t clusters = static_cast<int64_t>(p.num_kv_heads) * p.head_chunks * batch;
  int64_t smem = kSmemBytes<D, kWarps, kFp8>;
  p.cluster_merge = false;
  if (p.num_splits > 1 && p.num_splits <= kMaxClusterSplits && host::GetComputeCapability(device.device_id) >= 90 &&
      clusters * p.num_splits <= host::MultiProcessorCount(device.device_id)) {
    const int64_t spread = std::max(smem, host::SharedMemoryPerMultiprocessor(device.device_id) / 2 + 1);
    // How many clusters of each size fit at once, asked once per device (this kernel's cache).
    constexpr int kMaxCachedDevices = 64;
    static std::atomic<int> fit[kMaxCachedDevices][kMaxClusterSplits + 1] = {};  // clusters + 1; 0: not asked
    const int dev = device.device_id;
    int max_clusters = 0;
    if (dev >= 0 && dev < kMaxCachedDevices && fit[dev][p.num_splits].load(std::memory_order_relaxed) != 0) {
      max_clusters = fit[dev][p.num_splits].load(std::memory_order_relaxed) - 1;
    } else {
      max_clusters = spread <= host::MaxSharedMemoryPerBlock(dev)
                         ? host::MaxActiveClusters(kernel, dev, p.num_splits, kThreads, spread)
                         : 0;
      if (dev >= 0 && dev < kMaxCachedDevices) fit[dev][p.num_splits].store(max_clusters + 1, std::memory_order_relaxed);
    }
    p.cluster_merge = clusters <= max_clusters;
    if (p.cluster_merge) smem = spread;
  }
  const dim3 grid(p.num_splits, p.num_kv_heads * p.head_chunks, batch);
  host::LaunchKernel(grid, kThreads, device, smem).enable_pdl(true).cluster(p.cluster_merge ? p.num_splits : 1)(
      kernel, p);
}

// The large CTA where the GPU gives a block its shared memory, else the small one.
template <typename T, typename KV, int D>
void LaunchDecodeFitting(DecodeParams<T, KV>& p, DLDevice device, int batch) {
  constexpr bool kFp8 = sizeof(KV) == 1;
  const int64_t limit = host::MaxSharedMemoryPerBlock(device.device_id);
  if (kSmemBytes<D, kWarpsLarge, kFp8> <= limit) return LaunchDecode<T, KV, D, kWarpsLarge>(p, device, batch);
  host::ValueCheck(kSmemBytes<D, kWarpsSmall, kFp8> <= limit, "decode_attention: head_dim ", D, " needs ",
                   kSmemBytes<D, kWarpsSmall, kFp8>, " bytes of shared memory per block; cuda:", device.device_id,
                   " offers ", limit);
  LaunchDecode<T, KV, D, kWarpsSmall>(p, device, batch);
}

// T: q's and out's element type; KV: the cache's (T, or __nv_fp8_storage_t for float8 e4m3fn).
template <typename T, typename KV>
void Decode(const decode_attention::DecodeArgs& a, tvm::ffi::TensorView out, tvm::ffi::TensorView lse,
            tvm::ffi::TensorView q, tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
            tvm::ffi::TensorView block_table, tvm::ffi::TensorView seq_lens, tvm::ffi::TensorView partial_out,
            tvm::ffi::TensorView partial_lse, tvm::ffi::TensorView error) {
  using host::data_ptr;
  const int64_t max_keys = a.max_blocks * a.block_size;
  // Grid limits (y and z < 65536) and 32-bit key indices.
  const int64_t head_ctas = a.num_kv_heads * ((a.group() + kRows - 1) / kRows);
  host::ValueCheck(a.batch < 65536, "decode_attention: batch must be < 65536 on CUDA, got ", a.batch);
  host::ValueCheck(head_ctas < 65536, "decode_attention: num_kv_heads * ceil(group / 16) must be < 65536 on CUDA, got ",
                   head_ctas);
  host::ValueCheck(max_keys < (int64_t{1} << 31),
                   "decode_attention: max_blocks_per_seq * block_size must be < 2^31 on CUDA, got ", max_keys);
  // 16-byte vector loads and cp.async need 16-byte aligned rows.
  const auto aligned = [](const void* ptr, int64_t stride, int64_t elem_bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && stride * elem_bytes % 16 == 0;
  };
  if constexpr (!std::is_same_v<T, float>) {  // the float32 kernel reads scalars
    host::ValueCheck(aligned(data_ptr<const T>(q), a.q_stride, sizeof(T)),
                     "decode_attention: q must be 16-byte aligned (data pointer and batch stride ", a.q_stride,
                     ") on CUDA");
    host::ValueCheck(aligned(data_ptr<const KV>(k_cache), a.k_block_stride, sizeof(KV)),
                     "decode_attention: k_cache must be 16-byte aligned (data pointer and block stride ",
                     a.k_block_stride, ") on CUDA");
    host::ValueCheck(aligned(data_ptr<const KV>(v_cache), a.v_block_stride, sizeof(KV)),
                     "decode_attention: v_cache must be 16-byte aligned (data pointer and block stride ",
                     a.v_block_stride, ") on CUDA");
  }
  DecodeParams<T, KV> p{};
  p.out = data_ptr<T>(out);
  p.lse = data_ptr<float>(lse);
  p.q = data_ptr<const T>(q);
  p.k_cache = data_ptr<const KV>(k_cache);
  p.v_cache = data_ptr<const KV>(v_cache);
  p.block_table = data_ptr<const int32_t>(block_table);
  p.seq_lens = data_ptr<const int32_t>(seq_lens);
  p.partial_out = data_ptr<float>(partial_out);
  p.partial_lse = data_ptr<float>(partial_lse);
  p.error = data_ptr<int64_t>(error);
  p.q_stride = a.q_stride;
  p.k_block_stride = a.k_block_stride;
  p.v_block_stride = a.v_block_stride;
  p.table_stride = a.table_stride;
  p.num_heads = static_cast<int>(a.num_heads);
  p.num_kv_heads = static_cast<int>(a.num_kv_heads);
  p.group = static_cast<int>(a.group());
  p.num_blocks = static_cast<int>(a.num_blocks);
  p.max_blocks = static_cast<int>(a.max_blocks);
  p.window = a.window < max_keys ? static_cast<int>(a.window) : 0;  // a window past every key keeps all
  p.num_splits = static_cast<int>(a.num_splits);
  p.max_keys = max_keys;
  p.block_size = FastDivmod(static_cast<uint32_t>(a.block_size));
  p.soft_cap = a.soft_cap > 0.f;
  p.q_scale = p.soft_cap ? a.scale / a.soft_cap : a.scale * kLog2e;
  p.logit_scale = p.soft_cap ? a.soft_cap * kLog2e : 1.f;
  p.k_scale = a.k_scale;
  p.v_scale = a.v_scale;
  const int batch = static_cast<int>(a.batch);
  if constexpr (std::is_same_v<T, float>) {
    host::ValueCheck(a.num_heads < 65536, "decode_attention: num_heads must be < 65536 on CUDA, got ", a.num_heads);
    const auto kernel = a.head_dim == 64    ? DecodeFloatKernel<64>
                        : a.head_dim == 128 ? DecodeFloatKernel<128>
                                            : DecodeFloatKernel<256>;
    const dim3 grid(p.num_splits, p.num_heads, batch);
    host::LaunchKernel(grid, kFloatWarps * 32, a.device).enable_pdl(true)(kernel, p);
  } else {
    switch (a.head_dim) {
      case 64: LaunchDecodeFitting<T, KV, 64>(p, a.device, batch); break;
      case 128: LaunchDecodeFitting<T, KV, 128>(p, a.device, batch); break;
      default: LaunchDecodeFitting<T, KV, 256>(p, a.device, batch); break;  // the contract allows no other
    }
  }
  if (a.num_splits > 1 && !p.cluster_merge) {
    const auto merge = a.head_dim == 64 ? MergeSplitsKernel<T, 64>
                       : a.head_dim == 128 ? MergeSplitsKernel<T, 128>
                                           : MergeSplitsKernel<T, 256>;
    host::LaunchKernel(static_cast<unsigned>(a.batch * a.num_heads), kMergeWarps * 32, a.device)
        .enable_pdl(true)(merge, p.out, p.lse, p.partial_out, p.partial_lse, p.num_splits);
  }
}

}  // namespace decode_attention_detail

/*!
 * \brief out, lse = attention of q [B, H, D] over each request's paged keys (arguments:
 * decode_attention.hpp); num_threads is the CPU's, checked and otherwise ignored here. Asynchronous:
 * no host sync.
 */
inline void decode_attention(tvm::ffi::TensorView out, tvm::ffi::TensorView lse, tvm::ffi::TensorView q,
                             tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
                             tvm::ffi::TensorView block_table, tvm::ffi::TensorView seq_lens,
                             tvm::ffi::TensorView partial_out, tvm::ffi::TensorView partial_lse,
                             tvm::ffi::TensorView k_scale, tvm::ffi::TensorView v_scale, double k_scale_value,
                             double v_scale_value, double scale, int64_t sliding_window, double soft_cap,
                             int64_t num_splits, int64_t num_threads, tvm::ffi::TensorView error) {
  mllm_kernel::decode_attention::VerifyNumThreads(num_threads);
  const auto a = mllm_kernel::decode_attention::VerifyDecodeAttention<kDLCUDA>(
      out, lse, q, k_cache, v_cache, block_table, seq_lens, partial_out, partial_lse, k_scale, v_scale,
      k_scale_value, v_scale_value, scale, sliding_window, soft_cap, num_splits, error);
  if (a.empty()) return;  // a zero-block grid is a launch error
  const auto run = [&]<typename T>() {
    if (a.fp8()) {
      decode_attention_detail::Decode<T, __nv_fp8_storage_t>(a, out, lse, q, k_cache, v_cache, block_table,
                                                             seq_lens, partial_out, partial_lse, error);
    } else {
      decode_attention_detail::Decode<T, T>(a, out, lse, q, k_cache, v_cache, block_table, seq_lens, partial_out,
                                            partial_lse, error);
    }
  };
  if (a.dtype == host::kDType<float>) {  // the contract gives float32 q a float32 cache on CUDA
    decode_attention_detail::Decode<float, float>(a, out, lse, q, k_cache, v_cache, block_table, seq_lens,
                                                  partial_out, partial_lse, error);
  } else if (a.dtype == host::kDType<host::float16_tag>) {
    run.template operator()<device::fp16_t>();
  } else {
    run.template operator()<device::bf16_t>();
  }
}

/*! \brief (v, lse) = the union of two partial attention states (arguments: decode_attention.hpp). */
inline void merge_attention_states(tvm::ffi::TensorView v, tvm::ffi::TensorView lse, tvm::ffi::TensorView v_a,
                                   tvm::ffi::TensorView lse_a, tvm::ffi::TensorView v_b,
                                   tvm::ffi::TensorView lse_b) {
  using host::data_ptr;
  const auto a = mllm_kernel::decode_attention::VerifyMergeStates<kDLCUDA>(v, lse, v_a, lse_a, v_b, lse_b);
  if (a.empty()) return;
  const int64_t rows = a.rows * a.num_heads;
  constexpr int kRowsPerBlock = 4;  // one warp per (row, head)
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    host::LaunchKernel(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                       kRowsPerBlock * device::kWarpThreads, a.device)
        .enable_pdl(true)(decode_attention_detail::MergeStatesKernel<T>, data_ptr<T>(v), data_ptr<float>(lse),
                          data_ptr<const T>(v_a), data_ptr<const float>(lse_a), data_ptr<const T>(v_b),
                          data_ptr<const float>(lse_b), a.rows, static_cast<int>(a.num_heads),
                          static_cast<int>(a.head_dim), a.a_stride, a.b_stride);
  });
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_DECODE_ATTENTION_CUH_
