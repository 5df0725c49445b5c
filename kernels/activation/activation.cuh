/*!
 * \file kernels/activation/activation.cuh
 * \brief CUDA gated activations (float32/float16/bfloat16) on torch's current stream:
 *        out = act(x[:, :d]) * x[:, d:] with act in {silu, gelu (erf), gelu (tanh)}.
 *
 * Includable: the JIT runtime compiles a .cu wrapper that #includes this file and exports
 * mllm_kernel::gpu::{silu_and_mul, gelu_and_mul, gelu_tanh_and_mul}.
 *
 * One read of x and one write of out. 2-D grid-stride loop: x over 16-byte vectors of a row
 * (or elements when d, a stride or a pointer is not 16-byte aligned), y over rows, so no
 * per-element division is needed to find the row.
 */
#ifndef MLLM_KERNEL_KERNELS_ACTIVATION_CUH_
#define MLLM_KERNEL_KERNELS_ACTIVATION_CUH_

#include <mllm_kernel/utils.cuh>

#include "activation.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace mllm_kernel::gpu {

namespace activation_detail {

using namespace mllm_kernel::activation;  // NOLINT(*): Act, kSilu, kGelu, kGeluTanh

// ------------------------------------------------------------------------------ 16-bit data
// Results round to fp16/bf16 (relative step 2^-11 / 2^-8), so float math may err by ~1e-5.
// These kernels are instruction-bound, not memory-bound, on an H200 unless each element costs
// about 20 instructions or fewer, so they use the SFU approximations directly
// (device::exp2_approx, device::rcp_approx).

// x * sigmoid(g) = x / (1 + 2^(-g log2 e)), given minus_g_log2e. 2^+big = inf gives x * 0.
__device__ __forceinline__ float TimesSigmoid(float x, float minus_g_log2e) {
  return x * device::rcp_approx(1.0f + device::exp2_approx(minus_g_log2e));
}

// Exact GELU as x * sigmoid(g(x)) with g = logit(Phi): g(x) / x is smooth in s = x^2, so
// -log2(e) * g(x) = x * P(s) with P the degree-9 polynomial below (weighted minimax fit of
// logit(Phi) on |x| <= 6: |error in g| < 5e-6, float32 evaluation < 2.1e-5 relative error in
// the result). x > 6 uses g(6) (Phi = 1 - 1e-9 rounds to 1 either way); x < -6 takes
// GeluErfc instead (the caller branches).
inline constexpr float kGeluPolyRange = 6.0f;
__device__ __forceinline__ float GeluPoly(float x) {
  const float xc = fminf(x, kGeluPolyRange), s = xc * xc;
  float p = 2.191393882e-14f;
  p = fmaf(p, s, -4.541500774e-12f);
  p = fmaf(p, s, 4.118751258e-10f);
  p = fmaf(p, s, -2.144016678e-08f);
  p = fmaf(p, s, 7.029855768e-07f);
  p = fmaf(p, s, -1.475455382e-05f);
  p = fmaf(p, s, 1.775631611e-04f);
  p = fmaf(p, s, 4.620305968e-05f);
  p = fmaf(p, s, -1.047841062e-01f);
  p = fmaf(p, s, -2.302220391e+00f);
  return TimesSigmoid(x, xc * p);
}

// ------------------------------------------------------------------------------ any dtype
// Exact GELU through erfc, accurate to ~5e-7 relative over float32's normal range, tails
// included: Phi(-|x|) = erfc(|x| / sqrt 2) / 2 = t exp(-x^2 / 2 + p(t)) / 2 with t = 1 / (1 + |x|
// / (2 sqrt 2)) and p the Chebyshev fit of Numerical Recipes' erfcc (fractional error < 1.2e-7).
// The rounding errors of x^2 / 2 and of the exponent's sum are carried to the end, because the
// exponent reaches -100 where one float ulp (8e-6) would otherwise be the result's error.
// |x| is capped at 15, where Phi(-|x|) already underflows to 0, so x^2 stays finite.
__device__ __forceinline__ float GeluErfc(float x) {
  const float a = fminf(fabsf(x), 15.0f), z = a * 0.7071067811865476f;
  const float t = __fdividef(1.0f, 1.0f + 0.5f * z);  // denominator in [1, 6.4]
  float p = 0.17087277f;
  p = fmaf(p, t, -0.82215223f);
  p = fmaf(p, t, 1.48851587f);
  p = fmaf(p, t, -1.13520398f);
  p = fmaf(p, t, 0.27886807f);
  p = fmaf(p, t, -0.18628806f);
  p = fmaf(p, t, 0.09678418f);
  p = fmaf(p, t, 0.37409196f);
  p = fmaf(p, t, 1.00002368f);
  p = fmaf(p, t, -1.26551223f);
  const float aa = a * a, half_sq = 0.5f * aa;
  const float half_sq_err = 0.5f * fmaf(a, a, -aa);  // a^2 / 2 = half_sq + half_sq_err
  const float sum = p - half_sq, back = sum - p;        // TwoSum: p - half_sq = sum + sum_err
  const float sum_err = (p - (sum - back)) + (-half_sq - back);
  const float half_erfc = 0.5f * t * expf(sum) * (1.0f + (sum_err - half_sq_err));  // Phi(-|x|)
  return x * (x < 0.0f ? half_erfc : 1.0f - half_erfc);
}

// act(x) for one element; kHalf: the data are fp16/bf16 (see above). GELU on 16-bit data is
// done per vector in ActivateVec.
template <int kAct, bool kHalf>
__device__ __forceinline__ float Activate(float x) {
  constexpr float kLog2e = 1.4426950408889634f;
  if constexpr (kAct == kSilu) {
    if constexpr (kHalf) return TimesSigmoid(x, -kLog2e * x);
    // exp(-x) = inf for very negative x gives x * rcp(inf) = -0.
    return __fdividef(x, 1.0f + __expf(-x));
  } else if constexpr (kAct == kGelu) {
    if constexpr (kHalf) return x < -kGeluPolyRange ? GeluErfc(x) : GeluPoly(x);
    return GeluErfc(x);
  } else {
    // 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2 / pi) (x + 0.044715 x^3).
    constexpr float k1 = 2.0f * 0.7978845608028654f, k3 = k1 * 0.044715f;
    if constexpr (kHalf) return TimesSigmoid(x, -kLog2e * x * fmaf(k3, x * x, k1));
    return 0.5f * x * (1.0f + tanhf(0.5f * x * fmaf(k3, x * x, k1)));
  }
}

// out[i] = act(gate[i]) * up[i] over one vector. 16-bit GELU branches once per vector: the
// polynomial unless an element lies below -6 (rare), where every element takes GeluErfc.
template <typename T, int kAct, int N>
__device__ __forceinline__ void ActivateVec(T* out, const T* gate, const T* up) {
  constexpr bool kHalf = sizeof(T) == 2;
  float g[N];
  bool tail = false;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    g[i] = device::to_float(gate[i]);
    tail |= g[i] < -kGeluPolyRange;
  }
  if (kHalf && kAct == kGelu && tail) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = device::from_float<T>(GeluErfc(g[i]) * device::to_float(up[i]));
    return;
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float a = kAct == kGelu && kHalf ? GeluPoly(g[i]) : Activate<kAct, kHalf>(g[i]);
    out[i] = device::from_float<T>(a * device::to_float(up[i]));
  }
}

// 16-byte vectors each thread handles per row in the vector kernel on large inputs. Measured
// on an H200 (benchmarks/TUNING.md): float32 needs 4 loads of each half in flight per thread
// to reach the copy bandwidth (1 vector: 58%); for 16-bit data 1 vector is fastest (more
// costs 3-8%). Inputs under kManyVectors use 1: more threads, less latency per thread.
template <typename T>
inline constexpr int kVecsPerThread = sizeof(T) == 4 ? 4 : 1;
inline constexpr int64_t kManyVectors = int64_t{1} << 16;

// out[r, j] = act(x[r, j]) * x[r, d + j]. kVectorized: j indexes 16-byte vectors (needs d,
// both strides and both pointers aligned to the vector), U of them per thread, loaded before
// any is used; otherwise j indexes elements, one per thread.
template <typename T, int kAct, bool kVectorized, int U>
__global__ void __launch_bounds__(256)
    ActAndMulKernel(T* __restrict__ out, const T* __restrict__ x, int64_t rows, int64_t d,
                    int64_t out_stride, int64_t x_stride) {
  using Vec = device::AlignedVector<T, kVectorized ? device::kVecSize<T> : 1>;
  constexpr int N = Vec::kSize;
  const int64_t per_row = d / N;
  const int64_t chunk = int64_t{U} * blockDim.x;  // vectors of a row per block and step
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * chunk + threadIdx.x;
  const int64_t col_step = static_cast<int64_t>(gridDim.x) * chunk;
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  device::pdl_wait_primary();  // x may be written by the previous kernel (PDL launch)
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows;
       r += row_step) {
    const T* gate = x + r * x_stride;
    const T* up = gate + d;
    T* o = out + r * out_stride;
    for (int64_t j0 = col0; j0 < per_row; j0 += col_step) {
      Vec g[U], u[U];
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const int64_t j = j0 + int64_t{k} * blockDim.x;
        if (j < per_row) {
          g[k].load(gate, j);
          u[k].load(up, j);
        }
      }
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const int64_t j = j0 + int64_t{k} * blockDim.x;
        if (j < per_row) {
          Vec res;
          ActivateVec<T, kAct, N>(res.val, g[k].val, u[k].val);
          res.store(o, j);
        }
      }
    }
  }
  device::pdl_launch_dependents();
}

template <typename T, int kAct>
void Launch(T* out, const T* x, int64_t rows, int64_t d, int64_t out_stride, int64_t x_stride,
            DLDevice dev) {
  constexpr int N = device::kVecSize<T>;
  const bool vectorized = d % N == 0 && out_stride % N == 0 && x_stride % N == 0 &&
                          device::is_aligned<16>(out) && device::is_aligned<16>(x);
  const int64_t per_row = vectorized ? d / N : d;
  const int64_t per_thread =
      vectorized && rows * per_row >= kManyVectors ? kVecsPerThread<T> : 1;
  // 256-thread blocks; short rows put several rows in one block so no lanes idle.
  constexpr int64_t kThreads = 256;
  const int64_t threads_x = std::min<int64_t>(
      kThreads, host::div_ceil(host::div_ceil(per_row, per_thread), device::kWarpThreads) *
                    device::kWarpThreads);
  const int64_t rows_per_block = kThreads / threads_x;
  // gridDim.y is limited to 65535; both grid-stride loops cover what the caps leave out.
  constexpr int64_t kMaxBlocksX = int64_t{1} << 30, kMaxBlocksY = 65535;
  const dim3 grid(
      static_cast<unsigned>(std::min(host::div_ceil(per_row, threads_x * per_thread), kMaxBlocksX)),
      static_cast<unsigned>(std::min(host::div_ceil(rows, rows_per_block), kMaxBlocksY)));
  const dim3 block(static_cast<unsigned>(threads_x), static_cast<unsigned>(rows_per_block));
  constexpr int kU = kVecsPerThread<T>;
  const auto kernel = !vectorized      ? ActAndMulKernel<T, kAct, false, 1>
                      : per_thread == 1 ? ActAndMulKernel<T, kAct, true, 1>
                                        : ActAndMulKernel<T, kAct, true, kU>;
  host::LaunchKernel(grid, block, dev).enable_pdl(true)(kernel, out, x, rows, d, out_stride,
                                                           x_stride);
}

template <int kAct>
void Run(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  using host::data_ptr;
  const auto a = mllm_kernel::activation::VerifyActAndMul<kDLCUDA>(op, out, x);
  if (a.empty()) return;  // a zero-block grid is a launch error
  host::DispatchFloat<kDLCUDA>(a.dtype, [&]<typename T>() {
    Launch<T, kAct>(data_ptr<T>(out), data_ptr<const T>(x), a.rows, a.d, a.out_stride, a.x_stride,
                    a.device);
  });
}

}  // namespace activation_detail

/*! \brief out = silu(x[:, :d]) * x[:, d:]; out [rows, d], x [rows, 2d] (activation.hpp). */
inline void silu_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  activation_detail::Run<activation::kSilu>("silu_and_mul", out, x);
}

/*! \brief out = gelu(x[:, :d]) * x[:, d:] with the exact (erf) gelu. */
inline void gelu_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  activation_detail::Run<activation::kGelu>("gelu_and_mul", out, x);
}

/*! \brief out = gelu(x[:, :d]) * x[:, d:] with the tanh approximation of gelu. */
inline void gelu_tanh_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  activation_detail::Run<activation::kGeluTanh>("gelu_and_mul", out, x);
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_ACTIVATION_CUH_
