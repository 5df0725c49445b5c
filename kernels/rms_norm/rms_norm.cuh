/*!
 * \file kernels/rms_norm/rms_norm.cuh
 * \brief CUDA rms_norm and fused_add_rms_norm (float32/float16/bfloat16) on torch's stream.
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * mllm_kernel::gpu::rms_norm and mllm_kernel::gpu::fused_add_rms_norm.
 *
 * Fast path (hidden % (16 / sizeof(T)) == 0, 16-byte aligned pointers and row strides): the
 * row-block scheme of mllm_kernel/row_block.cuh. blockDim.x threads (up to 512) own one row,
 * each holding kVecs (1-8) 16-byte vectors of it in registers across the block reduction, so x
 * is read once and out written once. Small rows share a block (blockDim.y rows). Otherwise
 * (unaligned, odd hidden, or rows over 4096 vectors: bf16 > 32K, fp32 > 16K elements) a scalar
 * kernel reads the row twice (the second read mostly hits L2).
 */
#ifndef MLLM_KERNEL_KERNELS_RMS_NORM_CUH_
#define MLLM_KERNEL_KERNELS_RMS_NORM_CUH_

#include <mllm_kernel/row_block.cuh>
#include <mllm_kernel/utils.cuh>

#include "rms_norm.hpp"

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <type_traits>

namespace mllm_kernel::gpu {

namespace rms_norm_detail {

using device::bf16_t;
using device::fp16_t;

// 1 / sqrt(mean + eps); a mean + eps of 0 (an all-zero row with eps = 0) is taken as FLT_MIN, so
// the row stays zeros (0 * finite) instead of 0 * inf = NaN. A NaN mean stays NaN. The select is
// on rsqrtf's input (a data select, no branch around it): this is the 1-row latency path.
__device__ __forceinline__ float InvRms(float sum_sq, int64_t d, float eps) {
  const float ms = sum_sq / static_cast<float>(d) + eps;
  return rsqrtf(ms == 0.0f ? FLT_MIN : ms);
}

// Vectors a thread whose weights fit registers beside the row: more (over 2 of 16-bit or 4 of
// float32 data) spill under the 64-register launch bound.
template <typename T>
inline constexpr int kEarlyWeightVecs = sizeof(T) == 4 ? 4 : 2;

// The weight vectors of a thread's kVecs row vectors. Up to kEarlyWeightVecs are loaded with the
// row, so that their latency is not paid again after the row's reduction (the latency of a
// few-row call); more are loaded when used.
template <typename T, int kVecs>
struct WeightVecs {
  using Vec = device::AlignedVector<T, device::kVecSize<T>>;
  static constexpr bool kEarly = kVecs <= kEarlyWeightVecs<T>;
  Vec early[kEarly ? kVecs : 1];
  Vec late;
  __device__ __forceinline__ void prefetch(const T* w, int k, int j) {
    if constexpr (kEarly) early[k].load(w, j);
  }
  __device__ __forceinline__ const Vec& get(const T* w, int k, int j) {
    if constexpr (kEarly) {
      return early[k];
    } else {
      late.load(w, j);
      return late;
    }
  }
};

// Whether fused_add_rms_norm's thread loads all of its x and residual vectors before it stores
// any: float32 in the latency plans (up to kEarlyWeightVecs vectors, where both fit registers).
// Measured on an H200 (benchmarks/TUNING.md): float32 0.99-1.19x (geomean 1.09); bfloat16 lost
// 0-7%, so 16-bit data keep the interleaved loop. More vectors spill under the launch bound.
template <typename T, int kVecs>
inline constexpr bool kLoadsFirst = sizeof(T) == 4 && kVecs <= kEarlyWeightVecs<T>;

// Grids that fit one wave take the vectors a thread whose weights load with the row (2 of 16-bit
// data, 4 of float32), with as many threads as the row needs: at most 1024 threads an SM, as two
// 512-thread blocks or four of 256 (measured on an H100: benchmarks/RESULTS.md, "rms_norm,
// fused_add_rms_norm and apply_rope at decode shapes").
template <typename T>
inline host::RowWaveOptions WaveOptions(DLDevice dev) {
  return {kEarlyWeightVecs<T>, int64_t{1024} * host::MultiProcessorCount(dev.device_id)};
}

// Block size bound of the scalar kernels (host::plan_rows gives them at most 256 threads).
inline constexpr int kScalarThreads = 256;

// Vector path of rms_norm (row_block.cuh): the row stays in registers between the passes.
template <typename T, int kVecs>
__global__ void __launch_bounds__(device::kRowVecMaxThreads, device::kRowVecMinBlocks<T, kVecs>)
    RmsNormVecKernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ w,
                     int64_t rows, int64_t d, int64_t out_stride, int64_t x_stride, float eps) {
  using Vec = device::AlignedVector<T, device::kVecSize<T>>;
  constexpr int N = Vec::kSize;
  const int nvec = static_cast<int>(d / N);
  device::pdl_wait_primary();  // x may be written by the previous kernel (PDL launch)
  device::for_each_row_group(rows, [&](int64_t row, bool active) {
    Vec v[kVecs];
    WeightVecs<T, kVecs> wv;
    float sum_sq = 0.0f;
    device::for_each_row_vec<kVecs>(nvec, active, [&](int k, int j) {
      v[k].load(x + row * x_stride, j);
      wv.prefetch(w, k, j);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const float f = device::to_float(v[k][i]);
        sum_sq += f * f;
      }
    });
    const float inv = InvRms(device::row_reduce<false>(sum_sq), d, eps);
    device::for_each_row_vec<kVecs>(nvec, active, [&](int k, int j) {
      const Vec& wk = wv.get(w, k, j);
      Vec o;
#pragma unroll
      for (int i = 0; i < N; ++i) o[i] = device::from_float<T>(device::to_float(v[k][i]) * inv * device::to_float(wk[i]));
      o.store(out + row * out_stride, j);
    });
  });
  device::pdl_launch_dependents();
}

// Vector path of fused_add_rms_norm: the rounded sum stays in registers between the passes.
template <typename T, int kVecs>
__global__ void __launch_bounds__(device::kRowVecMaxThreads, device::kRowVecMinBlocks<T, kVecs>)
    FusedAddRmsNormVecKernel(T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ w,
                             int64_t rows, int64_t d, int64_t x_stride, int64_t r_stride,
                             float eps) {
  using Vec = device::AlignedVector<T, device::kVecSize<T>>;
  constexpr int N = Vec::kSize;
  const int nvec = static_cast<int>(d / N);
  device::pdl_wait_primary();
  device::for_each_row_group(rows, [&](int64_t row, bool active) {
    Vec s[kVecs];
    WeightVecs<T, kVecs> wv;
    float sum_sq = 0.0f;
    auto add = [&](int k, int j, const Vec& xk) {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        // Round first: the norm is of the residual as stored.
        s[k][i] = device::from_float<T>(device::to_float(xk[i]) + device::to_float(s[k][i]));
        const float f = device::to_float(s[k][i]);
        sum_sq += f * f;
      }
      s[k].store(residual + row * r_stride, j);
    };
    if constexpr (kLoadsFirst<T, kVecs>) {
      // Every load before the first store: with vector k's store in between, the compiler
      // keeps vector k + 1's loads behind it, a memory round trip per vector (SASS).
      Vec xv[kVecs];
      device::for_each_row_vec<kVecs>(nvec, active, [&](int k, int j) {
        xv[k].load(x + row * x_stride, j);
        s[k].load(residual + row * r_stride, j);
        wv.prefetch(w, k, j);
      });
      device::for_each_row_vec<kVecs>(nvec, active, [&](int k, int j) { add(k, j, xv[k]); });
    } else {
      device::for_each_row_vec<kVecs>(nvec, active, [&](int k, int j) {
        Vec xk;
        xk.load(x + row * x_stride, j);
        s[k].load(residual + row * r_stride, j);
        wv.prefetch(w, k, j);
        add(k, j, xk);
      });
    }
    const float inv = InvRms(device::row_reduce<false>(sum_sq), d, eps);
    device::for_each_row_vec<kVecs>(nvec, active, [&](int k, int j) {
      const Vec& wk = wv.get(w, k, j);
      Vec o;
#pragma unroll
      for (int i = 0; i < N; ++i) o[i] = device::from_float<T>(device::to_float(s[k][i]) * inv * device::to_float(wk[i]));
      o.store(x + row * x_stride, j);
    });
  });
  device::pdl_launch_dependents();
}

// Scalar path (any alignment, any hidden): two reads of the row, one write.
template <typename T>
__global__ void __launch_bounds__(kScalarThreads)
    RmsNormScalarKernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ w,
                        int64_t rows, int64_t d, int64_t out_stride, int64_t x_stride, float eps) {
  device::pdl_wait_primary();
  device::for_each_row_group(rows, [&](int64_t row, bool active) {
    float sum_sq = 0.0f;
    if (active) {
      for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        const float f = device::to_float(x[row * x_stride + j]);
        sum_sq += f * f;
      }
    }
    const float inv = InvRms(device::row_reduce<false>(sum_sq), d, eps);
    if (active) {
      for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        out[row * out_stride + j] = device::from_float<T>(device::to_float(x[row * x_stride + j]) * inv * device::to_float(w[j]));
      }
    }
  });
  device::pdl_launch_dependents();
}

// Scalar fused path: each thread re-reads only the residual elements it wrote itself.
template <typename T>
__global__ void __launch_bounds__(kScalarThreads)
    FusedAddRmsNormScalarKernel(T* __restrict__ x, T* __restrict__ residual,
                                const T* __restrict__ w, int64_t rows, int64_t d,
                                int64_t x_stride, int64_t r_stride, float eps) {
  device::pdl_wait_primary();
  device::for_each_row_group(rows, [&](int64_t row, bool active) {
    float sum_sq = 0.0f;
    if (active) {
      for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        const T s = device::from_float<T>(device::to_float(x[row * x_stride + j]) + device::to_float(residual[row * r_stride + j]));
        residual[row * r_stride + j] = s;
        const float f = device::to_float(s);
        sum_sq += f * f;
      }
    }
    const float inv = InvRms(device::row_reduce<false>(sum_sq), d, eps);
    if (active) {
      for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        x[row * x_stride + j] =
            device::from_float<T>(device::to_float(residual[row * r_stride + j]) * inv * device::to_float(w[j]));
      }
    }
  });
  device::pdl_launch_dependents();
}

template <typename T>
void LaunchRmsNorm(T* out, const T* x, const T* w, int64_t rows, int64_t d, int64_t out_stride,
                   int64_t x_stride, float eps, DLDevice dev) {
  constexpr int N = device::kVecSize<T>;
  const bool vec_ok = d % N == 0 && out_stride % N == 0 && x_stride % N == 0 &&
                      device::is_aligned<16>(out) && device::is_aligned<16>(x) &&
                      device::is_aligned<16>(w);
  const host::RowPlan plan = host::plan_rows(rows, d, N, vec_ok, WaveOptions<T>(dev));
  const auto kernel =
      plan.kvecs == 0 ? RmsNormScalarKernel<T>
                      : host::pick_row_kernel(plan, RmsNormVecKernel<T, 1>, RmsNormVecKernel<T, 2>,
                                              RmsNormVecKernel<T, 4>, RmsNormVecKernel<T, 8>);
  host::LaunchKernel(dim3(plan.blocks), dim3(plan.threads_x, plan.rows_per_block), dev)
      .enable_pdl(true)(kernel, out, x, w, rows, d, out_stride, x_stride, eps);
}

template <typename T>
void LaunchFusedAddRmsNorm(T* x, T* residual, const T* w, int64_t rows, int64_t d,
                           int64_t x_stride, int64_t r_stride, float eps, DLDevice dev) {
  constexpr int N = device::kVecSize<T>;
  const bool vec_ok = d % N == 0 && x_stride % N == 0 && r_stride % N == 0 &&
                      device::is_aligned<16>(x) && device::is_aligned<16>(residual) &&
                      device::is_aligned<16>(w);
  const host::RowPlan plan = host::plan_rows(rows, d, N, vec_ok, WaveOptions<T>(dev));
  const auto kernel = plan.kvecs == 0
                          ? FusedAddRmsNormScalarKernel<T>
                          : host::pick_row_kernel(plan, FusedAddRmsNormVecKernel<T, 1>,
                                                  FusedAddRmsNormVecKernel<T, 2>,
                                                  FusedAddRmsNormVecKernel<T, 4>,
                                                  FusedAddRmsNormVecKernel<T, 8>);
  host::LaunchKernel(dim3(plan.blocks), dim3(plan.threads_x, plan.rows_per_block), dev)
      .enable_pdl(true)(kernel, x, residual, w, rows, d, x_stride, r_stride, eps);
}

}  // namespace rms_norm_detail

/*! \brief out = x / sqrt(mean(x^2) + eps) * weight per row (contract: rms_norm.hpp). */
inline void rms_norm(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView weight,
                     double eps) {
  using host::data_ptr;
  const auto a = mllm_kernel::rms_norm::VerifyRmsNorm<kDLCUDA>(out, x, weight, eps);
  if (a.empty()) return;  // a zero-block grid is a launch error
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    rms_norm_detail::LaunchRmsNorm(data_ptr<T>(out), data_ptr<const T>(x), data_ptr<const T>(weight),
                                   a.rows, a.hidden, a.a_stride, a.b_stride, a.eps, a.device);
  });
}

/*! \brief In place: residual = round(x + residual); x = rms_norm(residual) * weight. */
inline void fused_add_rms_norm(tvm::ffi::TensorView x, tvm::ffi::TensorView residual,
                               tvm::ffi::TensorView weight, double eps) {
  using host::data_ptr;
  const auto a = mllm_kernel::rms_norm::VerifyFusedAddRmsNorm<kDLCUDA>(x, residual, weight, eps);
  if (a.empty()) return;
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    rms_norm_detail::LaunchFusedAddRmsNorm(data_ptr<T>(x), data_ptr<T>(residual),
                                           data_ptr<const T>(weight), a.rows, a.hidden, a.a_stride,
                                           a.b_stride, a.eps, a.device);
  });
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_RMS_NORM_CUH_
