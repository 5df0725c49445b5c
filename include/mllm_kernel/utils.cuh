/*!
 * \file mllm_kernel/utils.cuh
 * \brief CUDA helpers: element types, warp/block reductions, 16-byte vector access,
 *        programmatic dependent launch (PDL) and LaunchKernel on torch's current stream.
 *
 * \code{.cpp}
 *   host::LaunchKernel(grid, block, dst.device()).enable_pdl(true)(my_kernel, out, in, n);
 * \endcode
 */
#ifndef MLLM_KERNEL_UTILS_CUH_
#define MLLM_KERNEL_UTILS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <dlpack/dlpack.h>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/extra/c_env_api.h>

#include <cxxabi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <cstdlib>
#include <memory>

namespace mllm_kernel::device {

using fp16_t = __half;
using bf16_t = __nv_bfloat16;
using fp8_e4m3_t = __nv_fp8_e4m3;
using fp8_e5m2_t = __nv_fp8_e5m2;
using fp32_t = float;

inline constexpr int kWarpThreads = 32;
inline constexpr unsigned kFullMask = 0xffffffffu;
inline constexpr int kVecBytes = 16;  // widest single load/store instruction
/*! \brief Elements of T per 16-byte vector. */
template <typename T>
inline constexpr int kVecSize = kVecBytes / static_cast<int>(sizeof(T));

// ---------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ T max_of(T a, T b) {
  return a < b ? b : a;
}
template <>
__device__ __forceinline__ float max_of(float a, float b) {
  return fmaxf(a, b);
}
template <>
__device__ __forceinline__ double max_of(double a, double b) {
  return fmax(a, b);
}
template <>
__device__ __forceinline__ fp16_t max_of(fp16_t a, fp16_t b) {
  return __hmax(a, b);
}
template <>
__device__ __forceinline__ bf16_t max_of(bf16_t a, bf16_t b) {
  return __hmax(a, b);
}

/*! \brief Sum over the 32 lanes of a warp; every lane gets the result. All lanes must call. */
template <typename T>
__device__ __forceinline__ T warp_reduce_sum(T value) {
#pragma unroll
  for (int offset = kWarpThreads / 2; offset > 0; offset >>= 1) {
    value = value + __shfl_xor_sync(kFullMask, value, offset);
  }
  return value;
}

/*! \brief Max over the 32 lanes of a warp; every lane gets the result. All lanes must call. */
template <typename T>
__device__ __forceinline__ T warp_reduce_max(T value) {
#pragma unroll
  for (int offset = kWarpThreads / 2; offset > 0; offset >>= 1) {
    value = max_of(value, __shfl_xor_sync(kFullMask, value, offset));
  }
  return value;
}

namespace detail {
// Shared by block_reduce_sum/max: reduce per warp, then reduce the warp partials in warp 0.
// Block size: a multiple of 32, at most 1024 (threads are linearized over x, y, z).
template <bool kMax, typename T>
__device__ __forceinline__ T warp_reduce(T value) {
  if constexpr (kMax) {
    return warp_reduce_max(value);
  } else {
    return warp_reduce_sum(value);
  }
}

template <bool kMax, typename T>
__device__ __forceinline__ T block_reduce(T value) {
  // Raw storage: __shared__ forbids element types with constructors.
  __shared__ alignas(T) unsigned char storage[kWarpThreads * sizeof(T)];
  T* partials = reinterpret_cast<T*>(storage);
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned lane = tid % kWarpThreads;
  const unsigned warp = tid / kWarpThreads;
  const unsigned num_warps = blockDim.x * blockDim.y * blockDim.z / kWarpThreads;
  value = warp_reduce<kMax>(value);
  __syncthreads();  // a previous call may still be reading partials[0]
  if (lane == 0) partials[warp] = value;
  __syncthreads();
  if (warp == 0) {
    // Lanes past num_warps re-read partial 0: a neutral element for max, zeroed for sum.
    value = partials[lane < num_warps ? lane : 0];
    if (!kMax && lane >= num_warps) value = T{};
    value = warp_reduce<kMax>(value);
    if (lane == 0) partials[0] = value;  // safe: shfl_sync above ordered all reads of warp 0
  }
  __syncthreads();
  return partials[0];
}
}  // namespace detail

/*! \brief Sum over the whole block; every thread gets the result. All threads must call. */
template <typename T>
__device__ __forceinline__ T block_reduce_sum(T value) {
  return detail::block_reduce<false>(value);
}

/*! \brief Max over the whole block; every thread gets the result. All threads must call. */
template <typename T>
__device__ __forceinline__ T block_reduce_max(T value) {
  return detail::block_reduce<true>(value);
}

// ---------------------------------------------------------------------------------- conversions
// Kernels read and write float / fp16_t / bf16_t and compute in float32.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(fp16_t v) { return __half2float(v); }
__device__ __forceinline__ float to_float(bf16_t v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, fp16_t>) {
    return __float2half_rn(v);
  } else {
    static_assert(std::is_same_v<T, bf16_t>, "from_float: T must be float, fp16_t or bf16_t");
    return __float2bfloat16_rn(v);
  }
}

// ---------------------------------------------------------------------------------- error record
// record: int64 {flag, index, value} (see mllm_kernel/kernels/device_errors.py). A kernel that
// meets an index it must not use records it here instead of touching memory out of bounds; only
// the first reporter (flag 0 -> 1) writes index and value.
__device__ __forceinline__ void record_error(int64_t* record, int64_t index, int64_t value) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(record), 0ull, 1ull) == 0ull) {
    record[1] = index;
    record[2] = value;
  }
}

// ---------------------------------------------------------------------------------- fast math
// The SFU's approximations, flush-to-zero, without the range fix-ups of __expf/__fdividef:
// 2^x within 2 ulp (2^+big = inf, 2^-big = 0) and 1/x within 1 ulp. For math whose result is
// rounded to 16 bits, or whose per-element error cancels (a softmax row's shared exponent).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------------------------- vector access
/*! \brief True if \p ptr is aligned to \p kBytes. */
template <int kBytes>
__host__ __device__ __forceinline__ bool is_aligned(const void* ptr) {
  static_assert(kBytes > 0 && (kBytes & (kBytes - 1)) == 0, "alignment must be a power of 2");
  return reinterpret_cast<uintptr_t>(ptr) % kBytes == 0;
}

/*!
 * \brief N elements of T moved with one (up to 16-byte) load/store instruction.
 * \note load/store index in units of whole vectors: element offset = vec_idx * N. The address
 *       must be aligned to sizeof(T) * N (check with is_aligned).
 */
template <typename T, int N>
struct alignas(sizeof(T) * N) AlignedVector {
  static_assert(N > 0 && ((sizeof(T) * N) & (sizeof(T) * N - 1)) == 0,
                "AlignedVector size must be a power of 2 bytes");
  static_assert(sizeof(T) * N <= kVecBytes, "AlignedVector is at most 16 bytes");
  static constexpr int kSize = N;
  T val[N];

  __device__ __forceinline__ void load(const T* ptr, int64_t vec_idx = 0) {
    *this = reinterpret_cast<const AlignedVector*>(ptr)[vec_idx];
  }
  __device__ __forceinline__ void store(T* ptr, int64_t vec_idx = 0) const {
    reinterpret_cast<AlignedVector*>(ptr)[vec_idx] = *this;
  }
  __device__ __forceinline__ void fill(T value) {
#pragma unroll
    for (int i = 0; i < N; ++i) val[i] = value;
  }
  __device__ __forceinline__ T& operator[](int i) { return val[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return val[i]; }
};

// ---------------------------------------------------------------------------
// Programmatic dependent launch (sm_90+); no-ops on older architectures.
// ---------------------------------------------------------------------------
/*! \brief Wait until the preceding grid in the stream has completed and its writes are visible. */
__device__ __forceinline__ void pdl_wait_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/*! \brief Allow the next PDL-launched grid in the stream to start its prologue early. */
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace mllm_kernel::device

namespace mllm_kernel::host {

using device::bf16_t;
using device::fp16_t;
using device::fp32_t;
using device::fp8_e4m3_t;
using device::fp8_e5m2_t;

/*! \brief RuntimeError with the CUDA error name/string and \p msg unless \p err is cudaSuccess. */
template <typename... Args>
inline void CudaCheck(cudaError_t err, const Args&... msg) {
  if (TVM_FFI_PREDICT_FALSE(err != cudaSuccess)) {
    cudaGetLastError();  // reported here: keep it from failing the next unrelated launch check
    Panic("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), "): ", msg...);
  }
}

/*! \brief Check a CUDA runtime call; the message names the call and its location. */
#define MLLM_CUDA_CHECK(expr) \
  ::mllm_kernel::host::CudaCheck((expr), #expr, " at ", __FILE__, ":", __LINE__)

/*! \brief Makes \p device current for the scope, restoring the previous one after. */
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) : device_(device) {
    MLLM_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device_) MLLM_CUDA_CHECK(cudaSetDevice(device_));
  }
  ~CudaDeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);  // no throw from a destructor
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

/*! \brief Compute capability as major * 10 + minor, queried once per device. */
inline int GetComputeCapability(int device) {
  constexpr int kMaxCachedDevices = 64;
  static std::atomic<int> cache[kMaxCachedDevices] = {};  // 0: not queried yet
  if (device >= 0 && device < kMaxCachedDevices) {
    if (const int cc = cache[device].load(std::memory_order_relaxed); cc != 0) return cc;
  }
  int major = 0, minor = 0;
  MLLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MLLM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const int cc = major * 10 + minor;
  if (device >= 0 && device < kMaxCachedDevices) cache[device].store(cc, std::memory_order_relaxed);
  return cc;
}

/*!
 * \brief Launches a kernel on torch's current stream of \p device (via TVMFFIEnvGetStream),
 *        with that device made current, and turns launch errors into RuntimeError.
 */
class LaunchKernel {
 public:
  LaunchKernel(dim3 grid, dim3 block, DLDevice device, size_t smem_bytes = 0)
      : grid_(grid), block_(block), device_(device), smem_bytes_(smem_bytes) {
    RuntimeCheck(device.device_type == kDLCUDA, "LaunchKernel: expected a CUDA device, got ",
                 "device_type=", static_cast<int>(device.device_type));
  }

  /*!
   * \brief Launch with programmatic stream serialization so the kernel may overlap the tail of
   *        the previous one; it must call device::pdl_wait_primary() before consuming its
   *        output. Ignored below sm_90.
   */
  LaunchKernel& enable_pdl(bool enable = true) {
    pdl_ = enable && GetComputeCapability(device_.device_id) >= 90;
    return *this;
  }

  template <typename... Params, typename... Args>
  void operator()(void (*kernel)(Params...), Args&&... args) const {
    CudaDeviceGuard guard(device_.device_id);
    cudaLaunchConfig_t config{};
    config.gridDim = grid_;
    config.blockDim = block_;
    config.dynamicSmemBytes = smem_bytes_;
    config.stream =
        static_cast<cudaStream_t>(TVMFFIEnvGetStream(device_.device_type, device_.device_id));
    cudaLaunchAttribute attr[1];
    if (pdl_) {
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      config.attrs = attr;
      config.numAttrs = 1;
    }
    cudaError_t err = cudaSuccess;
    if (smem_bytes_ > 48 * 1024) {  // beyond the default limit needs an explicit opt-in
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(smem_bytes_));
    }
    if (err == cudaSuccess) err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
    // Also clears the error state so it is not reported again by an unrelated later check.
    const cudaError_t last = cudaGetLastError();
    if (err == cudaSuccess) err = last;
    if (TVM_FFI_PREDICT_FALSE(err != cudaSuccess)) {
      ReportFailure(err, reinterpret_cast<const void*>(kernel));
    }
  }

 private:
  [[noreturn]] TVM_FFI_COLD_CODE void ReportFailure(cudaError_t err, const void* kernel) const {
    const char* name = nullptr;
    if (cudaFuncGetName(&name, kernel) != cudaSuccess || name == nullptr) {
      cudaGetLastError();
      name = "<unknown kernel>";
    }
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> demangled(
        abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
    if (status == 0 && demangled) name = demangled.get();
    Panic("CUDA kernel launch failed: ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
          ") for kernel ", name, " with grid (", grid_.x, ", ", grid_.y, ", ", grid_.z,
          "), block (", block_.x, ", ", block_.y, ", ", block_.z, "), dynamic smem ",
          smem_bytes_, " bytes, on cuda:", device_.device_id, pdl_ ? " with PDL" : "");
  }

  dim3 grid_;
  dim3 block_;
  DLDevice device_;
  size_t smem_bytes_;
  bool pdl_ = false;
};

}  // namespace mllm_kernel::host

#endif  // MLLM_KERNEL_UTILS_CUH_
