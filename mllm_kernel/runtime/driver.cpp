// mllm_kernel.runtime's calls into the CUDA driver API (libcuda.so.1, opened at first use), as
// tvm-ffi functions over integer handles. Python decides what to launch and converts the
// arguments; this file only makes the driver calls, which Python (ctypes) would make ~5x slower.
//
// A launch reads one LaunchRecord that Python packs (struct.pack_into) per call: the launch
// configuration, context, function and stream, followed by the argument values, and after them
// the kernelParams array that points at the values (written once per buffer).
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <type_traits>

#include <tvm/ffi/error.h>
#include <tvm/ffi/string.h>

#include "driver_api.hpp"

namespace mllm_kernel::runtime {

namespace detail {

struct Driver {
#define MLLM_KERNEL_DECLARE_ENTRY(name, type) std::add_pointer_t<type> name = nullptr;
  MLLM_KERNEL_CUDA_DRIVER_FUNCTIONS(MLLM_KERNEL_DECLARE_ENTRY)
  MLLM_KERNEL_CUDA_DRIVER_OPTIONAL_FUNCTIONS(MLLM_KERNEL_DECLARE_ENTRY)
#undef MLLM_KERNEL_DECLARE_ENTRY
  std::string problem;  // why the driver cannot be used; empty when it can
};

inline Driver OpenDriver() {
  Driver driver;
  // RTLD_NOLOAD first: use the copy torch (or anyone) already loaded, if any.
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) library = dlopen("libcuda.so.1", RTLD_NOW);
  if (library == nullptr) {
    const char* why = dlerror();
    driver.problem = std::string("cannot open the CUDA driver libcuda.so.1 (") + (why ? why : "unknown error") +
                     "); is an NVIDIA driver installed?";
    return driver;
  }
#define MLLM_KERNEL_LOOK_UP(name, type)                                              \
  driver.name = reinterpret_cast<std::add_pointer_t<type>>(dlsym(library, #name));                       \
  if (driver.name == nullptr && driver.problem.empty()) {                            \
    driver.problem = "the CUDA driver lacks " #name "; it is too old for mllm_kernel.runtime"; \
  }
  MLLM_KERNEL_CUDA_DRIVER_FUNCTIONS(MLLM_KERNEL_LOOK_UP)
#undef MLLM_KERNEL_LOOK_UP
#define MLLM_KERNEL_LOOK_UP_OPTIONAL(name, type) driver.name = reinterpret_cast<std::add_pointer_t<type>>(dlsym(library, #name));
  MLLM_KERNEL_CUDA_DRIVER_OPTIONAL_FUNCTIONS(MLLM_KERNEL_LOOK_UP_OPTIONAL)
#undef MLLM_KERNEL_LOOK_UP_OPTIONAL
  if (driver.problem.empty() && driver.cuInit(0) != cu::kSuccess) {
    driver.problem = "cuInit failed: no usable CUDA device or driver";
  }
  return driver;
}

inline const Driver& driver() {
  static const Driver instance = OpenDriver();  // thread-safe once
  if (!instance.problem.empty()) TVM_FFI_THROW(RuntimeError) << "mllm_kernel.runtime: " << instance.problem;
  return instance;
}

inline void Check(cu::Result result, const char* call) {
  if (result == cu::kSuccess) return;
  const char* name = nullptr;
  const char* text = nullptr;
  driver().cuGetErrorName(result, &name);
  driver().cuGetErrorString(result, &text);
  TVM_FFI_THROW(RuntimeError) << call << " failed: " << (name ? name : "CUDA_ERROR_?") << " (" << result
                              << "): " << (text ? text : "unknown error");
}

// Makes `context` current on this thread for the scope (the thread may have none, or torch's
// context of another device), restoring what was current before.
class ContextScope {
 public:
  explicit ContextScope(cu::Context context) {
    cu::Context current = nullptr;
    Check(driver().cuCtxGetCurrent(&current), "cuCtxGetCurrent");
    if (current != context) {
      Check(driver().cuCtxPushCurrent_v2(context), "cuCtxPushCurrent");
      pushed_ = true;
    }
  }
  ~ContextScope() {
    cu::Context popped = nullptr;
    if (pushed_) driver().cuCtxPopCurrent_v2(&popped);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  bool pushed_ = false;
};

template <typename Handle>
Handle As(int64_t value) {
  return reinterpret_cast<Handle>(static_cast<intptr_t>(value));
}

template <typename Handle>
int64_t Of(Handle handle) {
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(handle));
}

}  // namespace detail

// The head of a launch record; mllm_kernel/runtime/kernel.py packs the same layout (RECORD_HEAD).
struct LaunchRecord {
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_mem_bytes;
  uint32_t cluster[3];  // all zero: no cluster
  uint32_t params_offset;  // byte offset of the kernelParams array from the record's start
  uint32_t unused;
  uint64_t context;   // the function's context (made current for the launch)
  uint64_t function;  // CUfunction
  uint64_t stream;    // CUstream
};
static_assert(sizeof(LaunchRecord) == 72);

inline int64_t DriverVersion() {
  int version = 0;
  detail::Check(detail::driver().cuDriverGetVersion(&version), "cuDriverGetVersion");
  return version;
}

// The primary context of `device`, the one torch (the CUDA runtime) uses. Retained for the
// process's lifetime, as the runtime does.
inline int64_t PrimaryContext(int64_t device) {
  cu::Device handle = 0;
  detail::Check(detail::driver().cuDeviceGet(&handle, static_cast<int>(device)), "cuDeviceGet");
  cu::Context context = nullptr;
  detail::Check(detail::driver().cuDevicePrimaryCtxRetain(&context, handle), "cuDevicePrimaryCtxRetain");
  return detail::Of(context);
}

inline int64_t DeviceAttribute(int64_t device, int64_t attribute) {
  cu::Device handle = 0;
  detail::Check(detail::driver().cuDeviceGet(&handle, static_cast<int>(device)), "cuDeviceGet");
  int value = 0;
  detail::Check(detail::driver().cuDeviceGetAttribute(&value, static_cast<int>(attribute), handle), "cuDeviceGetAttribute");
  return value;
}

// Loads a cubin or fatbin image; the driver copies what it needs during the call.
inline int64_t LoadModule(int64_t context, tvm::ffi::Bytes image) {
  detail::ContextScope scope(detail::As<cu::Context>(context));
  cu::Module module = nullptr;
  detail::Check(detail::driver().cuModuleLoadData(&module, image.data()), "cuModuleLoadData");
  return detail::Of(module);
}

inline void UnloadModule(int64_t context, int64_t module) {
  detail::ContextScope scope(detail::As<cu::Context>(context));
  detail::Check(detail::driver().cuModuleUnload(detail::As<cu::Module>(module)), "cuModuleUnload");
}

inline int64_t GetFunction(int64_t context, int64_t module, tvm::ffi::String name) {
  detail::ContextScope scope(detail::As<cu::Context>(context));
  cu::Function function = nullptr;
  detail::Check(detail::driver().cuModuleGetFunction(&function, detail::As<cu::Module>(module), name.c_str()),
                "cuModuleGetFunction");
  return detail::Of(function);
}

inline int64_t FunctionAttribute(int64_t function, int64_t attribute) {
  int value = 0;
  detail::Check(detail::driver().cuFuncGetAttribute(&value, static_cast<int>(attribute), detail::As<cu::Function>(function)),
                "cuFuncGetAttribute");
  return value;
}

inline void SetFunctionAttribute(int64_t context, int64_t function, int64_t attribute, int64_t value) {
  detail::ContextScope scope(detail::As<cu::Context>(context));
  detail::Check(detail::driver().cuFuncSetAttribute(detail::As<cu::Function>(function), static_cast<int>(attribute),
                                                    static_cast<int>(value)),
                "cuFuncSetAttribute");
}

// Parameter `index` of `function` as offset << 32 | size; -1 past the last parameter, -2 when
// the driver is older than cuFuncGetParamInfo (12.4).
inline int64_t ParamInfo(int64_t function, int64_t index) {
  const auto& driver = detail::driver();
  if (driver.cuFuncGetParamInfo == nullptr) return -2;
  std::size_t offset = 0, size = 0;
  cu::Result result = driver.cuFuncGetParamInfo(detail::As<cu::Function>(function), static_cast<std::size_t>(index),
                                                &offset, &size);
  if (result == cu::kErrorInvalidValue) return -1;
  detail::Check(result, "cuFuncGetParamInfo");
  return static_cast<int64_t>(offset) << 32 | static_cast<int64_t>(size);
}

// One argument: everything, the function and its context included, is in the record (each
// argument tvm-ffi converts costs time on a path that takes a few microseconds in all).
inline void Launch(int64_t record_address) {
  const auto* record = detail::As<const LaunchRecord*>(record_address);
  cu::LaunchAttribute cluster{};
  cu::LaunchConfig config{};
  config.grid_x = record->grid[0];
  config.grid_y = record->grid[1];
  config.grid_z = record->grid[2];
  config.block_x = record->block[0];
  config.block_y = record->block[1];
  config.block_z = record->block[2];
  config.shared_mem_bytes = record->shared_mem_bytes;
  config.stream = detail::As<cu::Stream>(static_cast<int64_t>(record->stream));
  if (record->cluster[0] != 0) {
    cluster.id = cu::kLaunchAttributeClusterDimension;
    cluster.value.cluster_dim = {record->cluster[0], record->cluster[1], record->cluster[2]};
    config.attrs = &cluster;
    config.num_attrs = 1;
  }
  void** params = reinterpret_cast<void**>(record_address + record->params_offset);
  detail::ContextScope scope(detail::As<cu::Context>(static_cast<int64_t>(record->context)));
  detail::Check(detail::driver().cuLaunchKernelEx(&config, detail::As<cu::Function>(static_cast<int64_t>(record->function)),
                                                  params, nullptr),
                "cuLaunchKernelEx");
}

// The launch as a C function for the CPython extension (launch_ext.c), which calls it through the
// address LaunchEntryAddress gives: 0 on success, else nonzero with the error in `message`.
extern "C" inline int MllmKernelRuntimeLaunch(int64_t record_address, char* message, std::size_t capacity) {
  try {
    Launch(record_address);
    return 0;
  } catch (const tvm::ffi::Error& error) {
    std::snprintf(message, capacity, "%s", error.message().c_str());
  } catch (const std::exception& error) {
    std::snprintf(message, capacity, "%s", error.what());
  }
  return 1;
}

inline int64_t LaunchEntryAddress() { return detail::Of(&MllmKernelRuntimeLaunch); }

inline void StreamSynchronize(int64_t context, int64_t stream) {
  detail::ContextScope scope(detail::As<cu::Context>(context));
  detail::Check(detail::driver().cuStreamSynchronize(detail::As<cu::Stream>(stream)), "cuStreamSynchronize");
}

}  // namespace mllm_kernel::runtime
