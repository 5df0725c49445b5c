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

#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.cuh>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace mllm_kernel::gpu {

namespace activation_detail {

using device::bf16_t;
using device::fp16_t;

enum Act : int { kSilu = 0, kGelu = 1, kGeluTanh = 2 };

template <int kAct, bool kHalfPrecision = false>
__device__ __forceinline__ float Activate(float x) {
  if constexpr (kAct == kSilu) {
    // Fast intrinsics (a few ulp; the IEEE division's slow path costs registers and a spill):
    // exp(-x) = inf for very negative x gives x * rcp(inf) = -0.
    return __fdividef(x, 1.0f + __expf(-x));
  } else if constexpr (kAct == kGelu) {
    // x * Phi(x). normcdff computes Phi via erfc (no cancellation in the x < 0 tail), but for
    // 16-bit data it made the kernel compute-bound (~62% of copy bandwidth on an H100). There,
    // above x = -3, Phi comes from Abramowitz & Stegun 7.1.26: erfc(z) ~ poly(t) exp(-z^2) with
    // t = 1 / (1 + p z), |error| <= 1.5e-7, written so neither sign of x cancels; far below
    // fp16/bf16 rounding. float32 data keeps normcdff.
    if constexpr (kHalfPrecision) {
      if (x > -3.0f) {
        const float z = fabsf(x) * 0.7071067811865476f;
        const float t = __fdividef(1.0f, 1.0f + 0.3275911f * z);
        const float poly =
            t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
        const float half_erfc = 0.5f * poly * __expf(-z * z);  // Phi(-|x|)
        return x * (x < 0.0f ? half_erfc : 1.0f - half_erfc);
      }
    }
    return x * normcdff(x);
  } else {
    const float inner = 0.7978845608028654f * x * (1.0f + 0.044715f * x * x);
    if constexpr (kHalfPrecision) {
      // 0.5 x (1 + tanh(u)) = x * sigmoid(2u): one fast exp and divide, like silu.
      return __fdividef(x, 1.0f + __expf(-2.0f * inner));
    }
    return 0.5f * x * (1.0f + tanhf(inner));
  }
}

// out[r, j] = act(x[r, j]) * x[r, d + j]. kVectorized: j indexes 16-byte vectors (needs d,
// both strides and both pointers aligned to the vector); otherwise elements.
template <typename T, int kAct, bool kVectorized>
__global__ void __launch_bounds__(256)
    ActAndMulKernel(T* __restrict__ out, const T* __restrict__ x, int64_t rows, int64_t d,
                    int64_t out_stride, int64_t x_stride) {
  using Vec = device::AlignedVector<T, device::kVecSize<T>>;
  constexpr int N = kVectorized ? Vec::kSize : 1;
  const int64_t per_row = d / N;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t col_step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  device::pdl_wait_primary();  // x may be written by the previous kernel (PDL launch)
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows;
       r += row_step) {
    const T* gate = x + r * x_stride;
    const T* up = gate + d;
    T* o = out + r * out_stride;
    for (int64_t j = col0; j < per_row; j += col_step) {
      if constexpr (kVectorized) {
        Vec g, u, res;
        g.load(gate, j);
        u.load(up, j);
#pragma unroll
        for (int i = 0; i < N; ++i) res[i] = device::from_float<T>(Activate<kAct, sizeof(T) == 2>(device::to_float(g[i])) * device::to_float(u[i]));
        res.store(o, j);
      } else {
        o[j] = device::from_float<T>(Activate<kAct, sizeof(T) == 2>(device::to_float(gate[j])) * device::to_float(up[j]));
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
  // 256-thread blocks; short rows put several rows in one block so no lanes idle.
  constexpr int64_t kThreads = 256;
  const int64_t threads_x =
      std::min<int64_t>(kThreads, host::div_ceil(per_row, device::kWarpThreads) *
                                      device::kWarpThreads);
  const int64_t rows_per_block = kThreads / threads_x;
  // gridDim.y is limited to 65535; both grid-stride loops cover what the caps leave out.
  constexpr int64_t kMaxBlocksX = int64_t{1} << 30, kMaxBlocksY = 65535;
  const dim3 grid(static_cast<unsigned>(std::min(host::div_ceil(per_row, threads_x), kMaxBlocksX)),
                  static_cast<unsigned>(std::min(host::div_ceil(rows, rows_per_block), kMaxBlocksY)));
  const dim3 block(static_cast<unsigned>(threads_x), static_cast<unsigned>(rows_per_block));
  const auto kernel =
      vectorized ? ActAndMulKernel<T, kAct, true> : ActAndMulKernel<T, kAct, false>;
  host::LaunchKernel(grid, block, dev).enable_pdl(true)(kernel, out, x, rows, d, out_stride,
                                                           x_stride);
}

template <int kAct>
void ActAndMul(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize rows{"num_tokens"}, d{"d"}, out_stride{"out_row_stride"}, x_stride{"x_row_stride"};
  SymbolicDType dtype{"dtype"};
  SymbolicDevice device{"device"};
  TensorMatcher({rows, d})
      .for_op(op)
      .with_dtype<float, fp16_t, bf16_t>(dtype)
      .with_device<kDLCUDA>(device)
      .with_strides({out_stride, 1})
      .verify(out, "out");
  SymbolicSize two_d{"2*d"};
  two_d.set_value(2 * d.unwrap());
  TensorMatcher({rows, two_d})
      .for_op(op)
      .with_dtype(dtype)
      .with_device(device)
      .with_strides({x_stride, 1})
      .verify(x, "x");
  const int64_t n = rows.unwrap(), half = d.unwrap();
  if (n == 0 || half == 0) return;  // a zero-block grid is a launch error
  const int64_t os = out_stride.unwrap(), xs = x_stride.unwrap();
  ValueCheck(n == 1 || os >= half, op, ": argument 'out': row stride ", os,
             " is smaller than d=", half, ": output rows would overlap");
  const DLDevice dev = device.unwrap();
  if (dtype.is<float>()) {
    Launch<float, kAct>(data_ptr<float>(out), data_ptr<const float>(x), n, half, os, xs, dev);
  } else if (dtype.is<fp16_t>()) {
    Launch<fp16_t, kAct>(data_ptr<fp16_t>(out), data_ptr<const fp16_t>(x), n, half, os, xs, dev);
  } else {
    Launch<bf16_t, kAct>(data_ptr<bf16_t>(out), data_ptr<const bf16_t>(x), n, half, os, xs, dev);
  }
}

}  // namespace activation_detail

/*! \brief out = silu(x[:, :d]) * x[:, d:]; out [rows, d], x [rows, 2d], same CUDA device. */
inline void silu_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  activation_detail::ActAndMul<activation_detail::kSilu>("silu_and_mul", out, x);
}

/*! \brief out = gelu(x[:, :d]) * x[:, d:] with the exact (erf) gelu. */
inline void gelu_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  activation_detail::ActAndMul<activation_detail::kGelu>("gelu_and_mul", out, x);
}

/*! \brief out = gelu(x[:, :d]) * x[:, d:] with the tanh approximation of gelu. */
inline void gelu_tanh_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  activation_detail::ActAndMul<activation_detail::kGeluTanh>("gelu_and_mul", out, x);
}

}  // namespace mllm_kernel::gpu

#endif  // MLLM_KERNEL_KERNELS_ACTIVATION_CUH_
