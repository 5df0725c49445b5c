/*!
 * \file tests/cpp/matcher_probe.cc
 * \brief tvm-ffi module exercising TensorMatcher and the check helpers, one probe per
 *        failure kind, so tests/test_tensor_matcher.py can assert exception types and messages.
 */
#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <cstdint>

namespace {

using namespace mllm_kernel::host;  // NOLINT(*)
using tvm::ffi::Array;
using tvm::ffi::String;
using tvm::ffi::TensorView;

// ---- shape -----------------------------------------------------------------
// Expects a 2-D [rows, 4] tensor; returns the bound rows.
int64_t ProbeLiteral(TensorView x) {
  SymbolicSize rows{"rows"};
  TensorMatcher({rows, 4}).for_op("probe_literal").verify(x, "x");
  return rows.unwrap();
}

// dst and src must share 'num_elements'; returns it.
int64_t ProbeSymbolic(TensorView dst, TensorView src) {
  SymbolicSize n{"num_elements"};
  TensorMatcher({n}).for_op("add_constant").verify(dst, "dst").verify(src, "src");
  return n.unwrap();
}

// Same as ProbeSymbolic without names: messages fall back to "argument #k".
int64_t ProbeUnnamed(TensorView a, TensorView b) {
  SymbolicSize n{"n"};
  TensorMatcher({n, -1}).verify(a).verify(b);
  return n.unwrap();
}

// Square matrix: one symbol used twice within one tensor.
int64_t ProbeSquare(TensorView x) {
  SymbolicSize n{"n"};
  TensorMatcher({n, n}).for_op("probe_square").verify(x, "x");
  return n.unwrap();
}

// [*, 3, *]: wildcards accept anything; returns the tensor's ndim.
int64_t ProbeWildcard(TensorView x) {
  TensorMatcher({-1, 3, -1}).for_op("probe_wildcard").verify(x, "x");
  return x.ndim();
}

// Size bound from a scalar before any tensor is seen.
int64_t ProbeSetValue(TensorView x, int64_t n) {
  SymbolicSize size{"size"};
  size.set_value(n);
  TensorMatcher({size}).for_op("probe_set_value").verify(x, "x");
  return size.unwrap();
}

// Two matchers sharing symbols: x is [M, K], w is [N, K]; returns [M, N, K].
Array<int64_t> ProbeTwoMatchers(TensorView x, TensorView w) {
  SymbolicSize m{"M"}, n{"N"}, k{"K"};
  SymbolicDType dtype{"dtype"};
  TensorMatcher({m, k}).for_op("linear").with_dtype<float, double>(dtype).verify(x, "x");
  TensorMatcher({n, k}).for_op("linear").with_dtype(dtype).verify(w, "w");
  return Array<int64_t>{m.unwrap(), n.unwrap(), k.unwrap()};
}

// ---- strides -----------------------------------------------------------------
// Contiguous 2-D tensor required (no with_strides).
int64_t ProbeContiguous(TensorView x) {
  TensorMatcher({-1, -1}).for_op("probe_contiguous").verify(x, "x");
  return x.numel();
}

// Row-major with a free row stride; returns [rows, cols, row_stride].
Array<int64_t> ProbeStrides(TensorView x) {
  SymbolicSize rows{"rows"}, cols{"cols"}, row_stride{"row_stride"};
  TensorMatcher({rows, cols}).for_op("probe_strides").with_strides({row_stride, 1}).verify(x, "x");
  return Array<int64_t>{rows.unwrap(), cols.unwrap(), row_stride.unwrap()};
}

// Both tensors must share the row stride; any column stride (-1).
int64_t ProbeSharedStride(TensorView a, TensorView b) {
  SymbolicSize row_stride{"row_stride"};
  TensorMatcher({-1, -1})
      .for_op("probe_shared_stride")
      .with_strides({row_stride, -1})
      .verify(a, "a")
      .verify(b, "b");
  return row_stride.unwrap();
}

// ---- dtype -------------------------------------------------------------------
void ProbeDType(TensorView x) {
  TensorMatcher({-1}).for_op("probe_dtype").with_dtype<float, bfloat16_tag>().verify(x, "x");
}

// Both tensors must share one dtype out of a set; returns its name.
String ProbeDTypeSymbolic(TensorView a, TensorView b) {
  SymbolicDType dtype{"dtype"};
  TensorMatcher({-1})
      .for_op("probe_dtype_symbolic")
      .with_dtype<float, double, int32_t>(dtype)
      .verify(a, "a")
      .verify(b, "b");
  return String(DTypeName(dtype.unwrap()));
}

// Index of x's dtype in the kDType table (checks the C++ -> DLPack mapping), -1 if absent.
int64_t ProbeDTypeIndex(TensorView x) {
  const DLDataType table[] = {
      kDType<float>,         kDType<double>,       kDType<int8_t>,
      kDType<int16_t>,       kDType<int32_t>,      kDType<int64_t>,
      kDType<uint8_t>,       kDType<bool>,         kDType<float16_tag>,
      kDType<bfloat16_tag>,  kDType<float8_e4m3fn_tag>, kDType<float8_e5m2_tag>,
  };
  for (int64_t i = 0; i < static_cast<int64_t>(sizeof(table) / sizeof(table[0])); ++i) {
    if (table[i] == x.dtype()) return i;
  }
  return -1;
}

// ---- device ------------------------------------------------------------------
void ProbeDeviceCuda(TensorView x) {
  TensorMatcher({-1}).for_op("probe_device").with_device<kDLCUDA>().verify(x, "x");
}

// Both on one device (type and id); returns its name.
String ProbeDeviceSymbolic(TensorView a, TensorView b) {
  SymbolicDevice device{"device"};
  TensorMatcher({-1})
      .for_op("probe_device_symbolic")
      .with_device<kDLCPU, kDLCUDA>(device)
      .verify(a, "a")
      .verify(b, "b");
  return String(DeviceName(device.unwrap()));
}

// ---- unbound symbol ----------------------------------------------------------
int64_t ProbeUnwrapUnbound() {
  SymbolicSize never{"never_bound"};
  return never.unwrap();
}

// ---- utils.hpp -----------------------------------------------------------------
void ProbeRuntimeCheck(bool cond, int64_t value) {
  RuntimeCheck(cond, "runtime check failed, value=", value);
}
void ProbeValueCheck(bool cond, int64_t value) {
  ValueCheck(cond, "value check failed, value=", value);
}
void ProbeTypeCheck(bool cond, int64_t value) {
  TypeCheck(cond, "type check failed, value=", value);
}
void ProbePanic(String msg) { Panic("panic: ", std::string(msg), " #", 42); }
int64_t ProbeDivCeil(int64_t a, int64_t b) { return div_ceil(a, b); }
int64_t ProbeDTypeBytes(int64_t code, int64_t bits, int64_t lanes) {
  return dtype_bytes(DLDataType{static_cast<uint8_t>(code), static_cast<uint8_t>(bits),
                                static_cast<uint16_t>(lanes)});
}

static_assert(div_ceil(0, 4) == 0 && div_ceil(7, 4) == 2 && div_ceil(8u, 4) == 2);

// A template id with a comma must be parenthesized inside TVM_FFI_DLL_EXPORT_TYPED_FUNC.
template <int A, bool kNegate>
int64_t ProbeTemplate(int64_t x) {
  return kNegate ? -(x + A) : x + A;
}

// ---- overlap.hpp ---------------------------------------------------------------
// 0: no shared memory, 1: overlap (exact), 2: byte ranges intersect, layouts not exact.
int64_t ProbeOverlapKind(TensorView a, TensorView b) { return OverlapKind(a, b); }

// ValueError unless t (as a written argument) has no internal overlap.
void ProbeInternalOverlap(TensorView t) { CheckNoInternalOverlap("probe_overlap", t, "t"); }

// The aliasing contract of an op writing w0 and w1 and reading r0.
void ProbeNoAliasing(TensorView w0, TensorView w1, TensorView r0) {
  CheckNoAliasing("probe_aliasing", {{w0, "w0"}, {w1, "w1"}}, {{r0, "r0"}});
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_overlap_kind, ProbeOverlapKind);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_internal_overlap, ProbeInternalOverlap);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_no_aliasing, ProbeNoAliasing);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_literal, ProbeLiteral);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_symbolic, ProbeSymbolic);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_unnamed, ProbeUnnamed);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_square, ProbeSquare);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_wildcard, ProbeWildcard);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_set_value, ProbeSetValue);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_two_matchers, ProbeTwoMatchers);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_contiguous, ProbeContiguous);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_strides, ProbeStrides);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_shared_stride, ProbeSharedStride);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_dtype, ProbeDType);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_dtype_symbolic, ProbeDTypeSymbolic);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_dtype_index, ProbeDTypeIndex);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_device_cuda, ProbeDeviceCuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_device_symbolic, ProbeDeviceSymbolic);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_unwrap_unbound, ProbeUnwrapUnbound);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_runtime_check, ProbeRuntimeCheck);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_value_check, ProbeValueCheck);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_type_check, ProbeTypeCheck);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_panic, ProbePanic);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_div_ceil, ProbeDivCeil);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_dtype_bytes, ProbeDTypeBytes);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_template, (ProbeTemplate<1, true>));
