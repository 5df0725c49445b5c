// driver_api.hpp declares the driver's ABI by hand (so the runtime needs no CUDA headers to
// build); this checks every constant, struct layout and entry point against the toolkit's cuda.h.
#include <cuda.h>

#include <array>
#include <cstddef>
#include <type_traits>

#include "mllm_kernel/runtime/driver_api.hpp"

namespace cu = mllm_kernel::runtime::cu;

static_assert(cu::kSuccess == CUDA_SUCCESS);
static_assert(cu::kErrorInvalidValue == CUDA_ERROR_INVALID_VALUE);
static_assert(cu::kFuncMaxThreadsPerBlock == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
static_assert(cu::kFuncSharedSizeBytes == CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
static_assert(cu::kFuncLocalSizeBytes == CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
static_assert(cu::kFuncNumRegs == CU_FUNC_ATTRIBUTE_NUM_REGS);
static_assert(cu::kFuncMaxDynamicSharedSizeBytes == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
static_assert(cu::kFuncNonPortableClusterSizeAllowed == CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED);
static_assert(cu::kDeviceComputeCapabilityMajor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
static_assert(cu::kDeviceComputeCapabilityMinor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
static_assert(cu::kDeviceMaxSharedMemoryPerBlockOptin == CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
static_assert(cu::kLaunchAttributeClusterDimension == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);

// The same bytes at the same places as the driver's structs.
static_assert(sizeof(cu::LaunchAttributeValue) == sizeof(CUlaunchAttributeValue));
static_assert(alignof(cu::LaunchAttributeValue) == alignof(CUlaunchAttributeValue));
static_assert(sizeof(cu::LaunchAttribute) == sizeof(CUlaunchAttribute));
static_assert(offsetof(cu::LaunchAttribute, value) == offsetof(CUlaunchAttribute, value));
static_assert(offsetof(cu::LaunchAttributeValue, cluster_dim) == offsetof(CUlaunchAttributeValue, clusterDim));
static_assert(sizeof(cu::LaunchConfig) == sizeof(CUlaunchConfig));
static_assert(offsetof(cu::LaunchConfig, grid_x) == offsetof(CUlaunchConfig, gridDimX));
static_assert(offsetof(cu::LaunchConfig, block_z) == offsetof(CUlaunchConfig, blockDimZ));
static_assert(offsetof(cu::LaunchConfig, shared_mem_bytes) == offsetof(CUlaunchConfig, sharedMemBytes));
static_assert(offsetof(cu::LaunchConfig, stream) == offsetof(CUlaunchConfig, hStream));
static_assert(offsetof(cu::LaunchConfig, attrs) == offsetof(CUlaunchConfig, attrs));
static_assert(offsetof(cu::LaunchConfig, num_attrs) == offsetof(CUlaunchConfig, numAttrs));

// Each entry point exists under that symbol name, with parameters of the same sizes.
template <typename F>
struct Shape;
template <typename R, typename... A>
struct Shape<R(A...)> {
  static constexpr std::array<std::size_t, sizeof...(A) + 1> sizes{sizeof(R), sizeof(A)...};
};
template <typename R, typename... A>
struct Shape<R (*)(A...)> : Shape<R(A...)> {};

#define MLLM_KERNEL_CHECK_ENTRY(name, type) \
  static_assert(Shape<type>::sizes == Shape<decltype(&::name)>::sizes, #name " differs from cuda.h");
MLLM_KERNEL_CUDA_DRIVER_FUNCTIONS(MLLM_KERNEL_CHECK_ENTRY)
MLLM_KERNEL_CUDA_DRIVER_OPTIONAL_FUNCTIONS(MLLM_KERNEL_CHECK_ENTRY)

int main() { return 0; }
