/*!
 * \file kernels/prefill_attention/prefill_attention.cuh
 * \brief CUDA prefill attention over ragged K/V or the paged KV cache, on torch's current stream
 * (arguments: prefill_attention.hpp): FlashAttention-2 style with mma.sync tensor cores (sm_80+,
 * this file), or on sm_90a the Hopper kernel of
 * prefill_attention_sm90.cuh (wgmma, TMA, warp specialization), chosen by LaunchPrefill.
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * mllm_kernel::gpu::prefill_attention and mllm_kernel::gpu::paged_prefill_attention.
 *
 * Two kernels per call, no host sync (so a CUDA graph stays valid when the lengths change):
 *  - PlanKernel (one CTA) reads the lengths, clamps and records bad ones, and writes the work
 *    list: one item per (request, tile of block_m queries), the longest requests first and the
 *    heaviest (last, under a causal mask) tile of each first, so that long items do not end up
 *    in the last wave.
 *  - PrefillKernel: one CTA per (work item, query head). Its warps own 32 query rows each (16 at
 *    head_dim 256, with twice the warps); the CTA streams the K and V tiles of the keys its rows
 *    can see (kBlockN keys, two stages in flight through cp.async) and each warp computes
 *    S = Q K^T and O += P V with m16n8k16 products and an online softmax in log2 units. Tiles
 *    that cross no mask edge (causal diagonal, window, end of the keys, a bad block, a custom
 *    mask) skip the per-key mask.
 *
 * Bad indices never reach memory: prefix sums and seq_lens are clamped, a bad block id masks its
 * keys and a missing custom_mask entry reads as 0; the first offender is recorded in `error`
 * (int64 [3]: {flag, index, value}, index = what << 56 | request << 32 | entry, what as in
 * __init__.py's _WHAT). The host never reads it here (no sync): the Python wrapper does.
 */
#ifndef MLLM_KERNEL_KERNELS_PREFILL_ATTENTION_CUH_
#define MLLM_KERNEL_KERNELS_PREFILL_ATTENTION_CUH_

#include <mllm_kernel/utils.cuh>

#include "prefill_attention.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace mllm_kernel::gpu {

namespace prefill_attention_detail {

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

constexpr int kBlockM = 128;  // query rows per CTA (a work item)
constexpr int kWideRows = 2048;  // average query rows per request from which head_dim 64 takes 192-row items
// Warps per CTA and 16-row blocks per warp: 4 warps of 32 rows, or at head_dim 256 (twice the
// accumulator registers per row) 8 warps of 16. Two row blocks per warp use each K and V
// fragment read from shared memory twice.
template <int D>
constexpr int kWarpsOf = D <= 128 ? 4 : 8;
template <int D>
constexpr int kRowBlocks = kBlockM / (16 * kWarpsOf<D>);
template <int D>
constexpr int kBlockN = D <= 128 ? 64 : 32;  // keys per tile (registers and shared memory at 256)
constexpr int kStages = 2;
constexpr int kChunk = device::kChunkElems;
template <int D>
constexpr int kSmemBytes = (kBlockM * D + kStages * 2 * kBlockN<D> * D) * 2 + kStages * kBlockN<D> + 16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The error record's `what` (the Python wrapper's _WHAT names them).
enum What : int64_t { kCuSeqlensQ = 1, kCuSeqlensK = 2, kSeqLens = 3, kBlockTable = 4, kCustomMask = 5 };
__device__ __forceinline__ void record(int64_t* error, What what, int64_t request, int64_t entry, int64_t value) {
  device::record_error(error, (static_cast<int64_t>(what) << 56) | ((request & 0xFFFFFF) << 32) | (entry & 0xFFFFFFFF),
                       value);
}

/*! \brief What PlanKernel writes for one request (clamped lengths) and reads back. */
struct Request {
  int q_start, len_q, k_start, len_k;  // k_start: ragged only
};

/*!
 * \brief The workspace (int32): mask offsets int64 [B], then num_work and next_unit (the Hopper
 * kernel's work counter, zeroed by the plan), then Request [B], then the work list int2
 * [max_work] = {request, tile}. WorkspaceInts() is its size. Each call has its own (allocated on
 * its stream), so no counter is shared by two calls in flight.
 */
struct Workspace {
  int64_t* mask_offset;
  int* num_work;
  int* next_unit;
  Request* requests;
  int2* work;
  __host__ __device__ Workspace(int32_t* base, int64_t batch)
      : mask_offset(reinterpret_cast<int64_t*>(base)),
        num_work(base + 2 * batch),
        next_unit(base + 2 * batch + 1),
        requests(reinterpret_cast<Request*>(base + 2 * batch + 2)),
        work(reinterpret_cast<int2*>(base + 2 * batch + 2 + 4 * batch)) {}
};
/*!
 * \brief The keys that `rows` queries from `row0` of \p req can see, [lo, hi): causal (`upper`)
 * cuts them at the last query's position, a window of `window` > 0 at the first one's. Both
 * kernels' tiles start from it.
 */
struct KeyRange {
  int lo, hi;
};
__device__ __forceinline__ KeyRange VisibleKeys(const Request& req, int row0, int rows, bool upper, int window) {
  const int shift = req.len_k - req.len_q;  // query j sits at position j + shift
  KeyRange r{0, req.len_k};
  if (upper) r.hi = max(0, min(r.hi, row0 + rows - 1 + shift + 1));
  if (window > 0) r.lo = max(0, row0 + shift - window + 1);
  return r;
}

// Work items of kBlockM rows or more fit in this many (the Hopper kernel's are as large or larger).
inline int64_t MaxWork(int64_t total_q, int64_t batch) { return (total_q + kBlockM - 1) / kBlockM + batch; }
inline int64_t WorkspaceInts(int64_t total_q, int64_t batch) { return 6 * batch + 2 + 2 * MaxWork(total_q, batch); }

template <typename T>
struct PrefillParams {
  T* out;
  float* lse;
  const T* q;
  const T* k;  // ragged k, or k_cache
  const T* v;
  const int32_t* cu_q;
  const int32_t* cu_k;  // ragged
  const int32_t* block_table;  // paged
  const int32_t* seq_lens;     // paged
  const uint8_t* mask;         // nullptr: none
  int32_t* workspace;
  int64_t* error;
  int64_t q_stride, k_stride, v_stride, table_stride, mask_size;
  int batch, total_q, total_k, num_heads, num_kv_heads, group, num_blocks, max_blocks, max_work;
  int block_m;        // query rows per work item: kBlockM, or the Hopper kernel's (as many or more)
  int window;         // > 0: keys pos - window < t <= pos
  int64_t max_keys;   // paged: max_blocks * block_size
  FastDivmod block_size;
  float q_scale;      // scale * log2(e), or scale / cap with a soft cap
  float logit_scale;  // 1, or cap * log2(e) after tanh
  bool soft_cap, causal, paged;
};

// ---------------------------------------------------------------------------- plan

constexpr int kPlanThreads = 1024;
constexpr int kSortMax = 4096;  // requests sorted by length up to this batch (in shared memory)

/*! \brief Inclusive prefix sum over the CTA (kPlanThreads threads); returns it and the total. */
template <typename V>
__device__ __forceinline__ V block_inclusive_scan(V x, V* warp_sums, V& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const V y = __shfl_up_sync(device::kFullMask, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    V s = lane < kPlanThreads / 32 ? warp_sums[lane] : V{0};
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const V y = __shfl_up_sync(device::kFullMask, s, o);
      if (lane >= o) s += y;
    }
    warp_sums[lane] = s;
  }
  __syncthreads();
  const V before = warp > 0 ? warp_sums[warp - 1] : V{0};
  total = warp_sums[kPlanThreads / 32 - 1];
  __syncthreads();  // warp_sums is reused by the next call
  return x + before;
}

/*!
 * \brief One CTA: clamps each request's lengths (recording the first bad entry), writes the
 * Request records and mask offsets, and the work list, longest requests first (sorted when the
 * batch fits kSortMax), each request's tiles from the last (under a causal mask the heaviest).
 */
template <typename T>
__global__ void __launch_bounds__(kPlanThreads) PlanKernel(const PrefillParams<T> p) {
  __shared__ uint64_t order[kSortMax];  // tiles << 32 | ~request, sorted descending
  __shared__ int64_t sums64[kPlanThreads / 32];
  __shared__ int sums32[kPlanThreads / 32];
  device::pdl_wait_primary();  // the lengths may come from the previous kernel
  __shared__ int first_bad[2];  // the first bad entry of cu_seqlens_q, of cu_seqlens_k / seq_lens
  Workspace ws(p.workspace, p.batch);
  const int B = p.batch;
  if (threadIdx.x == 0) first_bad[0] = first_bad[1] = INT_MAX;
  __syncthreads();
  // Pass 1: lengths, clamped (the same way in every CTA of the attention kernel, which reads
  // them from here), and mask offsets (a running carry over chunks of the batch).
  int64_t mask_carry = 0;
  for (int r0 = 0; r0 < B; r0 += kPlanThreads) {
    const int r = r0 + static_cast<int>(threadIdx.x);
    int64_t mask_len = 0;
    if (r < B) {
      const int raw_start = p.cu_q[r], raw_end = p.cu_q[r + 1];
      const int q_start = min(max(raw_start, 0), p.total_q);
      const int q_end = min(max(raw_end, q_start), p.total_q);
      // Prefix sums: entry 0 must be 0, entry r + 1 at least entry r and at most the total, the
      // last entry the total.
      if (raw_end < raw_start || raw_end > p.total_q || (r == B - 1 && raw_end != p.total_q)) {
        atomicMin(&first_bad[0], r + 1);
      }
      if (r == 0 && raw_start != 0) atomicMin(&first_bad[0], 0);
      Request req{q_start, q_end - q_start, 0, 0};
      if (p.paged) {
        const int len = p.seq_lens[r];
        if (len < 0 || len > p.max_keys) atomicMin(&first_bad[1], r);
        req.len_k = static_cast<int>(min(max(static_cast<int64_t>(len), int64_t{0}), p.max_keys));
      } else {
        const int raw_k0 = p.cu_k[r], raw_k1 = p.cu_k[r + 1];
        const int k0 = min(max(raw_k0, 0), p.total_k);
        const int k1 = min(max(raw_k1, k0), p.total_k);
        if (raw_k1 < raw_k0 || raw_k1 > p.total_k || (r == B - 1 && raw_k1 != p.total_k)) {
          atomicMin(&first_bad[1], r + 1);
        }
        if (r == 0 && raw_k0 != 0) atomicMin(&first_bad[1], 0);
        req.k_start = k0;
        req.len_k = k1 - k0;
      }
      ws.requests[r] = req;
      mask_len = static_cast<int64_t>(req.len_q) * req.len_k;
    }
    int64_t chunk_total = 0;
    const int64_t inclusive = block_inclusive_scan(mask_len, sums64, chunk_total);  // has barriers
    if (r < B) ws.mask_offset[r] = mask_carry + inclusive - mask_len;
    mask_carry += chunk_total;
  }
  // One record, the first offender in this order (the record keeps the first one written).
  if (threadIdx.x == 0) {
    if (const int e = first_bad[0]; e != INT_MAX) {
      record(p.error, kCuSeqlensQ, max(e - 1, 0), e, p.cu_q[e]);
    } else if (const int e1 = first_bad[1]; e1 != INT_MAX) {
      if (p.paged) {
        record(p.error, kSeqLens, e1, e1, p.seq_lens[e1]);
      } else {
        record(p.error, kCuSeqlensK, max(e1 - 1, 0), e1, p.cu_k[e1]);
      }
    } else if (p.mask != nullptr && mask_carry != p.mask_size) {
      record(p.error, kCustomMask, 0, mask_carry, p.mask_size);
    }
  }
  __syncthreads();  // Request records written
  // Pass 2: the work list. Sorting keys: tiles << 32 | ~request (longest first, then in order).
  const bool sorted = B <= kSortMax;
  int n = 1;
  while (n < B) n <<= 1;
  if (sorted) {
    for (int i = threadIdx.x; i < n; i += kPlanThreads) {
      uint64_t key = 0;
      if (i < B) {
        const uint64_t tiles = (ws.requests[i].len_q + p.block_m - 1) / p.block_m;
        key = tiles << 32 | static_cast<uint32_t>(~i);
      }
      order[i] = key;
    }
    __syncthreads();
    for (int size = 2; size <= n; size <<= 1) {  // bitonic sort, descending
      for (int stride = size / 2; stride > 0; stride >>= 1) {
        for (int i = threadIdx.x; i < n; i += kPlanThreads) {
          const int j = i ^ stride;
          if (j > i) {
            const bool descending = (i & size) == 0;
            const uint64_t a = order[i], b = order[j];
            if ((a < b) == descending) {
              order[i] = b;
              order[j] = a;
            }
          }
        }
        __syncthreads();
      }
    }
  }
  int carry = 0;
  for (int i0 = 0; i0 < B; i0 += kPlanThreads) {
    const int i = i0 + static_cast<int>(threadIdx.x);
    int r = 0, tiles = 0;
    if (i < B) {
      r = sorted ? static_cast<int>(~static_cast<uint32_t>(order[i])) : i;
      tiles = (ws.requests[r].len_q + p.block_m - 1) / p.block_m;
    }
    int chunk_total = 0;
    const int first = carry + block_inclusive_scan(tiles, sums32, chunk_total) - tiles;
    for (int t = 0; t < tiles && first + t < p.max_work; ++t) ws.work[first + t] = make_int2(r, tiles - 1 - t);
    carry += chunk_total;
  }
  // Only clamped lengths that overlap (a bad cu_seqlens_q, recorded above) can overflow the list.
  if (threadIdx.x == 0) {
    *ws.num_work = min(carry, p.max_work);
    *ws.next_unit = 0;
  }
}

// ---------------------------------------------------------------------------- attention

template <typename T, int D, bool kPaged>
__global__ void __launch_bounds__(kWarpsOf<D> * 32, D <= 128 ? 2 : 1) PrefillKernel(const PrefillParams<T> p) {
  constexpr int kWarps = kWarpsOf<D>, kThreads = kWarps * 32, kMB = kRowBlocks<D>;
  constexpr int N = kBlockN<D>;
  constexpr int kChunks = D / kChunk;  // 16-byte chunks per row
  extern __shared__ __align__(128) unsigned char smem[];
  uint4* q_tile = reinterpret_cast<uint4*>(smem);           // [kBlockM, D], swizzled
  uint4* kv_tiles = q_tile + kBlockM * kChunks;              // [kStages][K, V][N, D], swizzled
  uint8_t* key_ok = reinterpret_cast<uint8_t*>(kv_tiles + kStages * 2 * N * kChunks);  // [kStages][N]
  int* any_bad = reinterpret_cast<int*>(key_ok + kStages * N);  // a bad block id was met: mask per key
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  device::pdl_wait_primary();  // the plan (and q, k, v from earlier kernels)
  const Workspace ws(p.workspace, p.batch);
  if (static_cast<int>(blockIdx.x) >= *ws.num_work) return;
  const int2 item = ws.work[blockIdx.x];
  const Request req = ws.requests[item.x];
  const int b = item.x, head = blockIdx.y, kvh = head / p.group;
  const int row0 = item.y * kBlockM;              // first query of the tile, within the request
  const int rows = min(kBlockM, req.len_q - row0);
  const int shift = req.len_k - req.len_q;        // query j sits at position j + shift
  const bool use_mask = p.mask != nullptr;
  const bool causal = p.causal && !use_mask;
  const bool upper = causal || p.window > 0;      // keys past a query's position are masked

  const KeyRange keys = VisibleKeys(req, row0, rows, upper, p.window);
  const int lo = keys.lo, hi = keys.hi;
  const int num_tiles = hi > lo ? (hi - lo + N - 1) / N : 0;
  if (threadIdx.x == 0) *any_bad = 0;

  // q rows of the tile (zero past `rows`): the first copy group.
  const T* q_base = p.q + static_cast<int64_t>(req.q_start + row0) * p.q_stride + static_cast<int64_t>(head) * D;
  for (int i = threadIdx.x; i < kBlockM * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    cp_async_16(q_tile + swizzle<D>(r, c), r < rows ? q_base + r * p.q_stride + c * kChunk : p.q, r < rows);
  }
  cp_async_commit();
  __syncthreads();  // any_bad cleared before a copy can set it

  const int32_t* table = kPaged ? p.block_table + static_cast<int64_t>(b) * p.table_stride : nullptr;
  const int64_t row_elems = static_cast<int64_t>(p.num_kv_heads) * D;
  // Copies key tile `kt` (keys lo + kt * N ...) into `stage`; keys past hi or in a bad block
  // zero-fill and are marked in key_ok. Always one commit group (maybe empty).
  auto issue = [&](int kt, int stage) {
    if (kt < num_tiles) {
      int bad_j = -1, bad_block = 0;  // a bad block id met by this thread (recorded once below)
      uint4* k_dst = kv_tiles + stage * 2 * N * kChunks;
      uint4* v_dst = k_dst + N * kChunks;
#pragma unroll
      for (int i0 = 0; i0 < N * kChunks; i0 += kThreads) {
        const int i = i0 + threadIdx.x;
        const int r = i / kChunks, c = i % kChunks;
        const int t = lo + kt * N + r;
        bool ok = t < hi;
        const T* k_src = p.k;
        const T* v_src = p.v;
        if (ok) {
          if constexpr (kPaged) {
            const uint32_t j = p.block_size.div(static_cast<uint32_t>(t));
            const int32_t block = table[j];
            ok = block >= 0 && block < p.num_blocks;
            if (ok) {
              const int64_t offset = (t - static_cast<int64_t>(j) * p.block_size.d) * row_elems +
                                     static_cast<int64_t>(kvh) * D + c * kChunk;
              k_src = p.k + block * p.k_stride + offset;
              v_src = p.v + block * p.v_stride + offset;
            } else if (c == 0) {
              *any_bad = 1;
              bad_j = j;
              bad_block = block;
            }
          } else {
            const int64_t row = req.k_start + t;
            k_src = p.k + row * p.k_stride + static_cast<int64_t>(kvh) * D + c * kChunk;
            v_src = p.v + row * p.v_stride + static_cast<int64_t>(kvh) * D + c * kChunk;
          }
        }
        cp_async_16(k_dst + swizzle<D>(r, c), k_src, ok);
        cp_async_16(v_dst + swizzle<D>(r, c), v_src, ok);
        if (c == 0) key_ok[stage * N + r] = ok;
      }
      if (kPaged && bad_j >= 0 && head % p.group == 0) record(p.error, kBlockTable, b, bad_j, bad_block);
    }
    cp_async_commit();
  };

  // Per lane and row block mb: rows r0 = lane / 4 and r0 + 8: running max m (log2 units), sum l, O.
  float m[kMB][2], l[kMB][2];
  float o[kMB][D / 8][4];
  int pos[kMB][2];  // the rows' positions (query index + shift)
  const int wrow = warp * 16 * kMB;  // the warp's first row in the tile
#pragma unroll
  for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[mb][h] = -INFINITY;
      l[mb][h] = 0.f;
      pos[mb][h] = row0 + wrow + mb * 16 + lane / 4 + 8 * h + shift;
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[mb][n][0] = o[mb][n][1] = o[mb][n][2] = o[mb][n][3] = 0.f;
  }
  // Rows of this warp: the tiles whose keys all pass the rules need no per-key mask.
  const int warp_pos_min = row0 + wrow + shift, warp_pos_max = warp_pos_min + 16 * kMB - 1;
  const int64_t mask_base = use_mask ? ws.mask_offset[b] : 0;

  issue(0, 0);
  issue(1, 1);
  for (int kt = 0; kt < num_tiles; ++kt) {
    const int stage = kt % kStages;
    cp_async_wait<kStages - 1>();  // tile kt (and q) landed for this thread
    __syncthreads();               // ... and for every thread
    const uint4* k_tile = kv_tiles + stage * 2 * N * kChunks;
    const uint4* v_tile = k_tile + N * kChunks;
    const int key0 = lo + kt * N;
    // S [16 kMB rows, N keys] = Q K^T; each K fragment serves the warp's kMB row blocks.
    float s[kMB][N / 8][4];
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
      for (int n = 0; n < N / 8; ++n) s[mb][n][0] = s[mb][n][1] = s[mb][n][2] = s[mb][n][3] = 0.f;
    }
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t a[kMB][4];
#pragma unroll
      for (int mb = 0; mb < kMB; ++mb) ldmatrix_x4(a[mb], q_tile + swizzle<D>(wrow + mb * 16 + lane % 16, 2 * ks + lane / 16));
#pragma unroll
      for (int nt = 0; nt < N / 16; ++nt) {
        uint32_t kb[4];
        const int mat = lane / 8;
        ldmatrix_x4(kb, k_tile + swizzle<D>(nt * 16 + (mat / 2) * 8 + lane % 8, 2 * ks + mat % 2));
#pragma unroll
        for (int mb = 0; mb < kMB; ++mb) {
          mma_16816<T>(s[mb][2 * nt], a[mb], kb[0], kb[1]);
          mma_16816<T>(s[mb][2 * nt + 1], a[mb], kb[2], kb[3]);
        }
      }
    }
    // A tile needs masks only where it crosses the end of the keys, a causal or window edge of the
    // warp's rows, a bad block, or with a custom mask. A row keeps one range of the tile's keys,
    // [window start, min(its position, end of keys)]: first / last are columns relative to the
    // lane's 2 (lane % 4), two compares a logit. A custom mask or a bad block id makes every key a
    // lookup, into keep_bits (bit 2 n + e: column n * 8 + 2 (lane % 4) + e; a short loop, not
    // unrolled: it keeps the hot loop small for the instruction cache).
    const bool bad_block = *any_bad != 0;
    const bool masked = use_mask || key0 + N > hi || bad_block || (upper && key0 + N - 1 > warp_pos_min) ||
                        (p.window > 0 && key0 <= warp_pos_max - p.window);
    const bool per_key = use_mask || bad_block;
    int first[kMB][2], last[kMB][2];
    uint32_t keep_bits[kMB][2];
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int qpos = pos[mb][h], lane_key0 = key0 + (lane % 4) * 2;
        keep_bits[mb][h] = ~0u;
        last[mb][h] = (upper ? min(hi - 1, qpos) : hi - 1) - lane_key0;
        first[mb][h] = p.window > 0 ? qpos - p.window + 1 - lane_key0 : -N;
      }
    }
    if (masked && per_key) {
#pragma unroll
      for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int qpos = pos[mb][h], j = qpos - shift;  // position, and index in the request
          uint32_t bits = 0;
#pragma unroll 1
          for (int i = 0; i < N / 4; ++i) {
            const int col = (i / 2) * 8 + (lane % 4) * 2 + (i & 1);
            const int t = key0 + col;
            bool keep = t < hi && key_ok[stage * N + col];
            if (upper) keep = keep && t <= qpos;
            if (p.window > 0) keep = keep && t > qpos - p.window;
            if (use_mask && keep && j < req.len_q) {
              // Entries past the mask read as 0 (PlanKernel recorded the size mismatch).
              const int64_t at = mask_base + static_cast<int64_t>(j) * req.len_k + t;
              keep = at < p.mask_size && p.mask[at] != 0;
            }
            bits |= static_cast<uint32_t>(keep) << i;
          }
          keep_bits[mb][h] = bits;
        }
      }
    }
    // Logits in log2 units: x = s * scale, or with a soft cap tanh(s * scale) * cap (a pass of
    // its own, so that the tanh code stays out of the hot loop); masked keys -inf. x is rounded
    // before the max is taken, so that x - m <= 0 exactly (an FFMA of s * scale - m carries the
    // product's rounding error, which overflows exp2 at huge logits). The Hopper kernel's FFMA
    // form is not used here: head_dim 128 already spills (ptxas, sm_80: 144 bytes) and it added
    // 12 more; it has not been measured on sm_80 / sm_89.
    float sc = p.q_scale;
    if (p.soft_cap) {
#pragma unroll
      for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
#pragma unroll
          for (int c = 0; c < 4; ++c) s[mb][n][c] = tanhf(s[mb][n][c] * p.q_scale) * p.logit_scale;
        }
      }
      sc = 1.f;
    }
    if (masked) {  // after the cap: tanh(-inf) would be -1
#pragma unroll
      for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int h = c / 2, col = 8 * n + (c & 1);
            const bool keep = per_key ? (keep_bits[mb][h] >> (2 * n + (c & 1))) & 1u
                                      : col >= first[mb][h] && col <= last[mb][h];
            if (!keep) s[mb][n][c] = -INFINITY;
          }
        }
      }
    }
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
      float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < N / 8; ++n) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int h = c / 2;
          const float x = s[mb][n][c] * sc;
          s[mb][n][c] = x;
          row_max[h] = fmaxf(row_max[h], x);
        }
      }
      float rescale[2], m_use[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(device::kFullMask, row_max[h], 1));
        row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(device::kFullMask, row_max[h], 2));
        const float m_new = fmaxf(m[mb][h], row_max[h]);
        m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // no key yet: everything stays 0
        rescale[h] = device::exp2_approx(m[mb][h] - m_use[h]);
        m[mb][h] = m_new;
        l[mb][h] *= rescale[h];
      }
#pragma unroll
      for (int n = 0; n < N / 8; ++n) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[mb][n][c] = device::exp2_approx(s[mb][n][c] - m_use[c / 2]);
          l[mb][c / 2] += s[mb][n][c];
        }
      }
      // Once the rows' maxima settle, most tiles leave them unchanged: skip the O rescale then.
      if (__any_sync(device::kFullMask, rescale[0] != 1.f || rescale[1] != 1.f)) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          o[mb][n][0] *= rescale[0];
          o[mb][n][1] *= rescale[0];
          o[mb][n][2] *= rescale[1];
          o[mb][n][3] *= rescale[1];
        }
      }
    }
    // O [16 kMB rows, D] += P V, 16 keys per product: P's accumulator layout is the A operand's.
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
      uint32_t pa[kMB][4];
#pragma unroll
      for (int mb = 0; mb < kMB; ++mb) {
        pa[mb][0] = pack2<T>(s[mb][2 * kk][0], s[mb][2 * kk][1]);
        pa[mb][1] = pack2<T>(s[mb][2 * kk][2], s[mb][2 * kk][3]);
        pa[mb][2] = pack2<T>(s[mb][2 * kk + 1][0], s[mb][2 * kk + 1][1]);
        pa[mb][3] = pack2<T>(s[mb][2 * kk + 1][2], s[mb][2 * kk + 1][3]);
      }
#pragma unroll
      for (int n = 0; n < D / 8; n += 2) {
        uint32_t vb[4];
        const int mat = lane / 8;
        ldmatrix_x4_trans(vb, v_tile + swizzle<D>(kk * 16 + (mat % 2) * 8 + lane % 8, n + mat / 2));
#pragma unroll
        for (int mb = 0; mb < kMB; ++mb) {
          mma_16816<T>(o[mb][n], pa[mb], vb[0], vb[1]);
          mma_16816<T>(o[mb][n + 1], pa[mb], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
    issue(kt + kStages, stage);
  }
  cp_async_wait<0>();
  device::pdl_launch_dependents();

  // Epilogue: the rows' sums over the 4 lanes of a row, then out = O / l and lse.
#pragma unroll
  for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[mb][h];
      sum += __shfl_xor_sync(device::kFullMask, sum, 1);
      sum += __shfl_xor_sync(device::kFullMask, sum, 2);
      const int r = wrow + mb * 16 + lane / 4 + 8 * h;  // row within the tile
      if (r >= rows) continue;
      const int64_t token = req.q_start + row0 + r;
      // No key: 0 and -inf. A NaN (from q or an attended key) stays NaN through the sums.
      const float inv = sum == 0.f ? 0.f : 1.f / sum;
      T* dst = p.out + (token * p.num_heads + head) * D + (lane % 4) * 2;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        *reinterpret_cast<uint32_t*>(dst + n * 8) = pack2<T>(o[mb][n][2 * h] * inv, o[mb][n][2 * h + 1] * inv);
      }
      if (lane % 4 == 0) {
        p.lse[token * p.num_heads + head] = sum == 0.f ? -INFINITY : (m[mb][h] + log2f(sum)) * kLn2;
      }
    }
  }
}

}  // namespace prefill_attention_detail
}  // namespace mllm_kernel::gpu

#include "prefill_attention_sm90.cuh"

namespace mllm_kernel::gpu {
namespace prefill_attention_detail {

// ---------------------------------------------------------------------------- launch

/*! \brief MLLM_KERNEL_PREFILL_BACKEND: auto (default), fa2 (the mma.sync kernel) or sm90 (the Hopper one, required). */
inline std::string_view PrefillBackend() {
  const char* backend = std::getenv("MLLM_KERNEL_PREFILL_BACKEND");
  const std::string_view choice = backend == nullptr ? "auto" : backend;
  host::ValueCheck(choice == "auto" || choice == "fa2" || choice == "sm90",
                   "MLLM_KERNEL_PREFILL_BACKEND must be auto, fa2 or sm90, got '", choice, "'");
  return choice;
}

/*!
 * \brief Whether the Hopper kernel for these template arguments can run on \p device: an sm_90
 * GPU, and a binary with the kernel's sm_90a body (only that body has static shared memory: its
 * mbarriers). Queried once per device; with backend "sm90" its absence is an error.
 */
template <typename T, int D, bool kPaged>
bool HasSm90(int device, std::string_view backend) {
  constexpr int kMaxCachedDevices = 64;
  static std::atomic<int> cache[kMaxCachedDevices] = {};  // 0: not queried, 1: yes, 2: no
  int known = device >= 0 && device < kMaxCachedDevices ? cache[device].load(std::memory_order_relaxed) : 0;
  if (known == 0) {
    bool usable = host::GetComputeCapability(device) == 90;
    if (usable) {
      tvm::ffi::CUDADeviceGuard guard(device);
      cudaFuncAttributes attributes{};
      usable = cudaFuncGetAttributes(&attributes, prefill_attention_sm90::PrefillKernelSm90<T, D, kPaged>) ==
                   cudaSuccess &&
               attributes.sharedSizeBytes > 0;
      cudaGetLastError();  // a refusal only means "no"
    }
    known = usable ? 1 : 2;
    if (device >= 0 && device < kMaxCachedDevices) cache[device].store(known, std::memory_order_relaxed);
  }
  host::ValueCheck(known == 1 || backend != "sm90", "MLLM_KERNEL_PREFILL_BACKEND=sm90: cuda:", device,
                   " has no sm_90a prefill kernel for head_dim ", D, " (needs an H100/H200 and a build for sm_90a)");
  return known == 1;
}

/*! \brief The Hopper kernel with \p kConsumers consumer warpgroups (work items of 64 rows per consumer). */
template <typename T, int D, bool kPaged, int kConsumers>
void LaunchSm90(PrefillParams<T> p, DLDevice device) {
  namespace h = prefill_attention_sm90;
  using Tile = h::Shape<D, kPaged, kConsumers>;
  p.block_m = Tile::kBlockM;
  const h::TmaMaps maps = h::MakeTmaMaps<T, D, kPaged, kConsumers>(p);
  host::LaunchKernel(1, kPlanThreads, device).enable_pdl(true)(PlanKernel<T>, p);
  const int64_t units = int64_t{p.max_work} * p.num_heads;  // an upper bound: the plan counts them
  const int grid = static_cast<int>(std::min<int64_t>(units, host::MultiProcessorCount(device.device_id)));
  host::LaunchKernel(grid, Tile::kThreads, device, h::kSmemBytes<Tile, D>)
      .enable_pdl(true)(h::PrefillKernelSm90<T, D, kPaged, kConsumers>, p, maps);
}

template <typename T, int D, bool kPaged>
void LaunchPrefill(PrefillParams<T> p, DLDevice device) {
  const std::string_view backend = PrefillBackend();
  if (backend != "fa2" && HasSm90<T, D, kPaged>(device.device_id, backend)) {
    // Ragged head_dim 64: three consumers (192-row items) once requests average kWideRows
    // queries. Measured (H200, RESULTS.md): 7-10% faster at 2 x 16384 and 8 x 4096 full, equal at
    // 8 x 4096 causal, 10% slower at 16 x 1024 causal (a request's last 192-row item is a third
    // full). From shapes only, so a captured graph keeps its choice.
    if constexpr (D == 64 && !kPaged) {
      if (p.total_q >= int64_t{kWideRows} * p.batch) return LaunchSm90<T, D, kPaged, 3>(p, device);
    }
    return LaunchSm90<T, D, kPaged, 2>(p, device);
  }
  p.block_m = kBlockM;
  const int64_t limit = host::MaxSharedMemoryPerBlock(device.device_id);
  host::ValueCheck(kSmemBytes<D> <= limit, kPaged ? "paged_prefill_attention" : "prefill_attention", ": head_dim ", D,
                   " needs ", kSmemBytes<D>, " bytes of shared memory per block; cuda:", device.device_id, " offers ",
                   limit);
  auto kernel = PrefillKernel<T, D, kPaged>;
  host::PreferMaxSharedMemoryCarveout(kernel, device.device_id);
  host::LaunchKernel(1, kPlanThreads, device).enable_pdl(true)(PlanKernel<T>, p);
  host::LaunchKernel(dim3(p.max_work, p.num_heads), kWarpsOf<D> * 32, device, kSmemBytes<D>).enable_pdl(true)(kernel, p);
}

template <typename T>
void Prefill(const prefill_attention::PrefillArgs& a, PrefillParams<T>& p) {
  const char* op = a.paged ? "paged_prefill_attention" : "prefill_attention";
  host::ValueCheck(a.num_heads < 65536, op, ": num_heads must be < 65536 on CUDA, got ", a.num_heads);
  // The Hopper kernel numbers (query tile, head) units in an int, with a grid's worth to spare.
  host::ValueCheck(MaxWork(a.total_q, a.batch) * a.num_heads < (int64_t{1} << 30), op,
                   ": the batch has too many query tiles x heads");
  const auto aligned = [](const void* ptr, int64_t stride) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && stride * 2 % 16 == 0;
  };
  host::ValueCheck(aligned(p.q, a.q_stride), op, ": q must be 16-byte aligned (data pointer and token stride ",
                   a.q_stride, ") on CUDA");
  host::ValueCheck(aligned(p.k, a.k_stride), op, a.paged ? ": k_cache" : ": k",
                   " must be 16-byte aligned (data pointer and stride ", a.k_stride, ") on CUDA");
  host::ValueCheck(aligned(p.v, a.v_stride), op, a.paged ? ": v_cache" : ": v",
                   " must be 16-byte aligned (data pointer and stride ", a.v_stride, ") on CUDA");
  // The Hopper kernel stores out 16 bytes at a time (rows are D * 2 bytes apart, a multiple of 16).
  host::ValueCheck(reinterpret_cast<uintptr_t>(p.out) % 16 == 0, op, ": out must be 16-byte aligned on CUDA (its data ",
                   "pointer is ", reinterpret_cast<uintptr_t>(p.out) % 16, " bytes past a 16-byte boundary)");
  p.q_stride = a.q_stride;
  p.k_stride = a.k_stride;
  p.v_stride = a.v_stride;
  p.table_stride = a.table_stride;
  p.mask_size = a.mask_size;
  p.batch = static_cast<int>(a.batch);
  p.total_q = static_cast<int>(a.total_q);
  p.total_k = static_cast<int>(a.total_k);
  p.num_heads = static_cast<int>(a.num_heads);
  p.num_kv_heads = static_cast<int>(a.num_kv_heads);
  p.group = static_cast<int>(a.group());
  p.num_blocks = static_cast<int>(a.num_blocks);
  p.max_blocks = static_cast<int>(a.max_blocks);
  p.max_work = static_cast<int>(MaxWork(a.total_q, a.batch));
  p.max_keys = a.max_blocks * a.block_size;
  p.window = a.window > 0 ? static_cast<int>(std::min<int64_t>(a.window, int64_t{1} << 30)) : 0;
  p.block_size = FastDivmod(static_cast<uint32_t>(a.paged ? a.block_size : 1));
  p.soft_cap = a.soft_cap > 0.f;
  p.q_scale = p.soft_cap ? a.scale / a.soft_cap : a.scale * kLog2e;
  p.logit_scale = p.soft_cap ? a.soft_cap * kLog2e : 1.f;
  p.causal = a.causal;
  p.paged = a.paged;
  const auto run = [&]<bool kPaged>() {
    switch (a.head_dim) {
      case 64: LaunchPrefill<T, 64, kPaged>(p, a.device); break;
      case 128: LaunchPrefill<T, 128, kPaged>(p, a.device); break;
      default: LaunchPrefill<T, 256, kPaged>(p, a.device); break;  // the contract allows no other
    }
  };
  if (a.paged) {
    run.template operator()<true>();
  } else {
    run.template operator()<false>();
  }
}

template <typename T>
PrefillParams<T> CommonParams(tvm::ffi::TensorView out, tvm::ffi::TensorView lse, tvm::ffi::TensorView q,
                              tvm::ffi::TensorView cu_seqlens_q, tvm::ffi::TensorView workspace,
                              tvm::ffi::TensorView error) {
  using host::data_ptr;
  PrefillParams<T> p{};
  p.out = data_ptr<T>(out);
  p.lse = data_ptr<float>(lse);
  p.q = data_ptr<const T>(q);
  p.cu_q = data_ptr<const int32_t>(cu_seqlens_q);
  p.workspace = data_ptr<int32_t>(workspace);
  p.error = data_ptr<int64_t>(error);
  return p;
}

// The workspace the wrapper allocates: int32 [WorkspaceInts(total_q, batch)], 8-byte aligned.
inline void CheckWorkspace(const char* op, const prefill_attention::PrefillArgs& a, tvm::ffi::TensorView workspace) {
  host::SymbolicSize size{"workspace_size"};
  host::SymbolicDevice device{"device"};
  device.set_value(a.device);
  host::TensorMatcher({size}).for_op(op).with_dtype<int32_t>().with_device(device).verify(workspace, "workspace");
  host::ValueCheck(workspace.numel() >= WorkspaceInts(a.total_q, a.batch) &&
                       reinterpret_cast<uintptr_t>(workspace.data_ptr()) % 8 == 0,
                   op, ": workspace must be 8-byte aligned int32 of at least ", WorkspaceInts(a.total_q, a.batch),
                   " elements, got ", workspace.numel());
}

}  // namespace prefill_attention_detail

/*! \brief out, lse = attention of a ragged batch over ragged K/V (prefill_attention.hpp). */
inline void prefill_attention(tvm::ffi::TensorView out, tvm::ffi::TensorView lse, tvm::ffi::TensorView q,
                              tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView cu_seqlens_q,
                              tvm::ffi::TensorView cu_seqlens_k, tvm::ffi::TensorView workspace, double scale,
                              bool causal, int64_t sliding_window, double soft_cap, int64_t num_threads,
                              tvm::ffi::TensorView error) {
  namespace d = prefill_attention_detail;
  prefill_attention::VerifyNumThreads("prefill_attention", num_threads);
  const auto a = prefill_attention::VerifyPrefill<kDLCUDA>(out, lse, q, k, v, cu_seqlens_q, cu_seqlens_k, scale,
                                                           causal, sliding_window, soft_cap, error);
  d::CheckWorkspace("prefill_attention", a, workspace);
  if (a.empty()) return;  // a zero-block grid is a launch error
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    if constexpr (!std::is_same_v<T, float>) {
      auto p = d::CommonParams<T>(out, lse, q, cu_seqlens_q, workspace, error);
      p.k = host::data_ptr<const T>(k);
      p.v = host::data_ptr<const T>(v);
      p.cu_k = host::data_ptr<const int32_t>(cu_seqlens_k);
      d::Prefill<T>(a, p);
    }
  });
}

/*! \brief out, lse = attention of a ragged batch over the paged cache (prefill_attention.hpp). */
inline void paged_prefill_attention(tvm::ffi::TensorView out, tvm::ffi::TensorView lse, tvm::ffi::TensorView q,
                                    tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
                                    tvm::ffi::TensorView block_table, tvm::ffi::TensorView cu_seqlens_q,
                                    tvm::ffi::TensorView seq_lens, tvm::ffi::TensorView custom_mask,
                                    tvm::ffi::TensorView workspace, double scale, bool causal,
                                    int64_t sliding_window, double soft_cap, int64_t num_threads,
                                    tvm::ffi::TensorView error) {
  namespace d = prefill_attention_detail;
  prefill_attention::VerifyNumThreads("paged_prefill_attention", num_threads);
  const auto a = prefill_attention::VerifyPagedPrefill<kDLCUDA>(out, lse, q, k_cache, v_cache, block_table,
                                                                cu_seqlens_q, seq_lens, custom_mask, scale, causal,
                                                                sliding_window, soft_cap, error);
  d::CheckWorkspace("paged_prefill_attention", a, workspace);
  if (a.empty()) return;
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    if constexpr (!std::is_same_v<T, float>) {
      auto p = d::CommonParams<T>(out, lse, q, cu_seqlens_q, workspace, error);
      p.k = host::data_ptr<const T>(k_cache);
      p.v = host::data_ptr<const T>(v_cache);
      p.block_table = host::data_ptr<const int32_t>(block_table);
      p.seq_lens = host::data_ptr<const int32_t>(seq_lens);
      p.mask = a.mask_size > 0 ? host::data_ptr<const uint8_t>(custom_mask) : nullptr;
      d::Prefill<T>(a, p);
    }
  });
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_PREFILL_ATTENTION_CUH_
