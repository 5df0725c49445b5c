/*!
 * \file kernels/speculative/speculative.cuh
 * \brief CUDA speculative-decoding verification: chain rejection sampling and tree verification,
 * on torch's current stream.
 *
 * One block per request (grid-stride over the batch). Thread 0 runs the accept tests (n reads);
 * the block then draws the correction or bonus token from one row in two steps:
 *  1. each warp sums the integer weights (speculative.hpp) of its 128-token chunks into shared
 *     memory (coalesced: lane l reads tokens l, l + 32, ... of the chunk);
 *  2. a block scan over the chunk sums finds the chunk where the running sum passes the draw's
 *     target, and one warp scans that chunk alone.
 * So the row is read once, plus one chunk. Integer sums make the token independent of the
 * order of additions: CPU and CUDA agree exactly.
 *
 * Tree verification walks each request's tree, one block per request: at each node on the path the
 * block takes the row's argmax (greedy) or a draw with the node's uniform, and thread 0 looks for
 * the first child, in sibling order, that carries that token. Only the rows of the path are read,
 * but one after the other; so when the batch's node rows are few for the GPU (<= 4 per SM), one
 * kernel first picks at every node at once (a block per row) and a second one walks the picks. Links out of range, a node reached twice on the path or a sibling chain
 * longer than the tree (a cycle), and row indices out of range are recorded in `error` and end
 * the walk there (never read, never followed).
 *
 * A draft id outside [0, vocab) is never read: that position counts as rejected and the id is
 * recorded in `error` (int64 [3]: {flag, flattened index, id}). Uniforms are clamped to [0, 1).
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * mllm_kernel::gpu::{chain_speculative_sampling, tree_speculative_verify} (arguments: speculative.hpp).
 */
#ifndef MLLM_KERNEL_KERNELS_SPECULATIVE_CUH_
#define MLLM_KERNEL_KERNELS_SPECULATIVE_CUH_

#include <mllm_kernel/utils.cuh>

#include "speculative.hpp"

#include <algorithm>
#include <cstdint>

namespace mllm_kernel::gpu {

namespace speculative_detail {

using speculative::ChainArgs;

constexpr int kThreads = 1024;  // more loads in flight for one row: 2x faster than 512 at batch 1 (H100)
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 128;       // tokens per chunk sum (4 per lane of a warp)
constexpr int kMaxChunks = 2048;  // 16 KiB of chunk sums; longer rows get wider chunks

__device__ __forceinline__ uint64_t WarpInclusiveScan(uint64_t v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t up = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += up;
  }
  return v;
}

/*! \brief Exclusive block scan of one value per thread; also returns the block total. */
__device__ __forceinline__ uint64_t BlockExclusiveScan(uint64_t v, uint64_t* warp_totals, uint64_t& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint64_t inclusive = WarpInclusiveScan(v);
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const uint64_t t = lane < kWarps ? warp_totals[lane] : 0;
    const uint64_t scanned = WarpInclusiveScan(t);
    if (lane < kWarps) warp_totals[lane] = scanned - t;  // exclusive prefix of each warp
    if (lane == 31) warp_totals[kWarps] = scanned;
  }
  __syncthreads();
  total = warp_totals[kWarps];
  const uint64_t result = warp_totals[warp] + inclusive - v;
  __syncthreads();  // warp_totals is reused by the next scan
  return result;
}

/*! \brief A row's draw weights: the residual max(0, p - q) of float32 rows (q != nullptr), or p. */
struct RowWeights {
  const float* p;
  const float* q;
  __device__ __forceinline__ uint64_t operator()(int64_t i) const {
    return q != nullptr ? speculative::ResidualWeight(p[i], q[i]) : speculative::Weight(p[i]);
  }
};

/*! \brief The draw weights of a probability row of any float type. */
template <typename T>
struct ProbWeights {
  const T* p;
  __device__ __forceinline__ uint64_t operator()(int64_t i) const { return speculative::Weight(device::to_float(p[i])); }
};

/*!
 * \brief The first token whose running weight exceeds DrawTarget(u, total); -1 if the row has
 * no weight. Called by the whole block.
 */
template <typename Weights>
__device__ int64_t BlockDraw(const Weights& w, int64_t vocab, int64_t chunk, int64_t num_chunks, float u,
                             uint64_t* chunk_sums, uint64_t* warp_totals, int64_t* found) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (chunk == kChunk) {  // 1. chunk sums; 4 chunks per warp step: 16 loads in flight per lane
    for (int64_t c0 = warp * 4; c0 < num_chunks; c0 += kWarps * 4) {
      uint64_t sum[4] = {0, 0, 0, 0};
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int64_t i = c0 * kChunk + lane + 32 * j;
        if (i < vocab) sum[j / 4] += w(i);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        sum[k] = device::warp_reduce_sum(sum[k]);
        if (lane == 0 && c0 + k < num_chunks) chunk_sums[c0 + k] = sum[k];
      }
    }
  } else {  // rows over kMaxChunks * kChunk tokens: wider chunks
    for (int64_t c = warp; c < num_chunks; c += kWarps) {
      const int64_t first = c * chunk, last = min(first + chunk, vocab);
      uint64_t sum = 0;
      for (int64_t i = first + lane; i < last; i += 32) sum += w(i);
      sum = device::warp_reduce_sum(sum);
      if (lane == 0) chunk_sums[c] = sum;
    }
  }
  __syncthreads();
  // 2. each thread owns a contiguous run of chunks; a block scan orders the runs.
  const int64_t per_thread = (num_chunks + kThreads - 1) / kThreads;
  const int64_t c0 = threadIdx.x * per_thread, c1 = min(c0 + per_thread, num_chunks);
  uint64_t mine = 0;
  for (int64_t c = c0; c < c1; ++c) mine += chunk_sums[c];
  uint64_t total;
  uint64_t before = BlockExclusiveScan(mine, warp_totals, total);
  if (total == 0) return -1;  // uniform across the block: every thread returns
  const uint64_t target = speculative::DrawTarget(u, total);
  if (threadIdx.x == 0) *found = -1;
  __syncthreads();
  if (before <= target && target < before + mine) {  // exactly one thread
    int64_t c = c0;
    while (before + chunk_sums[c] <= target) before += chunk_sums[c++];
    found[0] = c;
    warp_totals[0] = before;  // the running sum before chunk c
  }
  __syncthreads();
  const int64_t c = found[0];
  const uint64_t start = warp_totals[0];
  __syncthreads();  // everyone read found / warp_totals before they are reused
  if (warp == 0) {  // 3. one warp scans chunk c, 32 tokens at a time
    uint64_t running = start;
    const int64_t last = min((c + 1) * chunk, vocab);
    for (int64_t base = c * chunk; base < last; base += 32) {
      const int64_t i = base + lane;
      const uint64_t inclusive = running + WarpInclusiveScan(i < last ? w(i) : 0);
      const unsigned passed = __ballot_sync(0xffffffffu, i < last && inclusive > target);
      if (passed != 0) {
        if (lane == 0) found[0] = base + __ffs(passed) - 1;
        break;
      }
      running = __shfl_sync(0xffffffffu, inclusive, 31);
    }
  }
  __syncthreads();
  const int64_t token = found[0];
  __syncthreads();
  return token;
}

template <typename IdT, typename AccT>
__global__ void __launch_bounds__(kThreads)
    ChainKernel(IdT* __restrict__ out_tokens, AccT* __restrict__ out_accepted, const float* __restrict__ draft,
                const IdT* __restrict__ ids, const float* __restrict__ target, const float* __restrict__ uniforms,
                ChainArgs a, int64_t chunk, int64_t num_chunks, int64_t* error) {
  __shared__ uint64_t chunk_sums[kMaxChunks];
  __shared__ uint64_t warp_totals[kWarps + 1];
  __shared__ int64_t shared[2];  // the accepted count, then BlockDraw's result slot
  device::pdl_wait_primary();  // the probs come from the previous kernels
  const int64_t n = a.num_draft;
  for (int64_t b = blockIdx.x; b < a.batch; b += gridDim.x) {
    const float* u = uniforms + b * (n + 1);
    IdT* out = out_tokens + b * (n + 1);
    if (threadIdx.x == 0) {
      int64_t j = 0;
      for (; j < n; ++j) {
        const auto x = static_cast<int64_t>(ids[b * a.ids_stride_b + j * a.ids_stride_n]);
        if (x < 0 || x >= a.vocab) {  // never read: record, and count the position as rejected
          device::record_error(error, b * n + j, x);
          break;
        }
        const float p = target[b * a.target_stride_b + j * a.target_stride_n + x];
        const float q = draft[b * a.draft_stride_b + j * a.draft_stride_n + x];
        if (!speculative::Accepts(u[j], p, q)) break;
        out[j] = static_cast<IdT>(x);
      }
      shared[0] = j;
    }
    __syncthreads();
    const int64_t j = shared[0];
    const float* p_row = target + b * a.target_stride_b + j * a.target_stride_n;
    int64_t token = -1;
    if (j < n) {
      const RowWeights residual{p_row, draft + b * a.draft_stride_b + j * a.draft_stride_n};
      token = BlockDraw(residual, a.vocab, chunk, num_chunks, u[n], chunk_sums, warp_totals, &shared[1]);
    }
    if (token < 0) {
      token = BlockDraw(RowWeights{p_row, nullptr}, a.vocab, chunk, num_chunks, u[n], chunk_sums, warp_totals,
                        &shared[1]);
    }
    for (int64_t k = j + threadIdx.x; k <= n; k += kThreads) {
      out[k] = static_cast<IdT>(k == j ? (token < 0 ? 0 : token) : -1);
    }
    if (threadIdx.x == 0) out_accepted[b] = static_cast<AccT>(j);
    __syncthreads();  // shared[0] is rewritten for the next request
  }
  device::pdl_launch_dependents();
}

/*! \brief argmax of row[begin, end) (device::argmax_better's order), as an index. Called by the
 *  whole block of kBlock threads; `partial` holds kBlock / 32 + 1 candidates. */
template <int kBlock, typename T>
__device__ int64_t BlockArgMax(const T* row, int64_t begin, int64_t end, device::ArgMax* partial) {
  constexpr int kInFlight = 8;  // loads issued before any is compared: one row needs the bandwidth
  constexpr int kBlockWarps = kBlock / 32;
  device::ArgMax best{-INFINITY, INT64_MAX};
  for (int64_t base = begin + threadIdx.x; base < end; base += kInFlight * kBlock) {
    float v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int64_t i = base + k * kBlock;
      v[k] = i < end ? device::to_float(row[i]) : -INFINITY;
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {  // in index order, so ties keep the first
      const int64_t i = base + k * kBlock;
      if (i < end && device::argmax_better(v[k], i, best.v, best.i)) best = {v[k], i};
    }
  }
  best = device::warp_argmax(best);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = device::warp_argmax(lane < kBlockWarps ? partial[lane] : device::ArgMax{-INFINITY, INT64_MAX});
    if (lane == 0) partial[kBlockWarps] = best;
  }
  __syncthreads();
  const int64_t result = partial[kBlockWarps].i;
  __syncthreads();
  return result;
}

/*! \brief The token the target picks at a node: its row's argmax (greedy) or a draw with the
 *  node's uniform (0 for a row without mass). Called by the whole block. */
template <typename T>
__device__ int64_t BlockPick(const T* row, const speculative::TreeArgs& a, float u, int64_t chunk,
                             int64_t num_chunks, uint64_t* chunk_sums, uint64_t* warp_totals,
                             device::ArgMax* partial, int64_t* found) {
  if (a.greedy) return BlockArgMax<kThreads>(row, 0, a.vocab, partial);
  const int64_t token = BlockDraw(ProbWeights<T>{row}, a.vocab, chunk, num_chunks, u, chunk_sums, warp_totals, found);
  return token < 0 ? 0 : token;
}

// The pick-every-node-first plan. Greedy rows are split into `slices` parts, so that even a
// batch of one tree fills the GPU; the walk takes the best of a node's slice maxima. A draw needs
// the whole row's running sum, so it keeps one block per row. A row index out of range gives -1.
constexpr int kSliceThreads = 256;
constexpr int kMaxSlices = speculative::kTreePicksPerNode;  // the workspace's picks per node
static_assert(kMaxSlices <= 32, "the walk combines a node's slice picks in one warp");

template <typename T, typename IdT>
__global__ void __launch_bounds__(kSliceThreads)
    ArgMaxSliceKernel(int64_t* __restrict__ picks, const IdT* __restrict__ retrieve, const T* __restrict__ target,
                      speculative::TreeArgs a, int64_t slices, int64_t width) {
  __shared__ device::ArgMax partial[kSliceThreads / 32 + 1];
  device::pdl_wait_primary();
  for (int64_t work = blockIdx.x; work < a.batch * a.num_nodes * slices; work += gridDim.x) {
    const int64_t node = work / slices, slice = work % slices;
    const auto row = static_cast<int64_t>(retrieve[node]);
    int64_t token = -1;
    if (row >= 0 && row < a.target_rows) {
      const int64_t begin = slice * width, end = min(begin + width, a.vocab);
      token = begin < end ? BlockArgMax<kSliceThreads>(target + row * a.target_stride, begin, end, partial) : -1;
    }
    if (threadIdx.x == 0) picks[node * kMaxSlices + slice] = token;
  }
  device::pdl_launch_dependents();
}

template <typename T, typename IdT>
__global__ void __launch_bounds__(kThreads)
    DrawKernel(int64_t* __restrict__ picks, const IdT* __restrict__ retrieve, const T* __restrict__ target,
               const float* __restrict__ uniforms, speculative::TreeArgs a, int64_t chunk, int64_t num_chunks) {
  __shared__ uint64_t chunk_sums[kMaxChunks];
  __shared__ uint64_t warp_totals[kWarps + 1];
  __shared__ device::ArgMax partial[kWarps + 1];
  __shared__ int64_t found;
  device::pdl_wait_primary();
  for (int64_t node = blockIdx.x; node < a.batch * a.num_nodes; node += gridDim.x) {
    const auto row = static_cast<int64_t>(retrieve[node]);
    int64_t token = -1;
    if (row >= 0 && row < a.target_rows) {
      token = BlockPick(target + row * a.target_stride, a, uniforms[node], chunk, num_chunks, chunk_sums,
                        warp_totals, partial, &found);
    }
    if (threadIdx.x == 0) picks[node * kMaxSlices] = token;
  }
  device::pdl_launch_dependents();
}

/*! \brief In the walk of the pick-first plan: a node's token from its slice picks (one warp). */
template <typename T>
__device__ int64_t PickedToken(const int64_t* picks, const T* row, int64_t slices) {
  const int lane = threadIdx.x & 31;
  const int64_t i = lane < slices ? picks[lane] : -1;
  device::ArgMax best{-INFINITY, INT64_MAX};
  if (i >= 0) best = {device::to_float(row[i]), i};
  return device::warp_argmax(best).i;
}

/*!
 * \brief Thread 0's step in the tree: the first child of `cur`, in sibling order, whose token is
 * `token`, or -1. A link that is out of range or repeats a node on the path (path[0..depth]), or a
 * sibling chain longer than the tree, is recorded and ends the walk (-1).
 */
template <typename IdT>
__device__ int64_t FindChild(const IdT* candidates, const IdT* next_token, const IdT* next_sibling, int64_t cur,
                             int64_t token, const IdT* path, int64_t depth, int64_t num_nodes, int64_t base,
                             int64_t* error) {
  int64_t c = next_token[cur], from = cur;
  for (int64_t steps = 0; c != -1; ++steps) {
    bool bad = c <= 0 || c >= num_nodes || steps >= num_nodes;
    for (int64_t k = 0; !bad && k <= depth; ++k) bad = static_cast<int64_t>(path[k]) == c;
    if (bad) {
      device::record_error(error, base + from, c);
      return -1;
    }
    if (static_cast<int64_t>(candidates[c]) == token) return c;
    from = c;
    c = next_sibling[c];
  }
  return -1;
}

template <typename T, typename IdT, bool kPicked>
__global__ void __launch_bounds__(kThreads)
    TreeKernel(const int64_t* __restrict__ picks, int64_t slices, IdT* __restrict__ acc_index, IdT* __restrict__ acc_tokens, IdT* __restrict__ acc_length,
               const IdT* __restrict__ candidates, const IdT* __restrict__ retrieve, const IdT* __restrict__ next_token,
               const IdT* __restrict__ next_sibling, const T* __restrict__ target, const float* __restrict__ uniforms,
               speculative::TreeArgs a, int64_t chunk, int64_t num_chunks, int64_t* error) {
  __shared__ uint64_t chunk_sums[kMaxChunks];
  __shared__ uint64_t warp_totals[kWarps + 1];
  __shared__ device::ArgMax partial[kWarps + 1];
  __shared__ int64_t shared[2];  // the next node, then BlockDraw's result slot
  device::pdl_wait_primary();
  const int64_t d = a.num_nodes, w = a.out_width;
  for (int64_t b = blockIdx.x; b < a.batch; b += gridDim.x) {
    const int64_t base = b * d;
    IdT* index = acc_index + b * w;
    IdT* tokens = acc_tokens + b * w;
    int64_t cur = 0, depth = 0, token = -1;
    if (threadIdx.x == 0) index[0] = 0;
    while (true) {
      const auto row = static_cast<int64_t>(retrieve[base + cur]);  // the same value in every thread
      if (row < 0 || row >= a.target_rows) {
        if (threadIdx.x == 0) device::record_error(error, base + cur, row);
        token = -1;
        break;
      }
      if constexpr (kPicked) {  // one warp per request
        const int64_t* node_picks = picks + (base + cur) * kMaxSlices;
        token = a.greedy ? PickedToken(node_picks, target + row * a.target_stride, slices) : node_picks[0];
      } else {
        token = BlockPick(target + row * a.target_stride, a, a.greedy ? 0.0f : uniforms[base + cur], chunk,
                          num_chunks, chunk_sums, warp_totals, partial, &shared[1]);
      }
      if (depth + 1 >= w) break;  // the deepest position: token is the bonus
      if (threadIdx.x == 0) {  // (the walk of the parallel plan runs one warp per request)
        shared[0] = FindChild(candidates + base, next_token + base, next_sibling + base, cur, token, index, depth, d,
                              base, error);
      }
      __syncthreads();
      const int64_t next = shared[0];
      __syncthreads();
      if (next < 0) break;
      ++depth;
      if (threadIdx.x == 0) {
        index[depth] = static_cast<IdT>(next);
        tokens[depth - 1] = static_cast<IdT>(token);
      }
      cur = next;
    }
    if (threadIdx.x == 0) {
      tokens[depth] = static_cast<IdT>(token);
      for (int64_t k = depth + 1; k < w; ++k) index[k] = tokens[k] = static_cast<IdT>(-1);
      acc_length[b] = static_cast<IdT>(depth);
    }
    __syncthreads();  // shared[] is reused by the next request
  }
  device::pdl_launch_dependents();
}

/*! \brief The chunk width of BlockDraw's sums for a row of `vocab` tokens (a multiple of 32, at
 *  least 128, at most kMaxChunks chunks). */
inline int64_t DrawChunk(int64_t vocab) {
  return std::max<int64_t>(kChunk, host::div_ceil(host::div_ceil(vocab, int64_t{kMaxChunks}), 32) * 32);
}

}  // namespace speculative_detail

/*! \brief Chain speculative sampling (arguments: speculative.hpp). Asynchronous: no host sync. */
inline void chain_speculative_sampling(tvm::ffi::TensorView out_tokens, tvm::ffi::TensorView out_accepted,
                                       tvm::ffi::TensorView draft_probs, tvm::ffi::TensorView draft_token_ids,
                                       tvm::ffi::TensorView target_probs, tvm::ffi::TensorView uniforms,
                                       tvm::ffi::TensorView error) {
  using host::data_ptr;
  using namespace speculative_detail;  // NOLINT(*)
  const auto a = speculative::VerifyChain<kDLCUDA>(out_tokens, out_accepted, draft_probs, draft_token_ids,
                                                   target_probs, uniforms, error);
  if (a.empty()) return;
  const int64_t chunk = DrawChunk(a.vocab);
  const int64_t num_chunks = host::div_ceil(a.vocab, chunk);
  const int64_t grid = std::min<int64_t>(a.batch, int64_t{host::MultiProcessorCount(a.device.device_id)} * 8);
  host::DispatchIndex(a.id_dtype, [&]<typename IdT>() {
    host::DispatchIndex(a.accepted_dtype, [&]<typename AccT>() {
      host::LaunchKernel(grid, kThreads, a.device)
          .enable_pdl(true)(ChainKernel<IdT, AccT>, data_ptr<IdT>(out_tokens), data_ptr<AccT>(out_accepted),
                            data_ptr<const float>(draft_probs), data_ptr<const IdT>(draft_token_ids),
                            data_ptr<const float>(target_probs), data_ptr<const float>(uniforms), a, chunk,
                            num_chunks, data_ptr<int64_t>(error));
    });
  });
}

/*! \brief Tree verification (arguments: speculative.hpp). Asynchronous: no host sync. */
inline void tree_speculative_verify(tvm::ffi::TensorView accepted_index, tvm::ffi::TensorView accepted_tokens,
                                    tvm::ffi::TensorView accepted_length, tvm::ffi::TensorView candidates,
                                    tvm::ffi::TensorView retrieve_index, tvm::ffi::TensorView next_token,
                                    tvm::ffi::TensorView next_sibling, tvm::ffi::TensorView target,
                                    tvm::ffi::TensorView uniforms, bool greedy, tvm::ffi::TensorView workspace,
                                    tvm::ffi::TensorView error) {
  using host::data_ptr;
  using namespace speculative_detail;  // NOLINT(*)
  const auto a = speculative::VerifyTree<kDLCUDA>(accepted_index, accepted_tokens, accepted_length, candidates,
                                                  retrieve_index, next_token, next_sibling, target, uniforms, greedy,
                                                  workspace, error);
  if (a.empty()) return;
  const int64_t chunk = DrawChunk(a.vocab), num_chunks = host::div_ceil(a.vocab, chunk);
  const int64_t sms = host::MultiProcessorCount(a.device.device_id);
  // The plan, from the shapes only. A walk reads one row per level, in sequence; when every SM has
  // at most 4 node rows, picking at every node at once (then walking over the picks) is faster.
  const bool parallel = a.batch * a.num_nodes <= 4 * sms;
  // Greedy slices: about 8 blocks of 256 threads per SM in all, each slice >= 4096 tokens.
  const int64_t slices = std::clamp<int64_t>(
      std::min(host::div_ceil(8 * sms, a.batch * a.num_nodes), host::div_ceil(a.vocab, int64_t{4096})), 1,
      kMaxSlices);
  host::DispatchFloat<kDLCUDA>(a.target_dtype, [&]<typename T>() {
    host::DispatchIndex(a.id_dtype, [&]<typename IdT>() {
      const float* u = greedy ? nullptr : data_ptr<const float>(uniforms);
      const auto walk = [&](auto kernel, int threads) {
        host::LaunchKernel(std::min(a.batch, sms * 8), threads, a.device)
            .enable_pdl(true)(kernel, data_ptr<const int64_t>(workspace), slices, data_ptr<IdT>(accepted_index),
                              data_ptr<IdT>(accepted_tokens), data_ptr<IdT>(accepted_length),
                              data_ptr<const IdT>(candidates), data_ptr<const IdT>(retrieve_index),
                              data_ptr<const IdT>(next_token), data_ptr<const IdT>(next_sibling),
                              data_ptr<const T>(target), u, a, chunk, num_chunks, data_ptr<int64_t>(error));
      };
      if (!parallel) {
        walk(TreeKernel<T, IdT, false>, kThreads);
        return;
      }
      const int64_t nodes = a.batch * a.num_nodes;
      if (greedy) {
        host::LaunchKernel(std::min(nodes * slices, sms * 32), kSliceThreads, a.device)
            .enable_pdl(true)(ArgMaxSliceKernel<T, IdT>, data_ptr<int64_t>(workspace),
                              data_ptr<const IdT>(retrieve_index), data_ptr<const T>(target), a, slices,
                              host::div_ceil(a.vocab, slices));
      } else {
        host::LaunchKernel(nodes, kThreads, a.device)
            .enable_pdl(true)(DrawKernel<T, IdT>, data_ptr<int64_t>(workspace), data_ptr<const IdT>(retrieve_index),
                              data_ptr<const T>(target), u, a, chunk, num_chunks);
      }
      walk(TreeKernel<T, IdT, true>, 32);
    });
  });
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_SPECULATIVE_CUH_
