/*!
 * \file kernels/decode_attention/decode_attention.cuh
 * \brief CUDA decode attention over the paged KV cache (split-KV with an LSE merge) and
 * merge_attention_states, on torch's current stream (arguments: decode_attention.hpp).
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * mllm_kernel::gpu::decode_attention and mllm_kernel::gpu::merge_attention_states.
 *
 * One CTA serves one (request, KV head, split) and up to kHeads query heads of that KV group,
 * so the group's heads share one pass over the pages. Its 128 threads form lane groups of
 * D / 8 lanes; each lane holds 8 dims (one 16-byte vector) of a key row, a lane group one
 * token. Key and value rows stream through shared memory with cp.async, kRound tokens per lane
 * group a round and kBuffers - 1 rounds in flight while one is consumed; every lane reads back only
 * the bytes it copied itself, so the pipeline needs no barrier. Each lane group keeps its own
 * online-softmax state (in log2 units), merged across the CTA at the end. With num_splits > 1
 * the CTA writes a float32 partial state and MergeSplitsKernel combines them.
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
#include <cmath>
#include <cstdint>

namespace mllm_kernel::gpu {

namespace decode_attention_detail {

using device::bf16_t;
using device::fp16_t;

constexpr int kThreads = 128;
// CTAs per SM that __launch_bounds__ guarantees (Python's plan_num_splits counts with them):
// 8 heads hold 64 floats of q and 64 of accumulators a thread and need 2 CTAs' registers.
template <int kHeads>
constexpr int kMinBlocksPerSm = kHeads >= 8 ? 2 : 4;
constexpr int kVec = 8;             // 16-bit elements per 16-byte vector
// Pipeline shape, measured on an H100 (benchmarks/RESULTS.md): 2 tokens a round and 4 rounds
// of buffers beat 4 x 3 at short contexts and tie at long ones; 8 x 2 and 4 x 4 were slower.
constexpr int kRound = 2;    // tokens per lane group per pipeline round
constexpr int kBuffers = 4;  // rounds held in shared memory (3 in flight while one is consumed)
constexpr int kStageBytes = kBuffers * kRound * kThreads * 2 * 16;  // K and V rounds
// Shared memory of a CTA: the pipeline's rounds, then (reused) the lane groups' partial sums,
// maxima and sums of the epilogue.
template <int D, int kHeads>
constexpr int kSmemBytes = std::max(kStageBytes, kHeads * (kThreads * kVec + 2 * kThreads / (D / kVec)) * 4);
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---------------------------------------------------------------------------- helpers

/*! \brief n / d and n % d for a divisor fixed per launch (multiply-high; n, d < 2^31). */
struct FastDivmod {
  uint32_t d = 1, mul = 0, shift = 0;
  FastDivmod() = default;
  explicit FastDivmod(uint32_t divisor) : d(divisor) {
    while ((uint64_t{1} << shift) < d) ++shift;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const { return (__umulhi(n, mul) + n) >> shift; }
};

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool fill) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = fill ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  // No "memory" clobber: that would keep the compiler from hoisting the next block-table loads
  // above the copy. cp_async_wait orders shared-memory reads against these writes.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/*! \brief 8 16-bit values of a 16-byte vector as floats. */
template <typename T>
__device__ __forceinline__ void to_floats(const uint4& raw, float (&f)[kVec]) {
  const auto* pairs = reinterpret_cast<const typename std::conditional_t<
      std::is_same_v<T, fp16_t>, __half2, __nv_bfloat162>*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    float2 v;
    if constexpr (std::is_same_v<T, fp16_t>) {
      v = __half22float2(pairs[i]);
    } else {
      v = __bfloat1622float2(pairs[i]);
    }
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

/*! \brief Weights of two softmax states with maxima m_a, m_b (log2 units): e^(m - max). An
 * empty state (-inf) weighs 0; two empty states give 0 and 0 (never NaN). */
__device__ __forceinline__ float2 state_weights(float m_a, float m_b) {
  const float m = fmaxf(m_a, m_b);
  if (m == -INFINITY) return make_float2(0.f, 0.f);
  return make_float2(exp2f(m_a - m), exp2f(m_b - m));
}

template <typename T>
struct DecodeParams {
  T* out;
  float* lse;
  const T* q;
  const T* k_cache;
  const T* v_cache;
  const int32_t* block_table;
  const int32_t* seq_lens;
  float* partial_out;
  float* partial_lse;
  int64_t* error;
  int64_t q_stride, k_block_stride, v_block_stride, table_stride;
  int num_heads, num_kv_heads, group, head_chunks, num_blocks, max_blocks, window, num_splits;
  int64_t max_keys;  // max_blocks * block_size
  FastDivmod block_size;
  float q_scale;      // folded into q: scale * log2(e), or scale / cap with a soft cap
  float logit_scale;  // 1, or cap * log2(e) after tanh with a soft cap
  bool soft_cap;
};

// ---------------------------------------------------------------------------- decode

template <typename T, int D, int kHeads>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm<kHeads>) DecodeKernel(const DecodeParams<T> p) {
  constexpr int kLanes = D / kVec;              // lanes per token row
  constexpr int kGroups = kThreads / kLanes;    // tokens in parallel
  constexpr int kPerRound = kGroups * kRound;   // tokens per CTA round
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* k_stage = reinterpret_cast<uint4*>(smem);  // [kBuffers][kRound][kThreads]
  uint4* v_stage = k_stage + kBuffers * kRound * kThreads;

  const int tid = threadIdx.x;
  const int lane = tid % kLanes;
  const int grp = tid / kLanes;
  const int split = blockIdx.x;
  const int kvh = blockIdx.y / p.head_chunks;
  const int head0 = kvh * p.group + (blockIdx.y % p.head_chunks) * kHeads;
  const int heads = min(kHeads, kvh * p.group + p.group - head0);
  const int b = blockIdx.z;

  device::pdl_wait_primary();  // q, the cache and seq_lens may come from the previous kernel

  // Keys [first, last) of this split.
  int64_t len = p.seq_lens[b];
  if (len < 0 || len > p.max_keys) {
    if (tid == 0 && split == 0 && blockIdx.y == 0) device::record_error(p.error, -(b + 1), len);
    len = len < 0 ? 0 : p.max_keys;
  }
  const int64_t begin = p.window > 0 && len > p.window ? len - p.window : 0;
  const int64_t chunk = (len - begin + p.num_splits - 1) / p.num_splits;
  const int64_t first = begin + split * chunk;
  const int64_t last = min(len, first + chunk);
  const int rounds = last > first ? static_cast<int>((last - first + kPerRound - 1) / kPerRound) : 0;

  // q of each head, pre-scaled, 8 dims per lane. Heads past `heads` compute on zeros.
  float q[kHeads][kVec];
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    if (g < heads) {
      uint4 raw = reinterpret_cast<const uint4*>(p.q + b * p.q_stride + static_cast<int64_t>(head0 + g) * D)[lane];
      to_floats<T>(raw, q[g]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) q[g][i] *= p.q_scale;
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) q[g][i] = 0.f;
    }
  }

  const int32_t* table = p.block_table + b * p.table_stride;
  const int64_t row = static_cast<int64_t>(p.num_kv_heads) * D;  // elements per token in a block
  const T* k_head = p.k_cache + static_cast<int64_t>(kvh) * D + lane * kVec;
  const T* v_head = p.v_cache + static_cast<int64_t>(kvh) * D + lane * kVec;
  uint32_t valid_bits = 0;  // bit buf * kRound + i: token i of the round in buffer buf is a key

  // Block ids are loaded one round before their copies are issued, so the copies never wait
  // on a block-table load. -1: no key (past `last`).
  int32_t blocks[kRound];
  auto load_blocks = [&](int r) {
#pragma unroll
    for (int i = 0; i < kRound; ++i) {
      const int64_t t = first + static_cast<int64_t>(r) * kPerRound + i * kGroups + grp;
      blocks[i] = r < rounds && t < last ? table[p.block_size.div(static_cast<uint32_t>(t))] : -1;
    }
  };

  // Copies round r's tokens (block ids in `blocks`) into buffer `buf`, then loads round r + 1's
  // block ids. Tokens past `last` and bad blocks zero-fill and are masked.
  auto issue = [&](int r, int buf) {
#pragma unroll
    for (int i = 0; i < kRound; ++i) {
      const int64_t t = first + static_cast<int64_t>(r) * kPerRound + i * kGroups + grp;
      const int32_t block = blocks[i];
      bool valid = block >= 0 && block < p.num_blocks;
      const T* k_src = p.k_cache;
      const T* v_src = p.v_cache;
      const uint32_t j = p.block_size.div(static_cast<uint32_t>(t));
      if (valid) {
        const int64_t offset = (t - static_cast<int64_t>(j) * p.block_size.d) * row;
        k_src = k_head + block * p.k_block_stride + offset;
        v_src = v_head + block * p.v_block_stride + offset;
      } else if (block != -1 || (r < rounds && t < last)) {
        if (lane == 0) device::record_error(p.error, (static_cast<int64_t>(b) << 32) | j, block);
      }
      const int slot = (buf * kRound + i) * kThreads + tid;
      cp_async_16(k_stage + slot, k_src, valid);
      cp_async_16(v_stage + slot, v_src, valid);
      const uint32_t bit = 1u << (buf * kRound + i);
      valid_bits = valid ? (valid_bits | bit) : (valid_bits & ~bit);
    }
    cp_async_commit();  // one group per round, empty or not, so wait counts stay uniform
    load_blocks(r + 1);
  };

  float m[kHeads], l[kHeads], acc[kHeads][kVec];
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[g][i] = 0.f;
  }

  // Consumes the round in buffer `buf`: logits of its kRound tokens for every head, then one
  // rescale of the running state per head.
  auto consume = [&](int buf) {
    float s[kRound][kHeads];
#pragma unroll
    for (int i = 0; i < kRound; ++i) {
      float k[kVec];
      to_floats<T>(k_stage[(buf * kRound + i) * kThreads + tid], k);
#pragma unroll
      for (int g = 0; g < kHeads; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < kVec; ++e) dot = fmaf(q[g][e], k[e], dot);
#pragma unroll
        for (int offset = kLanes / 2; offset > 0; offset >>= 1) dot += __shfl_xor_sync(device::kFullMask, dot, offset);
        if (p.soft_cap) dot = tanhf(dot);
        s[i][g] = (valid_bits >> (buf * kRound + i)) & 1u ? dot * p.logit_scale : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int i = 0; i < kRound; ++i) m_new = fmaxf(m_new, s[i][g]);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no key yet: keep everything 0
      const float rescale = exp2f(m[g] - m_use);
      m[g] = m_new;
      l[g] *= rescale;
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[g][e] *= rescale;
#pragma unroll
      for (int i = 0; i < kRound; ++i) s[i][g] = exp2f(s[i][g] - m_use);
    }
#pragma unroll
    for (int i = 0; i < kRound; ++i) {
      float v[kVec];
      to_floats<T>(v_stage[(buf * kRound + i) * kThreads + tid], v);
#pragma unroll
      for (int g = 0; g < kHeads; ++g) {
        l[g] += s[i][g];
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[g][e] = fmaf(s[i][g], v[e], acc[g][e]);
      }
    }
  };

  // Pipeline: rounds r + 1 .. r + kBuffers - 1 are in flight while round r is consumed. The loop body is
  // unrolled over the buffers so that every buffer index is a compile-time constant.
  load_blocks(0);
#pragma unroll
  for (int r = 0; r < kBuffers - 1; ++r) issue(r, r);
  for (int r0 = 0; r0 < rounds; r0 += kBuffers) {
#pragma unroll
    for (int j = 0; j < kBuffers; ++j) {
      if (r0 + j < rounds) {  // uniform over the CTA
        cp_async_wait<kBuffers - 2>();  // round r0 + j has landed (this lane's own copies)
        issue(r0 + j + kBuffers - 1, (j + kBuffers - 1) % kBuffers);
        consume(j);
      }
    }
  }
  cp_async_wait<0>();
  device::pdl_launch_dependents();

  // Merge the lane groups' states. Shared memory is reused: [kHeads][kGroups][D] partial sums,
  // then the groups' maxima and sums.
  __syncthreads();
  float* sums = reinterpret_cast<float*>(smem);
  float* group_m = sums + kHeads * kGroups * D;
  float* group_l = group_m + kHeads * kGroups;
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < kHeads; ++g) {
      group_m[g * kGroups + grp] = m[g];
      group_l[g * kGroups + grp] = l[g];
    }
  }
  __syncthreads();
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    float m_all = -INFINITY;
#pragma unroll
    for (int x = 0; x < kGroups; ++x) m_all = fmaxf(m_all, group_m[g * kGroups + x]);
    const float w = state_weights(m[g], m_all).x;
    float4* dst = reinterpret_cast<float4*>(sums + (g * kGroups + grp) * D + lane * kVec);
    dst[0] = make_float4(acc[g][0] * w, acc[g][1] * w, acc[g][2] * w, acc[g][3] * w);
    dst[1] = make_float4(acc[g][4] * w, acc[g][5] * w, acc[g][6] * w, acc[g][7] * w);
  }
  __syncthreads();
  // Each thread finishes elements (g, d) of the output.
  for (int idx = tid; idx < kHeads * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    if (g >= heads) break;  // idx grows with g
    float m_all = -INFINITY, l_all = 0.f, o = 0.f;
#pragma unroll
    for (int x = 0; x < kGroups; ++x) m_all = fmaxf(m_all, group_m[g * kGroups + x]);
#pragma unroll
    for (int x = 0; x < kGroups; ++x) {
      l_all += group_l[g * kGroups + x] * state_weights(group_m[g * kGroups + x], m_all).x;
      o += sums[(g * kGroups + x) * D + d];
    }
    const float value = l_all > 0.f ? o / l_all : 0.f;
    const float lse = l_all > 0.f ? (m_all + log2f(l_all)) * kLn2 : -INFINITY;
    const int64_t h = static_cast<int64_t>(b) * p.num_heads + head0 + g;
    if (p.num_splits == 1) {
      p.out[h * D + d] = device::from_float<T>(value);
      if (d == 0) p.lse[h] = lse;
    } else {
      p.partial_out[(h * p.num_splits + split) * D + d] = value;
      if (d == 0) p.partial_lse[h * p.num_splits + split] = lse;
    }
  }
}

// ---------------------------------------------------------------------------- merges

/*! \brief One CTA of kMergeThreads per (request, head): out = sum_s w_s o_s over the splits'
 * partial states, w_s = e^(lse_s - lse) (natural log). Threads hold 4 dims of one split group
 * each, so the partial rows' loads are independent and all in flight at once. */
constexpr int kMergeThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kMergeThreads) MergeSplitsKernel(T* out, float* lse, const float* partial_out,
                                                                   const float* partial_lse, int num_splits,
                                                                   int head_dim) {
  __shared__ float weights[decode_attention::kMaxSplits];
  __shared__ float4 sums[kMergeThreads];
  device::pdl_wait_primary();
  const int64_t row = blockIdx.x;
  const float* lses = partial_lse + row * num_splits;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < num_splits; s += kMergeThreads) m = fmaxf(m, lses[s]);
  m = device::block_reduce_max(m);
  float total = 0.f;
  for (int s = threadIdx.x; s < num_splits; s += kMergeThreads) {
    const float w = m == -INFINITY ? 0.f : expf(lses[s] - m);
    weights[s] = w;
    total += w;
  }
  total = device::block_reduce_sum(total);  // its barriers also publish `weights`
  const int quads = head_dim / 4;           // 16, 32 or 64 threads cover one partial row
  const int groups = kMergeThreads / quads;
  const int quad = threadIdx.x % quads, group = threadIdx.x / quads;
  const float4* rows = reinterpret_cast<const float4*>(partial_out + row * num_splits * head_dim);
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = group; s < num_splits; s += groups) {
    const float4 x = rows[s * quads + quad];
    const float w = weights[s];
    o = make_float4(fmaf(w, x.x, o.x), fmaf(w, x.y, o.y), fmaf(w, x.z, o.z), fmaf(w, x.w, o.w));
  }
  sums[threadIdx.x] = o;
  __syncthreads();
  if (group == 0) {
    for (int g = 1; g < groups; ++g) {
      const float4 x = sums[g * quads + quad];
      o = make_float4(o.x + x.x, o.y + x.y, o.z + x.z, o.w + x.w);
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    T* dst = out + row * head_dim + quad * 4;
    dst[0] = device::from_float<T>(o.x * inv);
    dst[1] = device::from_float<T>(o.y * inv);
    dst[2] = device::from_float<T>(o.z * inv);
    dst[3] = device::from_float<T>(o.w * inv);
    if (quad == 0) lse[row] = total > 0.f ? m + logf(total) : -INFINITY;
  }
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

// ---------------------------------------------------------------------------- launch

template <typename T, int D, int kHeads>
void LaunchDecode(const DecodeParams<T>& p, DLDevice device, int batch) {
  auto kernel = DecodeKernel<T, D, kHeads>;
  // Four CTAs per SM need a large shared-memory carveout; a hint, set once.
  static const bool carveout_set = [&] {
    cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    cudaGetLastError();
    return true;
  }();
  (void)carveout_set;
  const dim3 grid(p.num_splits, p.num_kv_heads * p.head_chunks, batch);
  host::LaunchKernel(grid, kThreads, device, kSmemBytes<D, kHeads>).enable_pdl(true)(kernel, p);
}

template <typename T, int D>
void DispatchHeads(DecodeParams<T>& p, DLDevice device, int batch) {
  // The smallest head tier that holds the group; larger groups take several CTAs of 8 heads.
  if (p.group <= 1) {
    p.head_chunks = 1;
    LaunchDecode<T, D, 1>(p, device, batch);
  } else if (p.group <= 2) {
    p.head_chunks = 1;
    LaunchDecode<T, D, 2>(p, device, batch);
  } else if (p.group <= 4) {
    p.head_chunks = 1;
    LaunchDecode<T, D, 4>(p, device, batch);
  } else {
    p.head_chunks = (p.group + 7) / 8;
    LaunchDecode<T, D, 8>(p, device, batch);
  }
}

template <typename T>
void Decode(const decode_attention::DecodeArgs& a, tvm::ffi::TensorView out, tvm::ffi::TensorView lse,
            tvm::ffi::TensorView q, tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
            tvm::ffi::TensorView block_table, tvm::ffi::TensorView seq_lens, tvm::ffi::TensorView partial_out,
            tvm::ffi::TensorView partial_lse, tvm::ffi::TensorView error) {
  using host::data_ptr;
  const int64_t max_keys = a.max_blocks * a.block_size;
  host::ValueCheck(a.batch < 65536 && a.num_kv_heads * ((a.group() + 7) / 8) < 65536 && max_keys < (int64_t{1} << 31),
                   "decode_attention: batch must be < 65536 and max_blocks_per_seq * block_size < 2^31 on CUDA, got batch ",
                   a.batch, " and ", max_keys);
  // 16-byte vector loads and cp.async need 16-byte aligned rows.
  const auto aligned = [](const void* ptr, int64_t stride) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && stride % device::kVecSize<T> == 0;
  };
  host::ValueCheck(aligned(data_ptr<const T>(q), a.q_stride), "decode_attention: q must be 16-byte aligned ",
                   "(data pointer and batch stride ", a.q_stride, ") on CUDA");
  host::ValueCheck(aligned(data_ptr<const T>(k_cache), a.k_block_stride),
                   "decode_attention: k_cache must be 16-byte aligned (data pointer and block stride ",
                   a.k_block_stride, ") on CUDA");
  host::ValueCheck(aligned(data_ptr<const T>(v_cache), a.v_block_stride),
                   "decode_attention: v_cache must be 16-byte aligned (data pointer and block stride ",
                   a.v_block_stride, ") on CUDA");
  DecodeParams<T> p{};
  p.out = data_ptr<T>(out);
  p.lse = data_ptr<float>(lse);
  p.q = data_ptr<const T>(q);
  p.k_cache = data_ptr<const T>(k_cache);
  p.v_cache = data_ptr<const T>(v_cache);
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
  const int batch = static_cast<int>(a.batch);
  switch (a.head_dim) {
    case 64: DispatchHeads<T, 64>(p, a.device, batch); break;
    case 128: DispatchHeads<T, 128>(p, a.device, batch); break;
    default: DispatchHeads<T, 256>(p, a.device, batch); break;  // the contract allows no other
  }
  if (a.num_splits > 1) {
    host::LaunchKernel(static_cast<unsigned>(a.batch * a.num_heads), kMergeThreads, a.device)
        .enable_pdl(true)(MergeSplitsKernel<T>, p.out, p.lse, p.partial_out, p.partial_lse, p.num_splits,
                          static_cast<int>(a.head_dim));
  }
}

}  // namespace decode_attention_detail

/*!
 * \brief out, lse = attention of q [B, H, D] over each request's paged keys (arguments:
 * decode_attention.hpp); num_threads is the CPU's and ignored here. Asynchronous: no host sync.
 */
inline void decode_attention(tvm::ffi::TensorView out, tvm::ffi::TensorView lse, tvm::ffi::TensorView q,
                             tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
                             tvm::ffi::TensorView block_table, tvm::ffi::TensorView seq_lens,
                             tvm::ffi::TensorView partial_out, tvm::ffi::TensorView partial_lse, double scale,
                             int64_t sliding_window, double soft_cap, int64_t num_splits, int64_t num_threads,
                             tvm::ffi::TensorView error) {
  (void)num_threads;
  const auto a = mllm_kernel::decode_attention::VerifyDecodeAttention<kDLCUDA>(
      out, lse, q, k_cache, v_cache, block_table, seq_lens, partial_out, partial_lse, scale, sliding_window,
      soft_cap, num_splits, error);
  if (a.empty()) return;  // a zero-block grid is a launch error
  if (a.dtype == host::kDType<host::float16_tag>) {
    decode_attention_detail::Decode<device::fp16_t>(a, out, lse, q, k_cache, v_cache, block_table, seq_lens,
                                                    partial_out, partial_lse, error);
  } else {
    decode_attention_detail::Decode<device::bf16_t>(a, out, lse, q, k_cache, v_cache, block_table, seq_lens,
                                                    partial_out, partial_lse, error);
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
  constexpr int kWarps = 4;
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    host::LaunchKernel(static_cast<unsigned>((rows + kWarps - 1) / kWarps), kWarps * device::kWarpThreads, a.device)
        .enable_pdl(true)(decode_attention_detail::MergeStatesKernel<T>, data_ptr<T>(v), data_ptr<float>(lse),
                          data_ptr<const T>(v_a), data_ptr<const float>(lse_a), data_ptr<const T>(v_b),
                          data_ptr<const float>(lse_b), a.rows, static_cast<int>(a.num_heads),
                          static_cast<int>(a.head_dim), a.a_stride, a.b_stride);
  });
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_DECODE_ATTENTION_CUH_
