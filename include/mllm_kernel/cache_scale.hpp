/*!
 * \file mllm_kernel/cache_scale.hpp
 * \brief The dequantization scales of a float8 (e4m3fn) KV cache, checked the same way by the op
 * that writes the cache (store_kv_cache: x is stored as x / scale) and the one that reads it
 * (decode_attention: a stored value c stands for c * scale).
 *
 * A scale is `value * tensor[kv_head]`: `value` a positive finite float32 number, `tensor` float32
 * [num_kv_heads] (per head), [1] (per tensor, read on the device, e.g. a calibrated layer
 * scale) or [0] (none: 1), on the cache's device, any stride. Caches of another dtype take no
 * scale (value 1, tensor [0]). The tensor's values are used as they are (reading them would
 * sync a GPU).
 */
#ifndef MLLM_KERNEL_CACHE_SCALE_HPP_
#define MLLM_KERNEL_CACHE_SCALE_HPP_

#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cmath>
#include <cstdint>

namespace mllm_kernel::host {

/*! \brief A verified cache scale (trivially copyable: kernels take it as a parameter). The scale of
 * kv head h is value * data[h * stride], or value where there is no tensor (data null). */
struct CacheScale {
  float value = 1.f;
  bool has_tensor = false;
  int64_t stride = 0;           // 0 for a per-tensor [1] scale
  const float* data = nullptr;  // the tensor's elements, on its device
};

template <DLDeviceType kDev>
CacheScale VerifyCacheScale(const char* op, const char* name, tvm::ffi::TensorView tensor, double value,
                            SymbolicDevice& device, int64_t num_kv_heads, bool fp8_cache) {
  SymbolicSize n{"scale_size"}, stride{"scale_stride"};
  TensorMatcher({n}).for_op(op).with_dtype<float>().with_device(device).with_strides({stride}).verify(tensor, name);
  const int64_t size = n.unwrap();
  ValueCheck(size == 0 || size == 1 || size == num_kv_heads, op, ": ", name,
             " must be a float or a float32 tensor of 1 or num_kv_heads (", num_kv_heads, ") elements, got ", size,
             " elements");
  const float f = static_cast<float>(value);
  ValueCheck(std::isfinite(f) && f > 0.f, op, ": ", name, " must be a positive finite float32 number, got ", value);
  ValueCheck(fp8_cache || (size == 0 && value == 1.0), op, ": ", name,
             " applies to float8_e4m3fn caches only; this cache holds its values as they are");
  return {f, size > 0, size == 1 ? 0 : stride.unwrap(), size > 0 ? data_ptr<const float>(tensor) : nullptr};
}

}  // namespace mllm_kernel::host

#endif  // MLLM_KERNEL_CACHE_SCALE_HPP_
