/*!
 * \file kernels/sampling/sampling.cuh
 * \brief CUDA token sampling: greedy (argmax), top-k/top-p and min-p by inverse CDF, on
 *        torch's current stream. Same selection rules as sampling.cpp (see its file comment).
 *
 * A row is split over a cluster of blocks (sm_90; one block elsewhere) so that a decode batch
 * of a few rows still fills the GPU; block r owns the slice [r * slice, (r + 1) * slice) and
 * copies it into its shared memory when it fits, so every later pass reads shared memory, not
 * L2. The plan (cluster size, threads, slice) depends on the shape only: CUDA-graph safe.
 *  - greedy: one pass, (value, index) argmax over the block, then over the cluster.
 *  - top-k / top-p: radix selection on the order-preserving uint32 key of the logit, 8 bits
 *    per pass (at most 4 passes each, fewer when a bin holds exactly the rest): top-k picks the
 *    k-th largest key from bin counts, top-p the largest key whose kept mass reaches top_p of
 *    the top-k set's mass from bin sums of exp. With top-k, the thread maxima first bound the
 *    k-th largest key from below (the floor, reduced with the row max); block 0 gathers the
 *    row's few elements above it and runs both searches and the sample alone, while the other
 *    blocks leave. Otherwise (no top-k, or too many candidates: ties) bins are summed over the
 *    cluster through distributed shared memory, and after top-k each block compacts its
 *    survivors, which top-p and the sample walk instead of the slice. From about two long rows
 *    per SM (StreamRows) top_k_top_p instead gives each row one block that reads it once and
 *    keeps only the elements above a rising bound of the k-th largest (StreamTopK).
 *  - min-p: the max, then the threshold is known.
 *  - filters (top_k_mask_logits, top_k_renorm_probs, top_p_renorm_probs): the same selections,
 *    then each block writes its slice of the output row.
 *  - sampling: each warp sums its contiguous part of the slice, scans over warps and blocks
 *    give the offsets, and the warp whose part crosses u * total walks it with a warp scan.
 * Weights are fixed point (exp(v - max) * 2^31, as uint32, summed in uint64): sums do not
 * depend on the order of additions, so every run, plan and cluster size picks the same token.
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * mllm_kernel::gpu::{greedy_sample, top_k_top_p_sample, min_p_sample, top_k_mask_logits,
 * top_k_renorm_probs, top_p_renorm_probs} (arguments: sampling.hpp).
 */
#ifndef MLLM_KERNEL_KERNELS_SAMPLING_CUH_
#define MLLM_KERNEL_KERNELS_SAMPLING_CUH_

#include <mllm_kernel/cuda/mma.cuh>  // cp_async_16
#include <mllm_kernel/row_cluster.cuh>
#include <mllm_kernel/utils.cuh>

#include "sampling.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace mllm_kernel::gpu {

namespace sampling_detail {

using device::AlignedVector;
using device::kFullMask;
using device::kWarpThreads;

// ----------------------------------------------------------------------------- the row slice

/*! \brief This block's part of a row: n elements, data[0] is element `begin` of the row.
 *         Source: the row's dtype, of which compacted slices hold float copies (its key bits
 *         bound the radix passes, the same in every block whichever slice it walks). */
template <typename T, typename Source = T>
struct Slice {
  const T* data;  // this block's shared-memory copy, or the row itself in global memory
  int64_t begin, n;
  const uint32_t* index = nullptr;  // compacted slices: the position in the slice of data[i]
};

// This block's slice of `row`; copied into `copy` (shared memory) when in_smem. *max gets the
// thread's max of its elements (NaN ignored, like fmaxf).
template <typename T>
__device__ __forceinline__ Slice<T> LoadSlice(const T* row, int64_t vocab, int64_t slice_len,
                                              T* copy, bool in_smem, float* max) {
  const auto [begin, n] = device::row_slice(vocab, slice_len);
  const T* src = row + begin;
  float m = -INFINITY;
  int64_t start = 0;
  if (device::is_aligned<16>(src)) {  // slice_len is whole vectors: src aligned iff row is
    constexpr int kVec = device::kVecSize<T>;
    using Vec = AlignedVector<T, kVec>;
    if (in_smem) {
      // Asynchronous copies put all of a thread's 16-byte loads in flight at once (a load and a
      // store per step keep one in flight); the max then reads the thread's own copies back.
      for (int64_t v = threadIdx.x; v < n / kVec; v += blockDim.x) {
        device::cp_async_16(copy + v * kVec, src + v * kVec, true);
      }
      device::cp_async_commit();
      device::cp_async_wait<0>();
    }
    const T* from = in_smem ? copy : src;
    for (int64_t v = threadIdx.x; v < n / kVec; v += blockDim.x) {
      Vec a;
      a.load(from, v);
#pragma unroll
      for (int k = 0; k < kVec; ++k) m = fmaxf(m, device::to_float(a[k]));
    }
    start = n / kVec * kVec;
  }
  for (int64_t i = start + threadIdx.x; i < n; i += blockDim.x) {
    m = fmaxf(m, device::to_float(src[i]));
    if (in_smem) copy[i] = src[i];
  }
  *max = m;
  if (in_smem) __syncthreads();
  return {in_smem ? copy : src, begin, n};
}

// *dst = the 16 bytes at shared-memory address `address`: a shared load (`ld.shared`), where a
// generic load through the slice's pointer costs more.
template <typename V>
__device__ __forceinline__ void LoadShared16(V* dst, uint32_t address) {
  static_assert(sizeof(V) == 16, "one 16-byte vector");
  uint4& raw = *reinterpret_cast<uint4*>(dst);
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
               : "r"(address));
}

// Calls f(value as float) for every element of the slice, in no particular order (for sums and
// histograms). A slice of at least a vector per thread is read 16 bytes a load, its shared-memory
// copy with shared loads (not generic ones); fewer elements (gathered candidates) one a thread,
// so that each thread's chain of atomics stays short (TUNING.md, "Vector loads in the radix passes").
template <typename T, typename Source, typename Fn>
__device__ __forceinline__ void ForEachValue(const Slice<T, Source>& s, Fn&& f) {
  constexpr int kVec = device::kVecSize<T>;
  using Vec = AlignedVector<T, kVec>;
  int64_t start = 0;
  if (s.n >= static_cast<int64_t>(blockDim.x) * kVec && device::is_aligned<16>(s.data)) {
    const int64_t nvec = s.n / kVec;
    auto each = [&](const Vec& a) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) f(device::to_float(a[k]));
    };
    if (__isShared(s.data)) {
      const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(s.data));
      for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
        Vec a;
        LoadShared16(&a, base + static_cast<uint32_t>(v) * 16u);
        each(a);
      }
    } else {
      for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
        Vec a;
        a.load(s.data, v);
        each(a);
      }
    }
    start = nvec * kVec;
  }
  for (int64_t i = start + threadIdx.x; i < s.n; i += blockDim.x) f(device::to_float(s.data[i]));
}

// ----------------------------------------------------------------------------- cluster reductions

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a + b; }
};

/*! \brief The row max and a lower bound of its k-th largest key, reduced together. */
struct MaxAndFloor {
  float max;
  uint32_t floor;
};
struct MaxAndFloorOp {
  __device__ MaxAndFloor operator()(MaxAndFloor a, MaxAndFloor b) const {
    return {fmaxf(a.max, b.max), a.floor > b.floor ? a.floor : b.floor};
  }
};

/*! \brief Shared state of the reductions of one kernel (static shared memory). */
struct ClusterScratch {
  float max[2];
  uint64_t sum[2];
  MaxAndFloor max_floor[2];
};

// A reduction's barrier and its per-block values: over the cluster, or (kCluster false) over
// this block alone, for a block that holds all of a row's candidates (GatherCandidates).
template <bool kCluster>
__device__ __forceinline__ void ReductionSync() {
  if constexpr (kCluster) {
    device::cluster_sync();
  } else {
    __syncthreads();
  }
}
template <bool kCluster, typename V, typename Fn>
__device__ __forceinline__ void ForEachBlock(const V* ptr, Fn&& fn) {
  if constexpr (kCluster) {
    device::for_each_peer(ptr, fn);
  } else {
    fn(0u, *ptr);
  }
}

/*! \brief Which slot of each alternating pair a reduction uses next. Held per thread (every
 *         thread flips it alike) rather than in shared memory, so no thread rewrites a shared
 *         value that another may still read. */
struct Parities {
  unsigned max = 0, sum = 0, max_floor = 0, radix = 0, sample = 0;
};

// ----------------------------------------------------------------------------- keys and weights

// Order-preserving map float -> uint32 (for non-NaN); -0 and +0 map to the same key.
__device__ __forceinline__ uint32_t Key(float f) {
  if (f == 0.0f) f = 0.0f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The float t with Key(v) >= key <=> v >= t for every non-NaN v: a float compare instead of a
// key per element where NaN weighs 0 either way.
__device__ __forceinline__ float KeyThresholdValue(uint32_t key) {
  if (key <= Key(-INFINITY)) return -INFINITY;
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// Floats [*lo_value, *hi_value] with v in them <=> Key(v) in [lo, hi], for every v (NaN in
// neither), where no NaN key lies in [lo, hi]; false where one may (then compare keys).
__device__ __forceinline__ bool KeyRangeValues(uint32_t lo, uint32_t hi, float* lo_value, float* hi_value) {
  if (lo < Key(-INFINITY) || hi > Key(INFINITY)) return false;
  *lo_value = KeyThresholdValue(lo);
  // Key(-0) is Key(+0): the largest key below it that a float has is -denorm_min's.
  *hi_value = __uint_as_float((hi & 0x80000000u) ? (hi & 0x7FFFFFFFu) : ~min(hi, 0x7FFFFFFEu));
  return true;
}

// Fixed-point weight of a logit: exp(v - row_max) in [0, 1] times 2^31 (NaN -> 0), by the SFU's
// 2^x (relative error about 2^-22, against about 2^-23 for expf's 12 instructions: the same
// function on every plan, so the token still does not depend on the plan).
__device__ __forceinline__ uint32_t ExpWeight(float v, float row_max) {
  constexpr float kLog2e = 1.4426950408889634f;
  return __float2uint_rn(device::exp2_approx((v - row_max) * kLog2e) * 0x1p31f);
}

// Fixed-point weight of a probability: p * scale (scale = 2^31 / max p); NaN and p <= 0 -> 0.
__device__ __forceinline__ uint32_t ProbWeight(float p, float scale) { return __float2uint_rn(p * scale); }

// ----------------------------------------------------------------------------- radix selection

inline constexpr int kRadixBits = 8, kBins = 1 << kRadixBits;

// The leading bits of Key(x) that tell values of T apart (the rest follow from the sign): 16
// for bfloat16 and 19 for float16 (sign, exponent, mantissa widened to float), so their searches
// end after 2 and 3 passes instead of going on through bins of equal values.
template <typename T>
inline constexpr int kKeyBits = std::is_same_v<T, device::bf16_t> ? 16 : std::is_same_v<T, device::fp16_t> ? 19 : 32;
// Bins are updated with one shared-memory atomic per element and count (32-bit: see AddMass).
// Measured on H100 (TUNING.md, 64 x 128256 fp32 top-p): aggregating the first pass per warp
// (__match_any_sync, partial-mask reductions, 64-bit atomics) took 2x the time of this.

/*! \brief Per-block bin counts and masses, two sets alternating between passes (see
 *         device::cluster_all_reduce), and the bin a pass chose. */
struct RadixScratch {
  uint32_t count[2][kBins];
  // A bin's mass is mass_hi * 2^32 + mass_lo, added with 32-bit atomics (AddMass): shared
  // memory has no native 64-bit atomic add (it compiles to a compare-and-swap loop).
  uint32_t mass_lo[2][kBins], mass_hi[2][kBins];
  uint64_t warp_sums[kBins / kWarpThreads];
  uint64_t above, in_bin, in_bin_count;  // of the chosen bin
  uint32_t bin;
};

// Adds w to a bin's mass: the low word first; its carry, and w's high word, to the high word.
__device__ __forceinline__ void AddMass(RadixScratch& rs, unsigned par, uint32_t bin, uint64_t w) {
  const uint32_t low = static_cast<uint32_t>(w);
  const uint32_t old = atomicAdd(&rs.mass_lo[par][bin], low);
  const uint32_t high = static_cast<uint32_t>(w >> 32) + (old + low < old ? 1u : 0u);
  if (high != 0) atomicAdd(&rs.mass_hi[par][bin], high);
}

// The sum of v over bins 0..255 (threads 0..255), to every thread. Called by ChooseBin, after
// the warp sums are written.
__device__ __forceinline__ uint64_t BinTotal(const RadixScratch& rs) {
  uint64_t total = 0;
#pragma unroll
  for (int w = 0; w < kBins / kWarpThreads; ++w) total += rs.warp_sums[w];
  return total;
}

// Among bins 0..255 held by threads 0..255 (value v, count c), the bin t with
// sum(v of bins > t) < need <= sum(v of bins >= t), need = need_of(sum of all v); written to
// rs. Returns need; 0 (nothing chosen) when need_of says so. Needs >= 256 threads and
// need <= the sum of all v.
template <typename NeedFn>
__device__ __forceinline__ uint64_t ChooseBin(uint64_t v, uint64_t c, NeedFn&& need_of, RadixScratch& rs) {
  const unsigned t = threadIdx.x, lane = t % kWarpThreads, warp = t / kWarpThreads;
  uint64_t suffix = v;  // inclusive suffix sum within the warp
#pragma unroll
  for (int offset = 1; offset < kWarpThreads; offset <<= 1) {
    const uint64_t x = __shfl_down_sync(kFullMask, suffix, offset);
    if (lane + offset < kWarpThreads) suffix += x;
  }
  if (t < kBins && lane == 0) rs.warp_sums[warp] = suffix;
  __syncthreads();
  const uint64_t need = need_of(BinTotal(rs));
  if (need == 0) return 0;  // block-uniform: every thread saw the same warp sums
  if (t < kBins) {
    for (unsigned w = warp + 1; w < kBins / kWarpThreads; ++w) suffix += rs.warp_sums[w];
    if (suffix >= need && suffix - v < need) {
      rs.bin = t;
      rs.above = suffix - v;
      rs.in_bin = v;
      rs.in_bin_count = c;
    }
  }
  __syncthreads();
  return need;
}

/*! \brief A radix selection's result: keys >= threshold are selected; kept is their weight
 *         (kMass) or count, summed over the row. */
struct Selection {
  uint32_t threshold;
  uint64_t kept;
};

/*!
 * \brief The largest key t with sum(weight of elements with key >= t and key >= floor) >= need,
 *        over the row (the cluster's slices; this block's slice alone when kCluster is false);
 *        weight is 1 (kMass false) or weight(x) (a uint32 fixed-point weight of at most 2^31, as
 *        ExpWeight). need = need_of(total), total being the weight of the elements >= floor,
 *        which the first pass sums anyway (no pass of its own); need_of returns 0 to select them
 *        all. Returns t, or a smaller key selecting the same elements when a bin turns out to
 *        hold exactly the rest, one element or one value of the row's dtype (kKeyBits), with
 *        the weight it selects. Every thread gets it.
 */
template <bool kMass, bool kCluster = true, typename T, typename Source, typename WeightFn, typename NeedFn>
__device__ Selection RadixSelect(const Slice<T, Source>& s, uint32_t floor, NeedFn&& need_of, WeightFn&& weight,
                                 RadixScratch& rs, unsigned& parity) {
  uint32_t prefix = 0, prefix_mask = 0;
  uint64_t need = 0, above = 0;  // above: the weight of elements above the current bin
  for (int shift = 32 - kRadixBits; shift > 32 - kKeyBits<Source> - kRadixBits; shift -= kRadixBits) {
    const unsigned par = parity;
    // The pass counts keys in [lo, hi]. Over whole slices a float compare tells them (later
    // passes: most elements fall outside) or every key counts (a first pass without floor); one
    // block's few gathered candidates keep the one loop (less code on the path of a row).
    const uint32_t lo = max(prefix, floor), hi = prefix | ~prefix_mask;
    const bool all_keys = kCluster && lo == 0 && hi == UINT32_MAX;
    // A mass search's pass over every key sums masses only: its bins hold too many elements for
    // a count of 1 to end the search, and the atomics of a crowded first pass collide.
    const bool counted = !kMass || !all_keys;
    for (unsigned b = threadIdx.x; b < kBins; b += blockDim.x) {
      if (counted) rs.count[par][b] = 0;
      if (kMass) rs.mass_lo[par][b] = rs.mass_hi[par][b] = 0;
    }
    __syncthreads();
    auto add = [&](float v, uint32_t key) {
      const uint32_t digit = (key >> shift) & (kBins - 1);
      atomicAdd(&rs.count[par][digit], 1u);
      if constexpr (kMass) AddMass(rs, par, digit, weight(v));
    };
    float lo_value, hi_value;
    if (!kCluster) {
      ForEachValue(s, [&](float v) {
        const uint32_t key = Key(v);
        if (key - lo <= hi - lo) add(v, key);
      });
    } else if (all_keys) {
      ForEachValue(s, [&](float v) {
        const uint32_t key = Key(v);
        if constexpr (kMass) {
          AddMass(rs, par, (key >> shift) & (kBins - 1), weight(v));
        } else {
          add(v, key);
        }
      });
    } else if (KeyRangeValues(lo, hi, &lo_value, &hi_value)) {
      ForEachValue(s, [&](float v) {
        if (v >= lo_value && v <= hi_value) add(v, Key(v));
      });
    } else {
      ForEachValue(s, [&](float v) {
        const uint32_t key = Key(v);
        if (key - lo <= hi - lo) add(v, key);
      });
    }
    ReductionSync<kCluster>();
    uint64_t c = counted ? 0 : 2, m = 0;  // uncounted: any count but 1
    if (threadIdx.x < kBins) {
      if (counted) ForEachBlock<kCluster>(&rs.count[par][threadIdx.x], [&](unsigned, uint32_t x) { c += x; });
      if constexpr (kMass) {
        ForEachBlock<kCluster>(&rs.mass_lo[par][threadIdx.x], [&](unsigned, uint32_t x) { m += x; });
        ForEachBlock<kCluster>(&rs.mass_hi[par][threadIdx.x], [&](unsigned, uint32_t x) { m += static_cast<uint64_t>(x) << 32; });
      }
    }
    parity = par ^ 1u;
    const bool first = prefix_mask == 0;
    const uint64_t v = kMass ? m : c;
    need = first ? ChooseBin(v, c, need_of, rs) : ChooseBin(v, c, [need](uint64_t) { return need; }, rs);
    if (need == 0) return {floor, first ? BinTotal(rs) : 0};  // first pass only (need stays > 0)
    need -= rs.above;
    above += rs.above;
    prefix |= rs.bin << shift;
    prefix_mask |= static_cast<uint32_t>(kBins - 1) << shift;
    // The whole bin is in: keys >= its lowest key select the same elements.
    if (rs.in_bin == need || rs.in_bin_count == 1) break;
  }
  return {prefix, above + rs.in_bin};
}

// ----------------------------------------------------------------------------- sampling

/*! \brief Per-warp and per-block totals of the inverse-CDF step. */
struct SampleScratch {
  uint64_t warp_sums[kWarpThreads];
  uint64_t block_sums[2];
};

/*! \brief The sum over a warp of values below 2^35 (a lane's group of up to 8 weights below
 *         2^32): two 32-bit reductions, one instruction each on sm_80 and later. */
__device__ __forceinline__ uint64_t WarpSumSmall(uint64_t x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t lo = __reduce_add_sync(kFullMask, static_cast<uint32_t>(x) & 0xFFFFu);  // < 2^21
  const uint32_t hi = __reduce_add_sync(kFullMask, static_cast<uint32_t>(x >> 16));      // < 2^24
  return (static_cast<uint64_t>(hi) << 16) + lo;
#else
  return device::warp_reduce_sum(x);
#endif
}

/*!
 * \brief Inverse CDF over the row (the cluster's slices; this block's alone when kCluster is
 *        false) with weights w(x) (0 for dropped tokens): writes to *out the first index whose
 *        running sum exceeds floor(u * total), or 0 when every weight is 0. Warp j of a block
 *        owns a contiguous part of the slice, so index order is warp order, then block (rank)
 *        order. Over slices a lane takes a group of one 16-byte vector's elements at a time
 *        (one load where the slice is aligned): the warp that holds the crossing steps over 32
 *        groups by their sum and scans only the step that crosses. With kCluster it arrives at
 *        a cluster barrier after its last read of a peer: the caller ends with cluster_wait().
 */
template <bool kCluster, typename T, typename Source, typename WeightFn>
__device__ __forceinline__ void SampleIndex(const Slice<T, Source>& s, float u, WeightFn&& w, int64_t* out,
                                            SampleScratch& ss, unsigned& parity) {
  // Elements a lane takes at once: a 16-byte vector over slices, one over one block's few
  // gathered candidates.
  constexpr int kGroup = kCluster ? device::kVecSize<T> : 1;
  const unsigned lane = threadIdx.x % kWarpThreads, warp = threadIdx.x / kWarpThreads;
  const unsigned num_warps = blockDim.x / kWarpThreads;
  // Warp parts of whole groups, so that every group of an aligned slice is one aligned vector.
  const int64_t part = ((s.n + kGroup - 1) / kGroup + num_warps - 1) / num_warps * kGroup;
  const int64_t begin = min(s.n, part * warp), end = min(s.n, begin + part);
  const bool vectors = kGroup > 1 && device::is_aligned<16>(s.data);
  const bool shared = vectors && __isShared(s.data);
  const uint32_t shared_base = shared ? static_cast<uint32_t>(__cvta_generic_to_shared(s.data)) : 0u;
  // wk = the weights of elements [i, i + kGroup) of the slice (0 past end); i is a multiple of kGroup.
  auto group_weights = [&](int64_t i, uint32_t(&wk)[kGroup]) {
    if constexpr (kGroup > 1) {
      if (vectors && i + kGroup <= end) {
        AlignedVector<T, kGroup> a;
        if (shared) {
          LoadShared16(&a, shared_base + static_cast<uint32_t>(i) * static_cast<uint32_t>(sizeof(T)));
        } else {
          a.load(s.data + i);
        }
#pragma unroll
        for (int k = 0; k < kGroup; ++k) wk[k] = w(a[k]);
        return;
      }
    }
#pragma unroll
    for (int k = 0; k < kGroup; ++k) wk[k] = i + k < end ? w(s.data[i + k]) : 0u;
  };
  constexpr int64_t kStep = int64_t{kWarpThreads} * kGroup;  // elements a warp takes per step
  uint64_t local = 0;
  for (int64_t i = begin + lane * kGroup; i < end; i += kStep) {
    uint32_t wk[kGroup];
    group_weights(i, wk);
#pragma unroll
    for (int k = 0; k < kGroup; ++k) local += wk[k];
  }
  local = device::warp_reduce_sum(local);
  if (lane == 0) ss.warp_sums[warp] = local;
  __syncthreads();
  uint64_t block_total = 0, warp_before = 0;
  for (unsigned j = 0; j < num_warps; ++j) {
    const uint64_t x = ss.warp_sums[j];
    warp_before += j < warp ? x : 0;
    block_total += x;
  }
  const unsigned par = parity;
  if (threadIdx.x == 0) ss.block_sums[par] = block_total;
  ReductionSync<kCluster>();
  uint64_t total = 0, block_before = 0;
  const unsigned rank = device::cluster_rank();
  ForEachBlock<kCluster>(&ss.block_sums[par], [&](unsigned r, uint64_t x) {
    if constexpr (kCluster) block_before += r < rank ? x : 0;
    total += x;
  });
  // This block reads no peer any more: the kernel's last barrier can open while one warp walks.
  if constexpr (kCluster) device::cluster_arrive();
  parity = par ^ 1u;
  if (total == 0) {
    if ((!kCluster || rank == 0) && threadIdx.x == 0) *out = 0;
    return;
  }
  // u < 1, so target < total: exactly one warp of one block holds the crossing.
  const uint64_t target = static_cast<uint64_t>(static_cast<double>(u) * static_cast<double>(total));
  uint64_t run = block_before + warp_before;
  if (target < run || target >= run + local) return;
  for (int64_t base = begin; base < end; base += kStep) {
    const int64_t i = base + lane * kGroup;
    uint32_t wk[kGroup] = {};
    if (i < end) group_weights(i, wk);
    uint64_t mine = 0;
#pragma unroll
    for (int k = 0; k < kGroup; ++k) mine += wk[k];
    if (base + kStep < end) {  // not the last step, which holds the crossing if no other did
      const uint64_t step = WarpSumSmall(mine);
      if (run + step <= target) {  // warp-uniform
        run += step;
        continue;
      }
    }
    uint64_t incl = mine;  // inclusive scan over the lanes' groups
#pragma unroll
    for (int offset = 1; offset < kWarpThreads; offset <<= 1) {
      const uint64_t x = __shfl_up_sync(kFullMask, incl, offset);
      if (lane >= static_cast<unsigned>(offset)) incl += x;
    }
    const unsigned hit = __ballot_sync(kFullMask, run + incl > target);
    if (lane == static_cast<unsigned>(__ffs(hit) - 1)) {
      uint64_t r = run + incl - mine;  // the sum before this lane's group
      int at = -1;                     // the group's first element that takes it past target
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        r += wk[k];
        if (at < 0 && r > target) at = k;
      }
      *out = s.begin + (s.index ? s.index[i + at] : i + at);
    }
    return;
  }
}

// ----------------------------------------------------------------------------- kernels

using device::ArgMax;  // argmax candidates: NaN first, then the larger value, then the smaller index
using device::argmax_better;
using device::warp_argmax;

template <typename T>
__global__ void __launch_bounds__(1024, 1)
    GreedyKernel(int64_t* __restrict__ out, const T* __restrict__ logits, int64_t vocab,
                 int64_t stride, int64_t slice_len) {
  __shared__ ArgMax partial[kWarpThreads];
  __shared__ ArgMax block_best;
  device::pdl_wait_primary();
  const int64_t b = blockIdx.x / device::cluster_size();
  const auto [begin, n] = device::row_slice(vocab, slice_len);
  const T* src = logits + b * stride + begin;
  ArgMax best{-INFINITY, INT64_MAX};
  auto visit = [&](int64_t i, float v) {
    if (argmax_better(v, begin + i, best.v, best.i)) best = {v, begin + i};
  };
  int64_t start = 0;
  if (device::is_aligned<16>(src)) {
    constexpr int kVec = device::kVecSize<T>;
    using Vec = AlignedVector<T, kVec>;
    // Four loads a thread in flight: 256 x 128256 float32 at 93% of copy instead of 80%.
    device::for_each_vec_in_flight<4, Vec>(src, n / kVec, [&](int64_t v, const Vec& a) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) visit(v * kVec + k, device::to_float(a[k]));
    });
    start = n / kVec * kVec;
  }
  for (int64_t i = start + threadIdx.x; i < n; i += blockDim.x) visit(i, device::to_float(src[i]));
  const unsigned lane = threadIdx.x % kWarpThreads, warp = threadIdx.x / kWarpThreads;
  best = warp_argmax(best);
  if (lane == 0) partial[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = lane < blockDim.x / kWarpThreads ? partial[lane] : ArgMax{-INFINITY, INT64_MAX};
    best = warp_argmax(best);
    if (lane == 0) block_best = best;
  }
  device::cluster_sync();  // block_best of every block is written
  if (device::cluster_rank() == 0 && threadIdx.x == 0) {
    best = block_best;
    device::for_each_peer(&block_best, [&](unsigned, const ArgMax& p) {
      if (argmax_better(p.v, p.i, best.v, best.i)) best = p;
    });
    out[b] = best.i;
  }
  device::cluster_sync();  // rank 0 has read every block_best
  device::pdl_launch_dependents();
}

// The row max over the cluster; every thread gets it.
__device__ __forceinline__ float ClusterMax(float thread_max, ClusterScratch& cs, Parities& par) {
  return device::cluster_all_reduce(device::block_reduce_max(thread_max), MaxOp{}, cs.max, par.max);
}

__device__ __forceinline__ uint64_t ClusterSum(uint64_t thread_sum, ClusterScratch& cs, Parities& par) {
  return device::cluster_all_reduce(device::block_reduce_sum(thread_sum), SumOp{}, cs.sum, par.sum);
}

// ----------------------------------------------------------------------------- top-k survivors

// After a top-k selection a block keeps a few of its elements: top-p and sampling then walk
// those (values as float, with their positions) instead of the whole slice.
inline constexpr int kMaxSurvivors = 1024;

struct SurvivorScratch {
  float values[kMaxSurvivors];
  uint32_t index[kMaxSurvivors];
  uint32_t warp_counts[kWarpThreads];
  uint32_t counts[device::kMaxClusterBlocks];  // every block's survivors, written by each block (GatherCandidates)
};

/*! \brief The number of elements of s with Key >= threshold (block-uniform); when it is at most
 *         kMaxSurvivors, they are copied in index order into sv, and *out views them. */
template <typename T>
__device__ uint32_t CompactSurvivors(const Slice<T>& s, uint32_t threshold, SurvivorScratch& sv,
                                    Slice<float, T>* out) {
  const unsigned lane = threadIdx.x % kWarpThreads, warp = threadIdx.x / kWarpThreads;
  // Contiguous ranges keep index order; an odd length keeps the 32 lanes' reads in distinct banks.
  const int64_t per = ((s.n + blockDim.x - 1) / blockDim.x) | 1;
  const int64_t begin = min(s.n, per * threadIdx.x), end = min(s.n, begin + per);
  uint32_t mine = 0;
  for (int64_t i = begin; i < end; ++i) mine += Key(device::to_float(s.data[i])) >= threshold;
  uint32_t incl = mine;  // inclusive scan over the warp
#pragma unroll
  for (int offset = 1; offset < kWarpThreads; offset <<= 1) {
    const uint32_t x = __shfl_up_sync(kFullMask, incl, offset);
    if (lane >= static_cast<unsigned>(offset)) incl += x;
  }
  if (lane == kWarpThreads - 1) sv.warp_counts[warp] = incl;
  __syncthreads();
  uint32_t pos = incl - mine, total = 0;
  for (unsigned w = 0; w < blockDim.x / kWarpThreads; ++w) {
    const uint32_t c = sv.warp_counts[w];
    pos += w < warp ? c : 0;
    total += c;
  }
  if (total > kMaxSurvivors) return total;
  for (int64_t i = begin; i < end; ++i) {
    const float v = device::to_float(s.data[i]);
    if (Key(v) >= threshold) {
      sv.values[pos] = v;
      sv.index[pos++] = static_cast<uint32_t>(i);
    }
  }
  __syncthreads();
  *out = {sv.values, s.begin, static_cast<int64_t>(total), sv.index};
  return total;
}

// A top-k search needs k elements (k > 0); with fewer than k searched it selects them all.
struct CountNeed {
  int64_t k;
  __device__ uint64_t operator()(uint64_t total) const {
    return total >= static_cast<uint64_t>(k) ? static_cast<uint64_t>(k) : 0;
  }
};

// ----------------------------------------------------------------------------- top-k candidates
// Most of a top-k search's work is in its first radix pass over the whole row. A cheap lower
// bound of the k-th largest key skips it: every thread's max is one of the row's elements, so
// the k-th largest of a block's thread maxima has at least k elements at or above it, and so
// has the largest of these bounds over the cluster (the floor). For k much smaller than a
// block's threads only a few elements per block reach the floor: the candidates.

inline constexpr uint32_t kKeyAboveMinusInf = 0x00800000u;  // Key(-inf) + 1

// Block 0 gathers the candidates (a float and a uint32 each) into its slice's shared memory,
// which top_k_top_p launches make at least this large (about 8 blocks' worth at k = 50-100).
inline constexpr int64_t kMinGatherBytes = 16 * 1024;

// The dynamic shared memory of a launch whose slices fit: the slice, at least min_bytes.
template <typename T>
__host__ __device__ __forceinline__ int64_t SliceSmemBytes(int64_t slice_len, int64_t min_bytes) {
  const int64_t bytes = slice_len * static_cast<int64_t>(sizeof(T));
  return bytes > min_bytes ? bytes : min_bytes;
}

/*!
 * \brief A key at most the k-th largest of the block's thread maxima (-inf ones left out): its
 *        top 16 bits (two radix passes; sign, exponent and 7 mantissa bits), or 0 when fewer
 *        than k maxima are finite. Block-local: no cluster barrier, and the rs sets it uses
 *        are free again when it returns. The maxima of a row crowd into few bins, so each warp
 *        adds one count per distinct digit rather than one per thread.
 */
__device__ __forceinline__ uint32_t KthLargestThreadMax(float thread_max, int64_t k, RadixScratch& rs) {
  const unsigned lane = threadIdx.x % kWarpThreads;
  const uint32_t key = thread_max > -INFINITY ? Key(thread_max) : 0u;  // fmaxf: never NaN
  uint32_t prefix = 0, prefix_mask = 0;
  uint64_t need = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const int shift = 32 - kRadixBits * (pass + 1);
    uint32_t* count = rs.count[pass];
    for (unsigned b = threadIdx.x; b < kBins; b += blockDim.x) count[b] = 0;
    __syncthreads();
    const bool in = key != 0 && (key & prefix_mask) == prefix;
    const unsigned active = __ballot_sync(kFullMask, in);
    if (in) {
      const uint32_t digit = (key >> shift) & (kBins - 1);
      const unsigned peers = __match_any_sync(active, digit);
      if (lane == static_cast<unsigned>(__ffs(peers) - 1)) atomicAdd(&count[digit], __popc(peers));
    }
    __syncthreads();
    const uint64_t c = threadIdx.x < kBins ? count[threadIdx.x] : 0;
    need = pass == 0 ? ChooseBin(c, c, CountNeed{k}, rs) : ChooseBin(c, c, [need](uint64_t) { return need; }, rs);
    if (need == 0) return 0u;  // fewer than k finite maxima
    need -= rs.above;
    prefix |= rs.bin << shift;
    prefix_mask |= static_cast<uint32_t>(kBins - 1) << shift;
  }
  return max(prefix, kKeyAboveMinusInf);
}

/*!
 * \brief Gathers the row's elements with Key >= floor (the candidates) into block 0 of the
 *        cluster: each block compacts its own (CompactSurvivors), tells every block its count,
 *        and writes its candidates into block 0's values / index (index: the position in the
 *        row) in rank order (= index order); then it arrives at a cluster barrier, and block 0
 *        waits there for all of them (cluster_wait) before reading *out. No block reads a peer's
 *        shared memory, so the others may leave after arriving. Returns false, the same in every
 *        block, when some block has more than kMaxSurvivors or the row more than `capacity`:
 *        nothing is gathered then, and no block has arrived.
 */
template <typename T>
__device__ bool GatherCandidates(const Slice<T>& s, uint32_t floor, int64_t slice_len, int64_t capacity,
                                 SurvivorScratch& sv, float* values, uint32_t* index, Slice<float, T>* out) {
  Slice<float, T> mine;
  const uint32_t n = CompactSurvivors(s, floor, sv, &mine);
  const unsigned rank = device::cluster_rank(), size = device::cluster_size();
  if (threadIdx.x < size) *device::cluster_peer(&sv.counts[rank], threadIdx.x) = n;
  device::cluster_sync();  // every block holds every count
  uint64_t total = 0, before = 0;
  uint32_t most = 0;
  for (unsigned r = 0; r < size; ++r) {
    const uint32_t c = sv.counts[r];
    before += r < rank ? c : 0;
    total += c;
    most = max(most, c);
  }
  if (most > kMaxSurvivors || total > static_cast<uint64_t>(capacity)) return false;
  // Block 0's gather space is its slice, which it no longer reads: it compacted before the barrier.
  float* to_values = device::cluster_peer(values, 0) + before;
  uint32_t* to_index = device::cluster_peer(index, 0) + before;
  const uint32_t begin = static_cast<uint32_t>(rank * slice_len);
  for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) {
    to_values[j] = sv.values[j];
    to_index[j] = begin + sv.index[j];
  }
  device::cluster_arrive();  // release: block 0 sees the candidates after its cluster_wait
  *out = {values, 0, static_cast<int64_t>(total), index};
  return true;
}

// The smallest mass >= p * kept of a top-p search (at least one unit: the top token stays);
// 0 when nothing has weight (nothing to search).
struct TopPNeed {
  float p;
  __device__ uint64_t operator()(uint64_t kept) const {
    const double need = ceil(static_cast<double>(p) * static_cast<double>(kept));
    return kept == 0 ? 0 : need < 1.0 ? 1 : static_cast<uint64_t>(need);
  }
};

// Top-p over the elements with Key >= threshold (p < 1), then the sample; every block of the
// cluster runs the same reductions, whichever slice (whole or survivors) it walks (kCluster), or
// one block alone holds the row's candidates (kCluster false).
template <bool kCluster, typename T, typename Source, typename WeightFn>
__device__ __forceinline__ void TopPThenSample(const Slice<T, Source>& s, uint32_t threshold, float p, float u,
                                               WeightFn&& weight, ClusterScratch& cs, RadixScratch& rs,
                                               SampleScratch& ss, Parities& par, int64_t* out) {
  if (p < 1.0f) {
    const Selection nucleus = RadixSelect<true, kCluster>(s, threshold, TopPNeed{p}, weight, rs, par.radix);
    threshold = max(threshold, nucleus.threshold);
  }
  const float kept_from = KeyThresholdValue(threshold);
  SampleIndex<kCluster>(
      s, u,
      [&](T x) {
        const float v = device::to_float(x);
        return v >= kept_from ? weight(v) : 0u;
      },
      out, ss, par.sample);
}

// ----------------------------------------------------------------------------- streamed candidates
// With about two long rows per SM, splitting rows over clusters gains nothing (the grid fills the
// GPU anyway), and each row's chain of cluster barriers left its SM's loads idle. There one block
// takes a row and reads it once, keeping only the candidates: elements at or above a rising
// lower bound of the k-th largest (first the k-th largest of the first chunk's thread maxima,
// then the k-th largest of the kept candidates whenever they fill half the buffer). Candidates
// are kept in no order and sorted by index at the end, so that the sample walks them in index
// order as every other plan does: the same token. Rows without top-k search the row in global
// memory, several passes, which is why the plan waits for two rows per SM (StreamRows).

inline constexpr int kStreamCapacity = 2 * kMaxSurvivors;  // a compaction keeps at most half
// 16-byte loads a thread has in flight: 16 elements a chunk (with 32, 16-bit types spilled).
template <typename T>
inline constexpr int kStreamLoads = 16 / device::kVecSize<T>;
inline constexpr unsigned kStreamThreads = 512;            // two blocks an SM (64 registers)

/*!
 * \brief Whether top_k_top_p reads each row once in one block (StreamTopK). Measured on an H200
 *        (RESULTS.md, "top_k_top_p: one block a row, read once"): at 256 and 512 rows of more
 *        than 96 KiB, rows with top-k ran 1.22-1.95x faster and rows without 0.94-1.05x; at 232
 *        rows those without ran 0.88-1.00x, at 132-200 rows down to 0.63x; rows of 64 KiB
 *        (bfloat16 x 32000) lost with top-k too (0.87-0.89x at 256-512 rows).
 */
inline bool StreamRows(int64_t rows, int64_t vocab, int64_t elem_bytes, int sms) {
  return 4 * rows >= 7 * int64_t{sms} && vocab * elem_bytes > 96 * 1024 && vocab <= UINT32_MAX;
}

struct StreamScratch {
  float values[kStreamCapacity];
  uint32_t index[kStreamCapacity];
  uint32_t count;  // candidates offered since the last compaction (may pass the capacity)
};

/*! \brief A warp's appends to a candidate buffer: one shared atomic per warp and call. */
struct CandidateBuffer {
  float* values;
  uint32_t* index;
  uint32_t* count;
  uint32_t capacity;
  uint32_t high = 0;  // the largest count this thread's warp has seen its appends reach

  // Appends (x, i) where keep is set; false where the buffer was full (the caller keeps the
  // element for later). Every lane of the warp must call.
  __device__ __forceinline__ bool append(bool keep, float x, uint32_t i) {
    const unsigned lane = threadIdx.x % kWarpThreads;
    const unsigned mask = __ballot_sync(kFullMask, keep);
    if (mask == 0) return true;
    uint32_t base = 0;
    if (lane == 0) base = atomicAdd(count, static_cast<uint32_t>(__popc(mask)));
    base = __shfl_sync(kFullMask, base, 0);
    high = max(high, base + static_cast<uint32_t>(__popc(mask)));
    if (!keep) return true;
    const uint32_t pos = base + __popc(mask & ((1u << lane) - 1u));
    if (pos >= capacity) return false;
    values[pos] = x;
    index[pos] = i;
    return true;
  }
};

// Key(x) >= key, by a float compare where x is not NaN (NaN keys: see Key).
__device__ __forceinline__ bool AtOrAbove(float x, float key_value, uint32_t key) {
  return x >= key_value || (x != x && Key(x) >= key);
}

/*!
 * \brief Raises *bound to the k-th largest key of the block's candidates and drops those below
 *        it (through sv, which holds kStreamCapacity / 2). Returns false when more remain (ties
 *        at the k-th largest, or k too large): the caller then searches the whole row. Called
 *        after a barrier that follows the last append; block-uniform.
 */
template <typename T>
__device__ bool CompactCandidates(int64_t k, uint32_t* bound, StreamScratch& st, SurvivorScratch& sv,
                                  RadixScratch& rs, unsigned& parity) {
  const uint32_t n = min(st.count, static_cast<uint32_t>(kStreamCapacity));
  const Slice<float, T> all{st.values, 0, static_cast<int64_t>(n), st.index};
  const auto unused = [](float) { return 0u; };
  *bound = max(*bound, RadixSelect<false, false>(all, *bound, CountNeed{k}, unused, rs, parity).threshold);
  const float bound_value = KeyThresholdValue(*bound);
  if (threadIdx.x == 0) sv.counts[0] = 0;
  __syncthreads();
  CandidateBuffer kept{sv.values, sv.index, &sv.counts[0], kMaxSurvivors};
  for (uint32_t base = 0; base < n; base += blockDim.x) {  // warp-uniform trip count
    const uint32_t i = base + threadIdx.x;
    const float x = i < n ? st.values[i] : 0.0f;
    kept.append(i < n && AtOrAbove(x, bound_value, *bound), x, i < n ? st.index[i] : 0u);
  }
  __syncthreads();
  const uint32_t m = sv.counts[0];
  if (m > kMaxSurvivors) return false;
  for (uint32_t i = threadIdx.x; i < m; i += blockDim.x) {
    st.values[i] = sv.values[i];
    st.index[i] = sv.index[i];
  }
  if (threadIdx.x == 0) st.count = m;  // every thread read st.count before the barrier above
  __syncthreads();
  return true;
}

/*!
 * \brief One block's top-k over a whole row read once (`row` 16-byte aligned, 0 < k < vocab <=
 *        UINT32_MAX): *row_max gets the row's max (NaN ignored), *threshold a key such that
 *        keys >= it are the top-k set (ties kept), and *out views that set in index order (in
 *        sv). Returns false, the same in every thread, when the candidates do not fit (ties, or
 *        k near kMaxSurvivors); the caller then searches the row another way.
 */
template <typename T>
__device__ bool StreamTopK(const T* row, int64_t vocab, int64_t k, StreamScratch& st, SurvivorScratch& sv,
                           RadixScratch& rs, unsigned& parity, float* row_max, uint32_t* threshold,
                           Slice<float, T>* out) {
  constexpr int kVec = device::kVecSize<T>;
  constexpr int kLoads = kStreamLoads<T>, kElems = kLoads * kVec;  // a thread's elements per chunk: one bit each
  static_assert(kElems <= 32, "a chunk's elements as the bits of a uint32");
  using Vec = AlignedVector<T, kVec>;
  const int64_t num_vecs = vocab / kVec, chunk = int64_t{kLoads} * blockDim.x;
  if (threadIdx.x == 0) st.count = 0;
  __syncthreads();
  CandidateBuffer buf{st.values, st.index, &st.count, kStreamCapacity};
  float thread_max = -INFINITY;
  uint32_t bound = 0;  // candidates: Key >= bound (0: every element)
  // Offers the elements of `offer` (bit e: element(e); a superset of those at or above the
  // bound, which it tests) to the buffer. One barrier when all fit and the buffer stays at most
  // half full; otherwise compactions (raising the bound), and the elements the full buffer
  // refused are offered again. Block-uniform.
  auto offer_all = [&]<int kN>(auto&& element, uint32_t offer) {
    for (;;) {
      const float bound_value = KeyThresholdValue(bound);
      uint32_t left = 0;
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        // Most steps hold no candidate in any lane: a vote skips them.
        if (!__any_sync(kFullMask, offer >> e & 1u)) continue;
        float x;
        uint32_t i;
        element(e, &x, &i);
        if (!buf.append((offer >> e & 1u) && AtOrAbove(x, bound_value, bound), x, i)) left |= 1u << e;
      }
      // The largest count a warp saw is the count: the barrier's OR tells every thread alike.
      if (!__syncthreads_or(left != 0 || buf.high > kStreamCapacity / 2)) return true;
      if (!CompactCandidates<T>(k, &bound, st, sv, rs, parity)) return false;
      buf.high = 0;
      offer = left;
    }
  };
  for (int64_t c0 = 0; c0 < num_vecs; c0 += chunk) {
    Vec in[kLoads];
    const int64_t v0 = c0 + threadIdx.x;  // vector j of this thread: v0 + j * blockDim.x
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      if (v0 + j * blockDim.x < num_vecs) in[j].load(row, v0 + j * blockDim.x);
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      if (v0 + j * blockDim.x >= num_vecs) break;
#pragma unroll
      for (int e = 0; e < kVec; ++e) thread_max = fmaxf(thread_max, device::to_float(in[j][e]));
    }
    // The first bound: the k-th largest of the first chunk's thread maxima, each an element.
    if (c0 == 0) bound = KthLargestThreadMax(thread_max, k, rs);
    // The chunk's elements at or above the bound by a float compare (NaN too: offer_all tests
    // its key).
    const float bound_value = KeyThresholdValue(bound);
    uint32_t hits = 0;
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      if (v0 + j * blockDim.x >= num_vecs) break;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float x = device::to_float(in[j][e]);
        hits |= static_cast<uint32_t>(x >= bound_value || x != x) << (j * kVec + e);
      }
    }
    auto element = [&](int e, float* x, uint32_t* i) {
      const int j = e / kVec;
      *x = device::to_float(in[j][e % kVec]);
      *i = static_cast<uint32_t>((v0 + j * blockDim.x) * kVec + e % kVec);
    };
    if (!offer_all.template operator()<kElems>(element, hits)) return false;
  }
  // The last vocab % kVec elements, one a thread.
  if (num_vecs * kVec < vocab) {
    const int64_t tail = num_vecs * kVec + threadIdx.x;
    const float tail_x = tail < vocab ? device::to_float(row[tail]) : -INFINITY;
    thread_max = fmaxf(thread_max, tail_x);
    auto element = [&](int, float* x, uint32_t* i) {
      *x = tail_x;
      *i = static_cast<uint32_t>(tail);
    };
    if (!offer_all.template operator()<1>(element, tail < vocab ? 1u : 0u)) return false;
  }
  *row_max = device::block_reduce_max(thread_max);
  // The top-k set among the candidates (every offer ended at a barrier), ranked by index.
  if (!CompactCandidates<T>(k, &bound, st, sv, rs, parity)) return false;
  const uint32_t n = st.count;
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    const uint32_t mine = st.index[i];
    uint32_t rank = 0;
    for (uint32_t j = 0; j < n; ++j) rank += st.index[j] < mine;
    sv.values[rank] = st.values[i];
    sv.index[rank] = mine;
  }
  __syncthreads();
  *threshold = bound;
  *out = {sv.values, 0, static_cast<int64_t>(n), sv.index};
  return true;
}

template <typename T, bool kStream>
__global__ void __launch_bounds__(1024, 1)  // blocks of up to 1024 threads: at most 64 registers
    TopKTopPKernel(int64_t* __restrict__ out, const T* __restrict__ logits, int64_t vocab,
                   int64_t stride, int64_t slice_len, bool in_smem,
                   const float* __restrict__ uniforms, const int64_t* __restrict__ top_k,
                   const float* __restrict__ top_p) {
  extern __shared__ __align__(16) unsigned char slice_smem[];
  __shared__ ClusterScratch cs;
  __shared__ RadixScratch rs;
  __shared__ SampleScratch ss;
  __shared__ SurvivorScratch sv;
  Parities par;
  device::pdl_wait_primary();
  const int64_t b = blockIdx.x / device::cluster_size();
  const T* row = logits + b * stride;
  // Invalid per-row values are clamped here (the host cannot check device data without a sync).
  const int64_t k = top_k[b];
  const float p = fminf(fmaxf(top_p[b], 0.0f), 1.0f);
  const float u = fminf(fmaxf(uniforms[b], 0.0f), 0x1.fffffep-1f);
  const bool top_k_on = k > 0 && k < vocab;
  if constexpr (kStream) {
    // One block a row, read once. Rows without top-k, unaligned rows and rows whose candidates
    // do not fit take the search below, over the row in global memory (slice_len = vocab).
    __shared__ StreamScratch st;
    if (top_k_on && vocab <= UINT32_MAX && device::is_aligned<16>(row)) {
      float row_max;
      uint32_t threshold;
      Slice<float, T> top;
      if (StreamTopK(row, vocab, k, st, sv, rs, par.radix, &row_max, &threshold, &top)) {
        TopPThenSample<false>(top, threshold, p, u, [row_max](float v) { return ExpWeight(v, row_max); }, cs, rs,
                              ss, par, out + b);
        device::pdl_launch_dependents();
        return;
      }
      __syncthreads();  // the search below reuses the scratch
    }
  }
  float thread_max;
  const Slice<T> s = LoadSlice(row, vocab, slice_len, reinterpret_cast<T*>(slice_smem), in_smem, &thread_max);

  // The row max and the floor of the top-k set (0: none) in one cluster reduction.
  const uint32_t bound = top_k_on ? KthLargestThreadMax(thread_max, k, rs) : 0u;
  const MaxAndFloor mf = device::cluster_all_reduce(MaxAndFloor{device::block_reduce_max(thread_max), bound},
                                                    MaxAndFloorOp{}, cs.max_floor, par.max_floor);
  const float row_max = mf.max;
  const uint32_t floor = mf.floor;
  auto weight = [row_max](float v) { return ExpWeight(v, row_max); };

  // Block 0 gathers the candidates into its slice's shared memory (no longer needed) and
  // finishes the row alone: no cluster barrier per radix pass, and the other blocks leave
  // early, so that their SMs take the next rows.
  const int64_t capacity =
      in_smem && vocab <= UINT32_MAX ? SliceSmemBytes<T>(slice_len, kMinGatherBytes) / 8 : 0;
  float* gathered_values = reinterpret_cast<float*>(slice_smem);
  Slice<float, T> candidates;
  if (!kStream && floor != 0 && GatherCandidates(s, floor, slice_len, capacity, sv, gathered_values,
                                     reinterpret_cast<uint32_t*>(gathered_values + capacity), &candidates)) {
    if (device::cluster_rank() == 0) {
      device::cluster_wait();  // every block's candidates have landed here
      const uint32_t threshold =
          max(floor, RadixSelect<false, false>(candidates, floor, CountNeed{k}, weight, rs, par.radix).threshold);
      TopPThenSample<false>(candidates, threshold, p, u, weight, cs, rs, ss, par, out + b);
    }
    device::pdl_launch_dependents();
    return;  // no block reads another's shared memory any more
  }
  // Otherwise every block searches its slice, the floor skipping most of it.
  uint32_t threshold = 0;  // tokens with Key(logit) >= threshold are kept
  if (top_k_on) threshold = max(floor, RadixSelect<false>(s, floor, CountNeed{k}, weight, rs, par.radix).threshold);
  Slice<float, T> survivors;
  if (threshold != 0 && CompactSurvivors(s, threshold, sv, &survivors) <= kMaxSurvivors) {
    TopPThenSample<true>(survivors, threshold, p, u, weight, cs, rs, ss, par, out + b);
  } else {
    TopPThenSample<true>(s, threshold, p, u, weight, cs, rs, ss, par, out + b);
  }
  device::cluster_wait();  // peers may still read this block's shared memory (SampleIndex arrived)
  device::pdl_launch_dependents();
}

template <typename T>
__global__ void __launch_bounds__(1024, 1)
    MinPKernel(int64_t* __restrict__ out, const T* __restrict__ probs, int64_t vocab,
               int64_t stride, int64_t slice_len, bool in_smem, const float* __restrict__ uniforms,
               const float* __restrict__ min_p) {
  extern __shared__ __align__(16) unsigned char slice_smem[];
  __shared__ ClusterScratch cs;
  __shared__ SampleScratch ss;
  Parities par;
  device::pdl_wait_primary();
  const int64_t b = blockIdx.x / device::cluster_size();
  float thread_max;
  const Slice<T> s = LoadSlice(probs + b * stride, vocab, slice_len,
                               reinterpret_cast<T*>(slice_smem), in_smem, &thread_max);
  const float max_p = ClusterMax(thread_max, cs, par);
  const float threshold = fminf(fmaxf(min_p[b], 0.0f), 1.0f) * max_p;
  const float u = fminf(fmaxf(uniforms[b], 0.0f), 0x1.fffffep-1f);
  const float scale = 0x1p31f / max_p;  // weights relative to the max: the top token is 2^31
  SampleIndex<true>(
      s, u,
      [&](T x) {
        const float v = device::to_float(x);
        return v >= threshold ? ProbWeight(v, scale) : 0u;
      },
      out + b, ss, par.sample);
  device::cluster_wait();  // peers may still read this block's shared memory (SampleIndex arrived)
  device::pdl_launch_dependents();
}

// ----------------------------------------------------------------------------- filters

/*! \brief The probability filters and the logit mask (outputs a [batch, vocab] tensor). */
enum class Filter { kTopKMaskLogits, kTopKRenormProbs, kTopPRenormProbs };

// Writes f(x) for every element of the slice to dst[0, n), 16 bytes at a time when dst is aligned.
template <typename T, typename Fn>
__device__ __forceinline__ void WriteSlice(T* dst, const Slice<T>& s, Fn&& f) {
  constexpr int kVec = device::kVecSize<T>;
  int64_t start = 0;
  if (device::is_aligned<16>(dst) && device::is_aligned<16>(s.data)) {
    using Vec = AlignedVector<T, kVec>;
    for (int64_t v = threadIdx.x; v < s.n / kVec; v += blockDim.x) {
      Vec a;
      a.load(s.data, v);
#pragma unroll
      for (int k = 0; k < kVec; ++k) a[k] = f(a[k]);
      a.store(dst, v);
    }
    start = s.n / kVec * kVec;
  }
  for (int64_t i = start + threadIdx.x; i < s.n; i += blockDim.x) dst[i] = f(s.data[i]);
}

/*!
 * \brief out[b] = the filtered row b of `in` (contiguous [batch, vocab]):
 *  - kTopKMaskLogits: logits below the k-th largest become -inf;
 *  - kTopKRenormProbs: probs below the k-th largest become 0, the rest are divided by their sum;
 *  - kTopPRenormProbs: probs outside the smallest descending prefix with mass >= top_p of the
 *    row's mass (ties kept) become 0, the rest are divided by their sum.
 * k <= 0 or >= vocab keeps every token; top_p is clamped to [0, 1] (0 keeps the top token).
 */
template <typename T, Filter kFilter>
__global__ void __launch_bounds__(1024, 1)
    FilterKernel(T* __restrict__ out, const T* __restrict__ in, int64_t vocab, int64_t stride,
                 int64_t slice_len, bool in_smem, const int64_t* __restrict__ top_k,
                 const float* __restrict__ top_p) {
  extern __shared__ __align__(16) unsigned char slice_smem[];
  __shared__ ClusterScratch cs;
  __shared__ RadixScratch rs;
  Parities par;
  device::pdl_wait_primary();
  const int64_t b = blockIdx.x / device::cluster_size();
  float thread_max;
  const Slice<T> s = LoadSlice(in + b * stride, vocab, slice_len, reinterpret_cast<T*>(slice_smem),
                               in_smem, &thread_max);
  // The mask needs no max; the renorms weigh probabilities against it (the top token: 2^31).
  const float row_max = kFilter == Filter::kTopKMaskLogits ? 1.0f : ClusterMax(thread_max, cs, par);
  const float scale = 0x1p31f / row_max;
  auto weight = [scale](float p) { return ProbWeight(p, scale); };
  uint32_t threshold = 0;  // tokens with Key(x) >= threshold are kept
  bool kept_known = false;  // a top-p search also sums the kept mass
  uint64_t kept = 0;
  if constexpr (kFilter == Filter::kTopPRenormProbs) {
    const float p = fminf(fmaxf(top_p[b], 0.0f), 1.0f);
    if (p < 1.0f) {
      const Selection nucleus = RadixSelect<true>(s, 0u, TopPNeed{p}, weight, rs, par.radix);
      threshold = nucleus.threshold;
      kept = nucleus.kept;
      kept_known = true;
    }
  } else {
    const int64_t k = top_k[b];
    if (k > 0 && k < vocab) threshold = RadixSelect<false>(s, 0u, CountNeed{k}, weight, rs, par.radix).threshold;
  }
  T* dst = out + b * vocab + s.begin;
  if constexpr (kFilter == Filter::kTopKMaskLogits) {
    const T masked = device::from_float<T>(-INFINITY);
    WriteSlice(dst, s, [&](T x) { return Key(device::to_float(x)) >= threshold ? x : masked; });
  } else {
    if (!kept_known) {
      ForEachValue(s, [&](float p) { kept += Key(p) >= threshold ? weight(p) : 0u; });
      kept = ClusterSum(kept, cs, par);
    }
    // p / (sum of kept p) = p * scale / kept; a row with nothing kept is written as zeros.
    const float factor = kept > 0 ? static_cast<float>(static_cast<double>(scale) / static_cast<double>(kept)) : 0.0f;
    WriteSlice(dst, s, [&](T x) {
      const float p = device::to_float(x);
      return device::from_float<T>(Key(p) >= threshold ? p * factor : 0.0f);
    });
  }
  device::cluster_sync();  // peers may still read this block's shared memory
  device::pdl_launch_dependents();
}

// ----------------------------------------------------------------------------- launch plan

// Shared memory a slice may take: two blocks' slices and scratch still fit an SM's shared memory.
inline constexpr int64_t kSliceBytes = 96 * 1024;

// Blocks of kNarrowThreads where a grid of more blocks than SMs has clusters of at least
// kNarrowCluster and slices of at most narrow_max_slice_bytes (0: never): three such blocks fit
// an SM's registers where two of 512 threads (64 registers) did, and clusters of 4 and 8 find
// room sooner. min_p gains with any slice; the filters only where three slices fit an SM's
// shared memory (RESULTS.md, "256-thread blocks for min_p and the filters").
inline constexpr unsigned kNarrowThreads = 256, kNarrowCluster = 4;
inline constexpr int64_t kThreeSlicesBytes = 72 * 1024;

// The plan of kKernel: slices of whole 16-byte vectors, copied into shared memory when they fit
// kSliceBytes (copy_slices); few_passes: see plan_row_cluster.
template <auto kKernel>
inline host::RowClusterPlan PlanRows(const sampling::SampleArgs& a, int64_t elem_bytes, bool copy_slices,
                                     bool few_passes = false, int64_t narrow_max_slice_bytes = 0) {
  host::RowClusterPlan plan = host::plan_row_cluster<kKernel>(a.batch, a.vocab, elem_bytes, device::kVecBytes,
                                                              kSliceBytes, copy_slices, a.device.device_id, few_passes);
  plan.fits = plan.fits && copy_slices;
  if (plan.cluster >= kNarrowCluster && plan.slice * elem_bytes <= narrow_max_slice_bytes &&
      a.batch * plan.cluster > host::MultiProcessorCount(a.device.device_id)) {
    plan.threads = kNarrowThreads;
  }
  return plan;
}

// One cluster per row: kKernel(out, rows, vocab, stride, plan.slice, extra...), with at least
// kMinSmem bytes of dynamic shared memory when slices are copied; nothing for an empty batch.
template <auto kKernel, int64_t kMinSmem = 0, typename Out, typename T, typename... Extra>
inline void LaunchRows(const sampling::SampleArgs& a, const host::RowClusterPlan& plan, Out* out, const T* rows,
                       Extra... extra) {
  if (a.batch == 0) return;
  const size_t smem = plan.fits ? static_cast<size_t>(SliceSmemBytes<T>(plan.slice, kMinSmem)) : 0;
  if (plan.fits) host::AllowDynamicSmem<kKernel>(a.device.device_id, std::max(kSliceBytes, kMinSmem));
  host::LaunchKernel(dim3(static_cast<unsigned>(a.batch) * plan.cluster), dim3(plan.threads), a.device, smem)
      .enable_pdl(true)
      .cluster(plan.cluster)(kKernel, out, rows, a.vocab, a.stride, plan.slice, extra...);
}

// A filter op: verifies, plans and launches FilterKernel<T, kFilter> (param: top_k or top_p).
template <Filter kFilter, typename P>
inline void LaunchFilter(const char* op, const char* in_name, const char* param_name, tvm::ffi::TensorView out,
                         tvm::ffi::TensorView in, tvm::ffi::TensorView param) {
  using host::data_ptr;
  const auto a = sampling::VerifyFilter<kDLCUDA, P>(op, in_name, param_name, out, in, param);
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    constexpr auto kernel = FilterKernel<T, kFilter>;
    // top_k_mask_logits: the top-k search's count passes, then the write (RESULTS.md, "clusters
    // of 16 for few-pass ops").
    const auto plan = PlanRows<kernel>(a, sizeof(T), true, kFilter == Filter::kTopKMaskLogits, kThreeSlicesBytes);
    const int64_t* top_k = nullptr;
    const float* top_p = nullptr;
    if constexpr (kFilter == Filter::kTopPRenormProbs) {
      top_p = data_ptr<const float>(param);
    } else {
      top_k = data_ptr<const int64_t>(param);
    }
    LaunchRows<kernel>(a, plan, data_ptr<T>(out), data_ptr<const T>(in), plan.fits,
               top_k, top_p);
  });
}

}  // namespace sampling_detail

/*! \brief out[b] = argmax(logits[b]) (first index on ties; a NaN wins, like torch.argmax). */
inline void greedy_sample(tvm::ffi::TensorView out, tvm::ffi::TensorView logits) {
  using host::data_ptr;
  const auto a = mllm_kernel::sampling::VerifyGreedySample<kDLCUDA>(out, logits);
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    constexpr auto kernel = sampling_detail::GreedyKernel<T>;
    const auto plan = sampling_detail::PlanRows<kernel>(a, sizeof(T), false, true);
    sampling_detail::LaunchRows<kernel>(a, plan, data_ptr<int64_t>(out), data_ptr<const T>(logits));
  });
}

/*!
 * \brief Sample from softmax(logits) restricted by top-k then top-p (rules in sampling.cpp).
 * \param top_k int64 [batch]; <= 0 disables. \param top_p float32 [batch] in (0, 1] (values
 *        outside are clamped: no host check of device data). \param uniforms float32 [batch].
 */
inline void top_k_top_p_sample(tvm::ffi::TensorView out, tvm::ffi::TensorView logits,
                               tvm::ffi::TensorView uniforms, tvm::ffi::TensorView top_k,
                               tvm::ffi::TensorView top_p) {
  using host::data_ptr;
  const auto a =
      mllm_kernel::sampling::VerifyTopKTopPSample<kDLCUDA>(out, logits, uniforms, top_k, top_p);
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    using namespace sampling_detail;
    const auto* params = data_ptr<const float>(uniforms);
    // One block a row, each read once (StreamTopK; slice_len = vocab).
    if (StreamRows(a.batch, a.vocab, sizeof(T), host::MultiProcessorCount(a.device.device_id))) {
      constexpr auto kernel = TopKTopPKernel<T, true>;
      host::LaunchKernel(dim3(static_cast<unsigned>(a.batch)), dim3(kStreamThreads), a.device)
          .enable_pdl(true)(kernel, data_ptr<int64_t>(out), data_ptr<const T>(logits), a.vocab, a.stride, a.vocab,
                            false, params, data_ptr<const int64_t>(top_k), data_ptr<const float>(top_p));
    } else {
      constexpr auto kernel = TopKTopPKernel<T, false>;
      const auto plan = PlanRows<kernel>(a, sizeof(T), true);
      LaunchRows<kernel, kMinGatherBytes>(a, plan, data_ptr<int64_t>(out), data_ptr<const T>(logits), plan.fits,
                                          params, data_ptr<const int64_t>(top_k), data_ptr<const float>(top_p));
    }
  });
}

/*!
 * \brief Sample from probs restricted to p >= min_p * max(p), renormalized.
 * \param min_p float32 [batch] in [0, 1] (clamped). \param uniforms float32 [batch].
 */
inline void min_p_sample(tvm::ffi::TensorView out, tvm::ffi::TensorView probs,
                         tvm::ffi::TensorView uniforms, tvm::ffi::TensorView min_p) {
  using host::data_ptr;
  const auto a = mllm_kernel::sampling::VerifyMinPSample<kDLCUDA>(out, probs, uniforms, min_p);
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    constexpr auto kernel = sampling_detail::MinPKernel<T>;
    const auto plan = sampling_detail::PlanRows<kernel>(a, sizeof(T), true, false, sampling_detail::kSliceBytes);
    sampling_detail::LaunchRows<kernel>(a, plan, data_ptr<int64_t>(out), data_ptr<const T>(probs),
                                plan.fits, data_ptr<const float>(uniforms),
                                data_ptr<const float>(min_p));
  });
}

/*! \brief out = logits with every logit below the row's k-th largest set to -inf (ties kept);
 *  top_k int64 [batch], <= 0 or >= vocab keeps the row. */
inline void top_k_mask_logits(tvm::ffi::TensorView out, tvm::ffi::TensorView logits, tvm::ffi::TensorView top_k) {
  sampling_detail::LaunchFilter<sampling_detail::Filter::kTopKMaskLogits, int64_t>("top_k_mask_logits", "logits",
                                                                                    "top_k", out, logits, top_k);
}

/*! \brief out = probs kept by top-k (ties kept), divided by their sum; the others 0. */
inline void top_k_renorm_probs(tvm::ffi::TensorView out, tvm::ffi::TensorView probs, tvm::ffi::TensorView top_k) {
  sampling_detail::LaunchFilter<sampling_detail::Filter::kTopKRenormProbs, int64_t>("top_k_renorm_probs", "probs",
                                                                                     "top_k", out, probs, top_k);
}

/*! \brief out = probs of the smallest descending prefix with mass >= top_p of the row's mass (ties
 *  kept), divided by their sum; the others 0. top_p float32 [batch], clamped to [0, 1]. */
inline void top_p_renorm_probs(tvm::ffi::TensorView out, tvm::ffi::TensorView probs, tvm::ffi::TensorView top_p) {
  sampling_detail::LaunchFilter<sampling_detail::Filter::kTopPRenormProbs, float>("top_p_renorm_probs", "probs",
                                                                                   "top_p", out, probs, top_p);
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_SAMPLING_CUH_
