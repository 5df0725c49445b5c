// Smoke module for the C++ chain: built by Bazel against tvm-ffi's headers, loaded from Python.
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <cstdint>

namespace {

// out[i] = x[i] * scale + 1, for contiguous float32 CPU tensors of equal size.
void scale_add_one(tvm::ffi::TensorView out, tvm::ffi::TensorView x, double scale) {
  const DLDataType f32{kDLFloat, 32, 1};
  TVM_FFI_CHECK(x.device().device_type == kDLCPU && out.device().device_type == kDLCPU, ValueError)
      << "smoke: expected CPU tensors";
  TVM_FFI_CHECK(x.dtype() == f32 && out.dtype() == f32, TypeError) << "smoke: expected float32";
  TVM_FFI_CHECK(x.IsContiguous() && out.IsContiguous() && x.numel() == out.numel(), ValueError)
      << "smoke: expected contiguous tensors of equal size, got " << x.numel() << " and " << out.numel();
  const auto* src = static_cast<const float*>(x.data_ptr());
  auto* dst = static_cast<float*>(out.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) dst[i] = static_cast<float>(src[i] * scale + 1.0);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale_add_one, scale_add_one);
