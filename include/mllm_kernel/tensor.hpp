/*!
 * \file mllm_kernel/tensor.hpp
 * \brief Declarative validation of kernel tensor arguments.
 *
 * \code{.cpp}
 *   SymbolicSize N{"num_tokens"}, D{"hidden"};
 *   SymbolicDType dtype;
 *   SymbolicDevice device;
 *   TensorMatcher({N, D})
 *       .for_op("rms_norm")
 *       .with_dtype<float, bf16_t>(dtype)
 *       .with_device<kDLCUDA>(device)
 *       .verify(out, "out")
 *       .verify(x, "x");
 *   const int64_t n = N.unwrap();
 * \endcode
 *
 * A symbol binds on the first tensor that uses it and is checked on every later one.
 * Shape/stride/device mismatches raise ValueError, dtype mismatches raise TypeError.
 */
#ifndef MLLM_KERNEL_TENSOR_HPP_
#define MLLM_KERNEL_TENSOR_HPP_

#include <dlpack/dlpack.h>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace mllm_kernel::host {

// ---------------------------------------------------------------------------
// C++ type -> DLDataType
// ---------------------------------------------------------------------------
/*! \brief Tag types naming 16-bit / 8-bit float dtypes in host code without CUDA headers. */
struct float16_tag {};
struct bfloat16_tag {};
struct float8_e4m3fn_tag {};
struct float8_e5m2_tag {};

/*! \brief Maps a C++ element type to its DLDataType; specialize to add types. */
template <typename T>
struct DTypeOf;

#define MLLM_KERNEL_DEFINE_DTYPE_OF(T, CODE, BITS) \
  template <>                                      \
  struct DTypeOf<T> {                              \
    static constexpr DLDataType value{static_cast<uint8_t>(CODE), BITS, 1}; \
  }
MLLM_KERNEL_DEFINE_DTYPE_OF(float, kDLFloat, 32);
MLLM_KERNEL_DEFINE_DTYPE_OF(double, kDLFloat, 64);
MLLM_KERNEL_DEFINE_DTYPE_OF(int8_t, kDLInt, 8);
MLLM_KERNEL_DEFINE_DTYPE_OF(int16_t, kDLInt, 16);
MLLM_KERNEL_DEFINE_DTYPE_OF(int32_t, kDLInt, 32);
MLLM_KERNEL_DEFINE_DTYPE_OF(int64_t, kDLInt, 64);
MLLM_KERNEL_DEFINE_DTYPE_OF(uint8_t, kDLUInt, 8);
MLLM_KERNEL_DEFINE_DTYPE_OF(uint16_t, kDLUInt, 16);
MLLM_KERNEL_DEFINE_DTYPE_OF(uint32_t, kDLUInt, 32);
MLLM_KERNEL_DEFINE_DTYPE_OF(uint64_t, kDLUInt, 64);
MLLM_KERNEL_DEFINE_DTYPE_OF(bool, kDLBool, 8);  // torch exports bool as 8-bit kDLBool
MLLM_KERNEL_DEFINE_DTYPE_OF(float16_tag, kDLFloat, 16);
MLLM_KERNEL_DEFINE_DTYPE_OF(bfloat16_tag, kDLBfloat, 16);
// torch.float8_e4m3fn / CUDA __nv_fp8_e4m3 are the "fn" (finite, no inf) variant.
MLLM_KERNEL_DEFINE_DTYPE_OF(float8_e4m3fn_tag, kDLFloat8_e4m3fn, 8);
MLLM_KERNEL_DEFINE_DTYPE_OF(float8_e5m2_tag, kDLFloat8_e5m2, 8);
#ifdef __CUDACC__
MLLM_KERNEL_DEFINE_DTYPE_OF(__half, kDLFloat, 16);
MLLM_KERNEL_DEFINE_DTYPE_OF(__nv_bfloat16, kDLBfloat, 16);
MLLM_KERNEL_DEFINE_DTYPE_OF(__nv_fp8_e4m3, kDLFloat8_e4m3fn, 8);
MLLM_KERNEL_DEFINE_DTYPE_OF(__nv_fp8_e5m2, kDLFloat8_e5m2, 8);
#endif
#undef MLLM_KERNEL_DEFINE_DTYPE_OF

template <typename T>
inline constexpr DLDataType kDType = DTypeOf<T>::value;

/*! \brief "float32", "bfloat16", ... (the names torch users know). */
inline std::string DTypeName(DLDataType dtype) {
  return std::string(tvm::ffi::DLDataTypeToString(dtype));
}

/*! \brief "cpu", "cuda:1", ... */
inline std::string DeviceName(DLDevice device) {
  const char* type = nullptr;
  switch (device.device_type) {
    case kDLCPU: return "cpu";  // torch prints CPU without an index
    case kDLCUDA: type = "cuda"; break;
    case kDLCUDAHost: type = "cuda_host"; break;
    case kDLCUDAManaged: type = "cuda_managed"; break;
    case kDLROCM: type = "rocm"; break;
    case kDLMetal: type = "mps"; break;
    case kDLOneAPI: type = "xpu"; break;
    default: return detail::StrCat("device_type(", static_cast<int>(device.device_type), "):",
                                   device.device_id);
  }
  return detail::StrCat(type, ":", device.device_id);
}

// ---------------------------------------------------------------------------
// Symbols
// ---------------------------------------------------------------------------
namespace detail {
/*! \brief "argument 'x'" when named, else "argument #k" (position in the verify chain). */
inline std::string ArgLabel(std::string_view name, int index) {
  return name.empty() ? StrCat("argument #", index) : StrCat("argument '", name, "'");
}

/*! \brief A named value that binds once and remembers which argument bound it. */
template <typename T>
class Symbol {
 public:
  explicit Symbol(std::string_view name = "") : name_(name) {}
  bool has_value() const { return value_.has_value(); }
  std::string_view name() const { return name_; }
  /*! \brief Bind explicitly (e.g. from a scalar argument); later verifies check against it. */
  void set_value(T value) { Bind(value, {}, -1); }
  T unwrap() const {
    RuntimeCheck(value_.has_value(), "symbol '", name_,
                 "' was never bound: no verified tensor used it and set_value() was not called");
    return *value_;
  }
  /*! \brief Who bound the value, for error messages. */
  std::string bound_by() const {
    return bound_index_ < 0 ? std::string("set_value()") : ArgLabel(bound_name_, bound_index_);
  }
  // Stores the raw name, not the formatted label: short names stay in SSO, no allocation.
  void Bind(T value, std::string_view arg_name, int arg_index) {
    value_ = value;
    bound_name_ = arg_name;
    bound_index_ = arg_index;
  }

 private:
  std::string name_;
  std::optional<T> value_;
  std::string bound_name_;
  int bound_index_ = -1;
};
}  // namespace detail

/*! \brief A tensor extent or stride shared between arguments. */
using SymbolicSize = detail::Symbol<int64_t>;

/*! \brief A dtype shared between arguments. */
class SymbolicDType : public detail::Symbol<DLDataType> {
 public:
  using Symbol::Symbol;
  template <typename T>
  bool is() const {
    return unwrap() == kDType<T>;
  }
};

/*! \brief A device (type and id) shared between arguments. */
using SymbolicDevice = detail::Symbol<DLDevice>;

// ---------------------------------------------------------------------------
// TensorMatcher
// ---------------------------------------------------------------------------
/*! \brief One expected extent/stride: a symbol (bound by reference), a literal, or -1 (any). */
class DimSpec {
 public:
  DimSpec(SymbolicSize& symbol) : symbol_(&symbol) {}  // NOLINT(*): implicit by design
  DimSpec(int64_t literal) : literal_(literal) {        // NOLINT(*)
    RuntimeCheck(literal >= -1, "TensorMatcher: literal must be >= 0 or -1 (any), got ", literal);
  }
  DimSpec() = default;
  SymbolicSize* symbol() const { return symbol_; }
  int64_t literal() const { return literal_; }
  std::string str() const {
    if (symbol_) return std::string(symbol_->name().empty() ? "?" : symbol_->name());
    return literal_ < 0 ? std::string("*") : std::to_string(literal_);
  }

 private:
  SymbolicSize* symbol_ = nullptr;
  int64_t literal_ = -1;
};

/*!
 * \brief Validates tensor arguments against a shape/stride/dtype/device spec.
 *
 * Setters and verify() return *this, so a temporary matcher can check several tensors in one
 * expression. Messages are only formatted on failure: the success path does not allocate.
 */
class TensorMatcher {
 public:
  static constexpr int kMaxDims = 8;

  explicit TensorMatcher(std::initializer_list<DimSpec> dims) {
    RuntimeCheck(dims.size() <= kMaxDims, "TensorMatcher supports up to ", kMaxDims,
                 " dims, got ", dims.size());
    ndim_ = static_cast<int32_t>(dims.size());
    std::copy(dims.begin(), dims.end(), dims_);
  }

  /*! \brief Prefix error messages with the op name (must outlive the matcher, e.g. a literal). */
  TensorMatcher& for_op(std::string_view op) {
    op_ = op;
    return *this;
  }

  /*! \brief Allow only the dtypes of \p Ts; with a symbol, all tensors must also share one. */
  template <typename... Ts>
  TensorMatcher& with_dtype(SymbolicDType& dtype) {
    with_dtype<Ts...>();
    dtype_ = &dtype;
    return *this;
  }
  template <typename... Ts>
  TensorMatcher& with_dtype() {
    static_assert(sizeof...(Ts) > 0, "with_dtype<>() needs at least one type");
    static constexpr DLDataType kAllowed[] = {kDType<Ts>...};
    allowed_dtypes_ = kAllowed;
    num_allowed_dtypes_ = sizeof...(Ts);
    return *this;
  }
  /*! \brief Any dtype, but shared through \p dtype (bound here or by an earlier matcher). */
  TensorMatcher& with_dtype(SymbolicDType& dtype) {
    dtype_ = &dtype;
    return *this;
  }

  /*! \brief Allow only device types \p Ts; with a symbol, type and id must also match it. */
  template <DLDeviceType... Ts>
  TensorMatcher& with_device(SymbolicDevice& device) {
    with_device<Ts...>();
    device_ = &device;
    return *this;
  }
  template <DLDeviceType... Ts>
  TensorMatcher& with_device() {
    static_assert(sizeof...(Ts) > 0, "with_device<>() needs at least one device type");
    static constexpr DLDeviceType kAllowed[] = {Ts...};
    allowed_devices_ = kAllowed;
    num_allowed_devices_ = sizeof...(Ts);
    return *this;
  }
  TensorMatcher& with_device(SymbolicDevice& device) {
    device_ = &device;
    return *this;
  }

  /*! \brief Expected strides in elements; without this call the tensor must be contiguous. */
  TensorMatcher& with_strides(std::initializer_list<DimSpec> strides) {
    RuntimeCheck(static_cast<int32_t>(strides.size()) == ndim_, "TensorMatcher: with_strides got ",
                 strides.size(), " entries for ", ndim_, " dims");
    std::copy(strides.begin(), strides.end(), strides_);
    has_strides_ = true;
    return *this;
  }

  /*!
   * \brief Check \p view against the spec, binding unbound symbols.
   * \param name Argument name for messages; empty means "argument #k", k = position in the chain.
   */
  TensorMatcher& verify(tvm::ffi::TensorView view, std::string_view name = {}) {
    const Arg arg{name, num_verified_++};
    CheckDType(view.dtype(), arg);
    CheckDevice(view.device(), arg);
    const int32_t ndim = view.ndim();
    const int64_t* shape = view.shape().data();
    if (ndim != ndim_) {
      Throw<ErrorKind::kValueError>(Prefix(arg), "expected ", ndim_, " dims ",
                                    SpecStr(dims_, ndim_), ", got ", ndim, " dims (shape ",
                                    ListStr(shape, ndim), ")");
    }
    // Contiguous views (incl. null DLPack strides) report compact strides: extents of 1 or 0
    // carry no meaningful stride, and TensorView::strides() rejects null strides.
    int64_t compact[kMaxDims];
    for (int64_t i = ndim - 1, s = 1; i >= 0; s *= shape[i], --i) compact[i] = s;
    const bool contiguous = view.IsContiguous();
    const Layout layout{shape, contiguous ? compact : view.strides().data(), ndim};
    for (int32_t i = 0; i < ndim; ++i) CheckValue(dims_[i], shape[i], arg, "dim", i, layout);
    if (has_strides_) {
      for (int32_t i = 0; i < ndim; ++i) {
        CheckValue(strides_[i], layout.strides[i], arg, "stride", i, layout);
      }
    } else if (!contiguous) {
      Throw<ErrorKind::kValueError>(Prefix(arg), "expected a contiguous tensor with strides ",
                                    ListStr(compact, ndim), ", got strides ",
                                    ListStr(layout.strides, ndim), " (shape ",
                                    ListStr(shape, ndim), ")");
    }
    return *this;
  }

 private:
  struct Arg {
    std::string_view name;
    int index;
  };
  struct Layout {
    const int64_t* shape;
    const int64_t* strides;
    int32_t ndim;
  };

  std::string Prefix(const Arg& arg) const {
    std::string label = detail::ArgLabel(arg.name, arg.index);
    return op_.empty() ? label + ": " : detail::StrCat(op_, ": ", label, ": ");
  }
  static std::string ListStr(const int64_t* v, int32_t n) {
    std::string s = "[";
    for (int32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  }
  static std::string SpecStr(const DimSpec* spec, int32_t n) {
    std::string s = "[";
    for (int32_t i = 0; i < n; ++i) s += (i ? ", " : "") + spec[i].str();
    return s + "]";
  }

  void CheckDType(DLDataType dtype, const Arg& arg) const {
    if (num_allowed_dtypes_ > 0 &&
        std::find(allowed_dtypes_, allowed_dtypes_ + num_allowed_dtypes_, dtype) ==
            allowed_dtypes_ + num_allowed_dtypes_) {
      std::string allowed;
      for (size_t i = 0; i < num_allowed_dtypes_; ++i) {
        allowed += (i ? ", " : "") + DTypeName(allowed_dtypes_[i]);
      }
      Throw<ErrorKind::kTypeError>(Prefix(arg), "expected dtype in {", allowed, "}, got ",
                                   DTypeName(dtype));
    }
    if (dtype_ == nullptr) return;
    if (!dtype_->has_value()) return dtype_->Bind(dtype, arg.name, arg.index);
    if (!(dtype_->unwrap() == dtype)) {
      Throw<ErrorKind::kTypeError>(Prefix(arg), "expected dtype ", DTypeName(dtype_->unwrap()),
                                   " (bound by ", dtype_->bound_by(), "), got ", DTypeName(dtype));
    }
  }

  void CheckDevice(DLDevice device, const Arg& arg) const {
    if (num_allowed_devices_ > 0 &&
        std::find(allowed_devices_, allowed_devices_ + num_allowed_devices_, device.device_type) ==
            allowed_devices_ + num_allowed_devices_) {
      std::string allowed;
      for (size_t i = 0; i < num_allowed_devices_; ++i) {
        std::string full = DeviceName(DLDevice{allowed_devices_[i], 0});
        allowed += (i ? ", " : "") + full.substr(0, full.find(':'));
      }
      Throw<ErrorKind::kValueError>(Prefix(arg), "expected device type in {", allowed,
                                    "}, got ", DeviceName(device));
    }
    if (device_ == nullptr) return;
    if (!device_->has_value()) return device_->Bind(device, arg.name, arg.index);
    const DLDevice bound = device_->unwrap();
    if (bound.device_type != device.device_type || bound.device_id != device.device_id) {
      Throw<ErrorKind::kValueError>(Prefix(arg), "expected device ", DeviceName(bound),
                                    " (bound by ", device_->bound_by(), "), got ",
                                    DeviceName(device));
    }
  }

  void CheckValue(const DimSpec& spec, int64_t actual, const Arg& arg, const char* what,
                  int32_t i, const Layout& layout) const {
    int64_t expected = spec.literal();
    SymbolicSize* sym = spec.symbol();
    if (sym != nullptr) {
      if (!sym->has_value()) return sym->Bind(actual, arg.name, arg.index);
      expected = sym->unwrap();
    }
    if (expected < 0 || expected == actual) return;
    std::string where = detail::StrCat(Prefix(arg), what, " ", i);
    if (sym != nullptr && !sym->name().empty()) where += detail::StrCat(" ('", sym->name(), "')");
    Throw<ErrorKind::kValueError>(
        where, " expected ", expected,
        sym != nullptr ? detail::StrCat(" (bound by ", sym->bound_by(), ")") : std::string(),
        ", got ", actual, " (shape ", ListStr(layout.shape, layout.ndim), ", strides ",
        ListStr(layout.strides, layout.ndim), ")");
  }

  DimSpec dims_[kMaxDims];
  DimSpec strides_[kMaxDims];
  int32_t ndim_ = 0;
  bool has_strides_ = false;
  int num_verified_ = 0;
  std::string_view op_;
  const DLDataType* allowed_dtypes_ = nullptr;
  size_t num_allowed_dtypes_ = 0;
  SymbolicDType* dtype_ = nullptr;
  const DLDeviceType* allowed_devices_ = nullptr;
  size_t num_allowed_devices_ = 0;
  SymbolicDevice* device_ = nullptr;
};

/*!
 * \brief The first element of a tensor as T*, honouring DLPack's byte_offset (torch views may
 * carry one). Use only after TensorMatcher checked the dtype.
 */
template <typename T>
inline T* data_ptr(tvm::ffi::TensorView t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

}  // namespace mllm_kernel::host

#endif  // MLLM_KERNEL_TENSOR_HPP_
