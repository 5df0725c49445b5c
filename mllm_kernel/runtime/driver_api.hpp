// The slice of the CUDA driver API that mllm_kernel.runtime calls, declared here so that the
// runtime builds with a plain C++ compiler and runs where only the driver (libcuda.so.1) exists.
// Values and layouts are the driver's stable ABI (cuda.h); tests/runtime/driver_abi_test.cc
// checks every one of them against the toolkit's cuda.h.
#pragma once

#include <cstddef>

namespace mllm_kernel::runtime::cu {

using Result = int;  // CUresult
using Device = int;  // CUdevice
using Context = struct CUctx_st*;
using Module = struct CUmod_st*;
using Function = struct CUfunc_st*;
using Stream = struct CUstream_st*;

inline constexpr Result kSuccess = 0;
inline constexpr Result kErrorInvalidValue = 1;

// CUfunction_attribute
inline constexpr int kFuncMaxThreadsPerBlock = 0;
inline constexpr int kFuncSharedSizeBytes = 1;
inline constexpr int kFuncLocalSizeBytes = 3;
inline constexpr int kFuncNumRegs = 4;
inline constexpr int kFuncMaxDynamicSharedSizeBytes = 8;
inline constexpr int kFuncNonPortableClusterSizeAllowed = 14;

// CUdevice_attribute
inline constexpr int kDeviceComputeCapabilityMajor = 75;
inline constexpr int kDeviceComputeCapabilityMinor = 76;
inline constexpr int kDeviceMaxSharedMemoryPerBlockOptin = 97;

// CUlaunchAttributeID
inline constexpr int kLaunchAttributeClusterDimension = 4;

union LaunchAttributeValue {  // CUlaunchAttributeValue: 64 bytes, pointer-aligned
  char pad[64];
  void* align_as_pointer;
  struct {
    unsigned int x, y, z;
  } cluster_dim;
};

struct LaunchAttribute {  // CUlaunchAttribute
  int id;
  char pad[8 - sizeof(int)];
  LaunchAttributeValue value;
};

struct LaunchConfig {  // CUlaunchConfig
  unsigned int grid_x, grid_y, grid_z;
  unsigned int block_x, block_y, block_z;
  unsigned int shared_mem_bytes;
  Stream stream;
  LaunchAttribute* attrs;
  unsigned int num_attrs;
};

// The driver entry points as X(symbol, function type), by the symbol names libcuda.so.1 exports
// (cuda.h maps the unsuffixed names of the first two to these _v2 symbols).
#define MLLM_KERNEL_CUDA_DRIVER_FUNCTIONS(X)                                                          \
  X(cuCtxPushCurrent_v2, cu::Result(cu::Context))                                                     \
  X(cuCtxPopCurrent_v2, cu::Result(cu::Context*))                                                     \
  X(cuInit, cu::Result(unsigned int))                                                                 \
  X(cuDriverGetVersion, cu::Result(int*))                                                             \
  X(cuDeviceGet, cu::Result(cu::Device*, int))                                                        \
  X(cuDeviceGetAttribute, cu::Result(int*, int, cu::Device))                                          \
  X(cuDevicePrimaryCtxRetain, cu::Result(cu::Context*, cu::Device))                                   \
  X(cuCtxGetCurrent, cu::Result(cu::Context*))                                                        \
  X(cuModuleLoadData, cu::Result(cu::Module*, const void*))                                           \
  X(cuModuleUnload, cu::Result(cu::Module))                                                           \
  X(cuModuleGetFunction, cu::Result(cu::Function*, cu::Module, const char*))                          \
  X(cuFuncGetAttribute, cu::Result(int*, int, cu::Function))                                          \
  X(cuFuncSetAttribute, cu::Result(cu::Function, int, int))                                           \
  X(cuLaunchKernelEx, cu::Result(const cu::LaunchConfig*, cu::Function, void**, void**))              \
  X(cuStreamSynchronize, cu::Result(cu::Stream))                                                      \
  X(cuGetErrorName, cu::Result(cu::Result, const char**))                                             \
  X(cuGetErrorString, cu::Result(cu::Result, const char**))

// Newer than the rest (driver 12.4): looked up, but optional.
#define MLLM_KERNEL_CUDA_DRIVER_OPTIONAL_FUNCTIONS(X) \
  X(cuFuncGetParamInfo, cu::Result(cu::Function, std::size_t, std::size_t*, std::size_t*))

}  // namespace mllm_kernel::runtime::cu
