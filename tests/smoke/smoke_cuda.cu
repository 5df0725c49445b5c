// Smoke module for the CUDA chain: compiled by the hermetic nvcc for the configured archs.
#include <cuda_runtime.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include <cstdint>

namespace {

__global__ void iota_kernel(int32_t* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<int32_t>(i);
}

// out[i] = i on the caller's (torch's) current stream.
void iota(tvm::ffi::TensorView out) {
  TVM_FFI_CHECK(out.device().device_type == kDLCUDA, ValueError) << "smoke: expected a CUDA tensor";
  TVM_FFI_CHECK(out.dtype() == DLDataType({kDLInt, 32, 1}), TypeError) << "smoke: expected int32";
  TVM_FFI_CHECK(out.IsContiguous(), ValueError) << "smoke: expected a contiguous tensor";
  const int64_t n = out.numel();
  if (n == 0) return;
  cudaSetDevice(out.device().device_id);
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, out.device().device_id));
  const int block = 256;
  iota_kernel<<<static_cast<unsigned>((n + block - 1) / block), block, 0, stream>>>(
      static_cast<int32_t*>(out.data_ptr()), n);
  const cudaError_t err = cudaGetLastError();
  TVM_FFI_CHECK(err == cudaSuccess, RuntimeError) << "smoke: launch failed: " << cudaGetErrorString(err);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(iota, iota);
