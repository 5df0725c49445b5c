/*!
 * \file kernels/softmax/softmax.cuh
 * \brief CUDA softmax / log_softmax over the last dim (float32, float16, bfloat16) on torch's
 *        current stream; float32 accumulation.
 *
 * Rows of up to 4096 16-byte vectors (bf16 32K, fp32 16K), 16-byte aligned: the row-block
 * scheme of mllm_kernel/row_block.cuh, the row held in registers across a max and a sum
 * reduction. Longer or unaligned rows: a row is split over a cluster of blocks (sm_90; few rows
 * still fill the GPU) or one block (before), mllm_kernel/row_cluster.cuh; pass 1 reads the
 * block's slice once and keeps a per-thread online (max, sum of exp), combined by two block
 * reductions and then over the cluster, and pass 2 writes the output; when the slice fits in
 * shared memory pass 1 also copies it there, so global memory is read once and written once. Exponentials are exp2_approx with log2(e) folded into the
 * scale (the error it adds is far below float32 rounding of the probabilities that matter).
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * mllm_kernel::gpu::softmax and mllm_kernel::gpu::log_softmax.
 */
#ifndef MLLM_KERNEL_KERNELS_SOFTMAX_CUH_
#define MLLM_KERNEL_KERNELS_SOFTMAX_CUH_

#include <mllm_kernel/row_block.cuh>
#include <mllm_kernel/row_cluster.cuh>
#include <mllm_kernel/utils.cuh>

#include "softmax.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace mllm_kernel::gpu {

namespace softmax_detail {

using device::AlignedVector;

constexpr float kLog2e = 1.4426950408889634f;


// exp((x - max) / temperature) as 2^((x/2 - max/2) * scale2), scale2 = 2 log2(e) / temperature
// (softmax.hpp, kMaxInvTemperature): the subtraction comes first, so the exponent is exactly 0
// at the max and <= 0 elsewhere for any temperature; the halves keep it finite for any logits.
__device__ __forceinline__ float ExpShifted(float x, float half_max, float scale2) {
  return device::exp2_approx(fmaf(x, 0.5f, -half_max) * scale2);
}

// Adds a chunk of raw logits (chunk_max its max) to a running (max, sum of exp((v - max) / T)).
// One rescale per chunk instead of per element.
__device__ __forceinline__ void OnlineUpdate(float& run_max, float& run_sum, float chunk_max,
                                             const float* v, int n, float scale2) {
  const float new_max = fmaxf(run_max, chunk_max);
  if (new_max == -INFINITY) return;  // everything so far is -inf: contributes nothing
  const float half_max = 0.5f * new_max;
  float s = run_max == -INFINITY ? 0.0f : run_sum * ExpShifted(run_max, half_max, scale2);
  for (int k = 0; k < n; ++k) s += ExpShifted(v[k], half_max, scale2);
  run_max = new_max;
  run_sum = s;
}

// (max, sum of exp((x - max) / T)) of two parts of a row, combined.
struct MaxSum {
  float max, sum;
};

// kVec: elements per access (16 bytes / sizeof(T), or 1 for the scalar path).
// kCache: keep the slice in dynamic shared memory between the two passes.
// A row is split over a cluster (row_cluster.cuh): block r handles elements [r * slice, ...).
template <typename T, int kVec, bool kCache, bool kLog>
__global__ void SoftmaxKernel(T* __restrict__ out, const T* __restrict__ x, int64_t vocab,
                              int64_t x_stride, int64_t slice, float inv_temp) {
  using Vec = AlignedVector<T, kVec>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ MaxSum block_parts[2];
  Vec* cache = reinterpret_cast<Vec*>(smem_raw);
  const int64_t row = blockIdx.x / device::cluster_size();
  const auto [begin, n] = device::row_slice(vocab, slice);
  const T* x_row = x + row * x_stride + begin;
  T* out_row = out + row * vocab + begin;
  const int64_t num_vecs = n / kVec;  // the launcher makes vocab and slice whole vectors

  const float scale2 = inv_temp * (2.0f * kLog2e);  // see ExpShifted
  device::pdl_wait_primary();  // x may be written by the previous kernel (PDL launch)
  float run_max = -INFINITY, run_sum = 0.0f;
  // Four loads a thread in flight (one at a time left grids of many rows at 65% of copy).
  device::for_each_vec_in_flight<4, Vec>(x_row, num_vecs, [&](int64_t v, const Vec& in) {
    if constexpr (kCache) cache[v] = in;
    float f[kVec];
    float chunk_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      f[k] = device::to_float(in[k]);
      chunk_max = fmaxf(chunk_max, f[k]);
    }
    OnlineUpdate(run_max, run_sum, chunk_max, f, kVec, scale2);
  });
  float row_max = device::block_reduce_max(run_max);  // of x; inv_temp > 0
  const float part = (run_max == -INFINITY) ? 0.0f : run_sum * ExpShifted(run_max, 0.5f * row_max, scale2);
  float sum = device::block_reduce_sum(part);  // syncs: the cache is complete after it
  if (device::cluster_size() > 1) {  // the blocks' (max, sum) in rank order
    unsigned parity = 0;
    const MaxSum all = device::cluster_all_reduce(
        MaxSum{row_max, sum},
        [&](MaxSum a, MaxSum b) {
          const float m = fmaxf(a.max, b.max);
          if (m == -INFINITY) return MaxSum{m, 0.0f};
          const float sa = a.max == -INFINITY ? 0.0f : a.sum * ExpShifted(a.max, 0.5f * m, scale2);
          const float sb = b.max == -INFINITY ? 0.0f : b.sum * ExpShifted(b.max, 0.5f * m, scale2);
          return MaxSum{m, sa + sb};
        },
        block_parts, parity);
    row_max = all.max;
    sum = all.sum;
  }
  const float half_max = 0.5f * row_max;
  const float log_sum = logf(sum);
  const float inv_sum = 1.0f / sum;
  const float inv_temp2 = 2.0f * inv_temp;

  for (int64_t v = threadIdx.x; v < num_vecs; v += blockDim.x) {
    Vec in;
    if constexpr (kCache) {
      in = cache[v];
    } else {
      in.load(x_row, v);
    }
    Vec o;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float z = fmaf(device::to_float(in[k]), 0.5f, -half_max);  // (x - max) / 2 <= 0
      o[k] = device::from_float<T>(kLog ? z * inv_temp2 - log_sum : device::exp2_approx(z * scale2) * inv_sum);
    }
    o.store(out_row, v);
  }
  if (device::cluster_size() > 1) device::cluster_sync();  // peers may still read block_parts
  device::pdl_launch_dependents();
}

// Row-block path: thread x of a row holds vectors x, x + blockDim.x, ... of it in registers.
// inv_temp > 0, so the max of x also gives the max of x * inv_temp; z = x - max is scaled after
// the subtraction, so the max's exponent is exactly 0 for any (finite, capped) inv_temp.
template <typename T, int kVecs, bool kLog>
__global__ void __launch_bounds__(device::kRowVecMaxThreads, device::kRowVecMinBlocks<T, kVecs>)
    SoftmaxRowKernel(T* __restrict__ out, const T* __restrict__ x, int64_t rows, int64_t vocab,
                     int64_t x_stride, float inv_temp) {
  using Vec = AlignedVector<T, device::kVecSize<T>>;
  constexpr int N = Vec::kSize;
  const int nvec = static_cast<int>(vocab / N);
  const float scale2 = inv_temp * (2.0f * kLog2e);  // see ExpShifted
  const float inv_temp2 = 2.0f * inv_temp;
  device::pdl_wait_primary();  // x may be written by the previous kernel (PDL launch)
  device::for_each_row_group(rows, [&](int64_t row, bool active) {
    Vec v[kVecs];
    float local_max = -INFINITY;
    device::for_each_row_vec<kVecs>(nvec, active, [&](int k, int j) {
      v[k].load(x + row * x_stride, j);
#pragma unroll
      for (int i = 0; i < N; ++i) local_max = fmaxf(local_max, device::to_float(v[k][i]));
    });
    const float row_max = device::row_reduce<true>(local_max);
    const float half_max = 0.5f * row_max;
    float local_sum = 0.0f;
    device::for_each_row_vec<kVecs>(nvec, active, [&](int k, int) {
#pragma unroll
      for (int i = 0; i < N; ++i) local_sum += ExpShifted(device::to_float(v[k][i]), half_max, scale2);
    });
    const float sum = device::row_reduce<false>(local_sum);
    const float log_sum = logf(sum), inv_sum = 1.0f / sum;
    device::for_each_row_vec<kVecs>(nvec, active, [&](int k, int j) {
      Vec o;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        // (x - max) / 2 <= 0; all -inf rows: NaN, as torch.
        const float z = fmaf(device::to_float(v[k][i]), 0.5f, -half_max);
        o[i] = device::from_float<T>(kLog ? z * inv_temp2 - log_sum
                                          : device::exp2_approx(z * scale2) * inv_sum);
      }
      o.store(out + row * vocab, j);
    });
  });
  device::pdl_launch_dependents();
}

// Shared memory a slice may take once the grid has more blocks than SMs: three blocks then share
// an SM, so one block's loads overlap another's reductions and writes. A grid of one wave keeps
// the largest slices (fewer blocks a row: cheaper cluster reductions).
inline constexpr int64_t kWideGridSliceBytes = 96 * 1024;

template <typename T, int kVec, bool kLog>
void LaunchTyped(DLDevice dev, T* out, const T* x, int64_t rows, int64_t vocab, int64_t stride,
                 float inv_temp) {
  host::RuntimeCheck(rows <= 0x7fffffff, "softmax: too many rows (", rows, ") for one grid");
  // Leave room for the reductions' static shared memory (<= 1 KiB).
  const int64_t max_slice_bytes = host::MaxSharedMemoryPerBlock(dev.device_id) - 1024;
  constexpr auto kCopied = SoftmaxKernel<T, kVec, true, kLog>;  // slices copied to shared memory
  auto plan_for = [&](int64_t slice_bytes) {
    return host::plan_row_cluster<kCopied>(rows, vocab, sizeof(T), kVec, slice_bytes, true, dev.device_id);
  };
  host::RowClusterPlan plan = plan_for(max_slice_bytes);
  if (rows * plan.cluster > host::MultiProcessorCount(dev.device_id)) {
    // Only where the smaller slices are still copied (clusters of up to 16: sm_90).
    if (const host::RowClusterPlan wide = plan_for(kWideGridSliceBytes); wide.fits) plan = wide;
  }
  if (plan.fits) host::AllowDynamicSmem<kCopied>(dev.device_id, max_slice_bytes);
  const int threads = static_cast<int>(plan.threads);
  const dim3 grid(static_cast<unsigned>(rows) * plan.cluster);
  const size_t smem = plan.fits ? static_cast<size_t>(plan.slice) * sizeof(T) : 0;
  host::LaunchKernel(grid, dim3(threads), dev, smem)
      .enable_pdl(true)
      .cluster(plan.cluster)(plan.fits ? kCopied : SoftmaxKernel<T, kVec, false, kLog>, out, x, vocab, stride,
                             plan.slice, inv_temp);
}

template <typename T, bool kLog>
void Dispatch(DLDevice dev, tvm::ffi::TensorView out, tvm::ffi::TensorView x, int64_t rows,
              int64_t vocab, int64_t stride, float inv_temp) {
  T* o = host::data_ptr<T>(out);
  const T* in = host::data_ptr<const T>(x);
  constexpr int kVec = device::kVecSize<T>;
  // Every row start must be 16-byte aligned: base pointers, vocab (out rows) and stride.
  const bool vectorized = device::is_aligned<16>(o) && device::is_aligned<16>(in) &&
                          vocab % kVec == 0 && stride % kVec == 0;
  const host::RowPlan plan = host::plan_rows(rows, vocab, kVec, vectorized);
  if (plan.kvecs != 0) {
    const auto kernel = host::pick_row_kernel(
        plan, SoftmaxRowKernel<T, 1, kLog>, SoftmaxRowKernel<T, 2, kLog>,
        SoftmaxRowKernel<T, 4, kLog>, SoftmaxRowKernel<T, 8, kLog>);
    host::LaunchKernel(dim3(plan.blocks), dim3(plan.threads_x, plan.rows_per_block), dev)
        .enable_pdl(true)(kernel, o, in, rows, vocab, stride, inv_temp);
  } else if (vectorized) {
    LaunchTyped<T, kVec, kLog>(dev, o, in, rows, vocab, stride, inv_temp);
  } else {
    LaunchTyped<T, 1, kLog>(dev, o, in, rows, vocab, stride, inv_temp);
  }
}

template <bool kLog>
void Run(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView x, float inv_temp) {
  const auto a = mllm_kernel::softmax::VerifySoftmax<kDLCUDA>(op, out, x);
  if (a.empty()) return;  // a zero-block grid is a launch error
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    Dispatch<T, kLog>(a.device, out, x, a.rows, a.vocab, a.x_stride, inv_temp);
  });
}

}  // namespace softmax_detail

/*! \brief out = softmax(x / temperature) over the last dim; temperature > 0. */
inline void softmax(tvm::ffi::TensorView out, tvm::ffi::TensorView x, double temperature) {
  softmax_detail::Run<false>("softmax", out, x, mllm_kernel::softmax::InvTemperature(temperature));
}

/*! \brief out = log_softmax(x) over the last dim. */
inline void log_softmax(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  softmax_detail::Run<true>("log_softmax", out, x, 1.0f);
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_SOFTMAX_CUH_
