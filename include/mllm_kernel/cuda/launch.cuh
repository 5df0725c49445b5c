/*!
 * \file mllm_kernel/cuda/launch.cuh
 * \brief Launching kernels: LaunchKernel on torch's current stream with programmatic dependent
 *        launch (PDL), the kernel side of PDL (pdl_wait_primary / pdl_launch_dependents),
 *        CudaCheck / MLLM_CUDA_CHECK, and device attributes (compute capability, opt-in shared
 *        memory, SM count) queried once per device. LaunchKernel also launches clusters.
 *
 * \code{.cpp}
 *   host::LaunchKernel(grid, block, dst.device()).enable_pdl(true)(my_kernel, out, in, n);
 * \endcode
 */
#ifndef MLLM_KERNEL_CUDA_LAUNCH_CUH_
#define MLLM_KERNEL_CUDA_LAUNCH_CUH_

#include <cuda_runtime.h>
#include <dlpack/dlpack.h>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/base_detail.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>

#include <cxxabi.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <utility>

namespace mllm_kernel::device {

// Programmatic dependent launch (sm_90+); no-ops on older architectures.

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

/*! \brief A device attribute, queried once per device and attribute (they never change). */
template <cudaDeviceAttr kAttr>
inline int CachedDeviceAttribute(int device) {
  constexpr int kMaxCachedDevices = 64;
  // value + 1, so that 0 means "not queried yet" even for attributes that are 0 (a minor
  // compute capability of 0 would otherwise be queried at every call).
  static std::atomic<int64_t> cache[kMaxCachedDevices] = {};
  if (device >= 0 && device < kMaxCachedDevices) {
    if (const int64_t v = cache[device].load(std::memory_order_relaxed); v != 0) return static_cast<int>(v - 1);
  }
  int value = 0;
  MLLM_CUDA_CHECK(cudaDeviceGetAttribute(&value, kAttr, device));
  if (device >= 0 && device < kMaxCachedDevices) {
    cache[device].store(static_cast<int64_t>(value) + 1, std::memory_order_relaxed);
  }
  return value;
}

/*! \brief Compute capability as major * 10 + minor. */
inline int GetComputeCapability(int device) {
  return CachedDeviceAttribute<cudaDevAttrComputeCapabilityMajor>(device) * 10 +
         CachedDeviceAttribute<cudaDevAttrComputeCapabilityMinor>(device);
}

/*! \brief The shared memory one block may opt into on \p device (bytes). */
inline int64_t MaxSharedMemoryPerBlock(int device) {
  return CachedDeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device);
}

/*! \brief The shared memory of one SM of \p device (bytes; its blocks share it). */
inline int64_t SharedMemoryPerMultiprocessor(int device) {
  return CachedDeviceAttribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>(device);
}

/*! \brief The number of SMs of \p device. */
inline int MultiProcessorCount(int device) {
  return CachedDeviceAttribute<cudaDevAttrMultiProcessorCount>(device);
}

namespace launch_detail {

inline constexpr int kMaxCachedDevices = 64;

// Calls set() (a cudaFuncSetAttribute) with `device` current, the first time `done` sees that
// device; a refusal is cleared, so that no later check reports it.
template <typename Set>
void OncePerDevice(std::atomic<bool> (&done)[kMaxCachedDevices], int device, Set&& set) {
  if (device < 0 || device >= kMaxCachedDevices || done[device].load(std::memory_order_relaxed)) return;
  tvm::ffi::CUDADeviceGuard guard(device);
  if (set() != cudaSuccess) cudaGetLastError();
  done[device].store(true, std::memory_order_relaxed);
}

}  // namespace launch_detail

/*!
 * \brief Asks for the largest shared-memory carveout for \p kernel on \p device (kernels whose
 *        CTAs use tens of KiB, so that several fit an SM), once per kernel type and device; a
 *        refusal only costs occupancy.
 */
template <typename Kernel>
void PreferMaxSharedMemoryCarveout(Kernel kernel, int device) {
  static std::atomic<bool> done[launch_detail::kMaxCachedDevices] = {};
  launch_detail::OncePerDevice(done, device, [&] {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  });
}

/*!
 * \brief Lets kKernel take up to \p bytes of dynamic shared memory on \p device, once per kernel
 *        and device. A launch above 48 KiB less the kernel's static shared memory needs this
 *        opt-in; LaunchKernel makes it only above 48 KiB of dynamic shared memory. After a
 *        refusal the launch reports what remains wrong.
 */
template <auto kKernel>
void AllowDynamicSmem(int device, int64_t bytes) {
  static std::atomic<bool> done[launch_detail::kMaxCachedDevices] = {};
  launch_detail::OncePerDevice(done, device, [&] {
    return cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  });
}

/*!
 * \brief How many clusters of \p blocks blocks of \p kernel (each \p threads threads and
 *        \p smem_bytes of dynamic shared memory) \p device can run at once (the occupancy API;
 *        0 where it refuses, e.g. before sm_90). Above 8 blocks, the portable limit, the kernel is
 *        allowed a non-portable size. Not cached: callers ask once per configuration.
 */
template <typename Kernel>
int MaxActiveClusters(Kernel kernel, int device, unsigned blocks, int threads, int64_t smem_bytes) {
  tvm::ffi::CUDADeviceGuard guard(device);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = blocks;
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  int clusters = 0;
  const bool asked =
      (blocks <= 8 || cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) &&
      (smem_bytes <= 48 * 1024 || cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(smem_bytes)) == cudaSuccess) &&
      cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) == cudaSuccess;
  cudaGetLastError();  // a refusal is an answer, not an error for a later check
  return asked ? clusters : 0;
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

  /*!
   * \brief Launch as clusters of \p blocks consecutive blocks along x (sm_90 and up; grid.x must
   *        be a multiple). Above 8, the portable limit, the kernel is allowed a non-portable size.
   */
  LaunchKernel& cluster(unsigned blocks) {
    cluster_ = blocks;
    return *this;
  }

  template <typename... Params, typename... Args>
  void operator()(void (*kernel)(Params...), Args&&... args) const {
    cudaError_t err = cudaSuccess;
    {
      // Switches the current device only when it differs, and switches back at scope end:
      // before ReportFailure throws, so the guard's (throwing) destructor never runs mid-unwind.
      tvm::ffi::CUDADeviceGuard guard(device_.device_id);
      cudaLaunchConfig_t config{};
      config.gridDim = grid_;
      config.blockDim = block_;
      config.dynamicSmemBytes = smem_bytes_;
      config.stream =
          static_cast<cudaStream_t>(TVMFFIEnvGetStream(device_.device_type, device_.device_id));
      cudaLaunchAttribute attr[2];
      config.attrs = attr;
      if (pdl_) {
        attr[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[config.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
      }
      if (cluster_ > 1) {
        attr[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
        attr[config.numAttrs].val.clusterDim.x = cluster_;
        attr[config.numAttrs].val.clusterDim.y = 1;
        attr[config.numAttrs++].val.clusterDim.z = 1;
        if (cluster_ > 8) {
          err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        }
      }
      if (err == cudaSuccess && smem_bytes_ > 48 * 1024) {  // beyond 48 KiB needs an opt-in
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(smem_bytes_));
      }
      if (err == cudaSuccess) err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
      // Also clears the error state so it is not reported again by an unrelated later check.
      const cudaError_t last = cudaGetLastError();
      if (err == cudaSuccess) err = last;
    }
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
          smem_bytes_, " bytes, cluster ", cluster_, ", on cuda:", device_.device_id,
          pdl_ ? " with PDL" : "");
  }

  dim3 grid_;
  dim3 block_;
  DLDevice device_;
  size_t smem_bytes_;
  unsigned cluster_ = 1;
  bool pdl_ = false;
};

}  // namespace mllm_kernel::host

#endif  // MLLM_KERNEL_CUDA_LAUNCH_CUH_
