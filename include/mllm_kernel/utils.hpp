/*!
 * \file mllm_kernel/utils.hpp
 * \brief Host-side checks and small helpers shared by CPU and CUDA kernels.
 *
 * Every failure is raised through TVM_FFI_THROW so that it crosses the FFI
 * boundary as a Python exception (RuntimeError / ValueError / TypeError)
 * carrying the message, instead of aborting the process.
 */
#ifndef MLLM_KERNEL_UTILS_HPP_
#define MLLM_KERNEL_UTILS_HPP_

#include <dlpack/dlpack.h>
#include <tvm/ffi/error.h>

#include <concepts>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>

namespace mllm_kernel::host {

/*! \brief Python exception type that a failed check raises. */
enum class ErrorKind : int { kRuntimeError, kValueError, kTypeError };

namespace detail {

template <typename... Args>
inline std::string StrCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// TVM_FFI_THROW stringifies its kind, so each kind needs its own literal call.
[[noreturn]] TVM_FFI_COLD_CODE TVM_FFI_NO_INLINE inline void ThrowError(ErrorKind kind,
                                                                        const std::string& msg) {
  switch (kind) {
    case ErrorKind::kValueError:
      TVM_FFI_THROW(ValueError) << msg;
    case ErrorKind::kTypeError:
      TVM_FFI_THROW(TypeError) << msg;
    default:
      TVM_FFI_THROW(RuntimeError) << msg;
  }
  TVM_FFI_UNREACHABLE();
}

}  // namespace detail

/*! \brief Raise a Python exception of type \p Kind whose message streams all \p msg parts. */
template <ErrorKind Kind = ErrorKind::kRuntimeError, typename... Args>
[[noreturn]] inline void Throw(const Args&... msg) {
  detail::ThrowError(Kind, detail::StrCat(msg...));
}

/*! \brief Raise a Python exception of type \p Kind unless \p cond holds. */
template <ErrorKind Kind = ErrorKind::kRuntimeError, typename... Args>
TVM_FFI_INLINE void Check(bool cond, const Args&... msg) {
  // Message formatting stays out of the hot path: it only happens on failure.
  if (TVM_FFI_PREDICT_FALSE(!cond)) Throw<Kind>(msg...);
}

/*! \brief Check an internal invariant; raises RuntimeError. */
template <typename... Args>
TVM_FFI_INLINE void RuntimeCheck(bool cond, const Args&... msg) {
  Check<ErrorKind::kRuntimeError>(cond, msg...);
}

/*! \brief Check a caller-provided value (shape, size, option); raises ValueError. */
template <typename... Args>
TVM_FFI_INLINE void ValueCheck(bool cond, const Args&... msg) {
  Check<ErrorKind::kValueError>(cond, msg...);
}

/*! \brief Check a caller-provided type (dtype); raises TypeError. */
template <typename... Args>
TVM_FFI_INLINE void TypeCheck(bool cond, const Args&... msg) {
  Check<ErrorKind::kTypeError>(cond, msg...);
}

/*! \brief Unconditionally raise RuntimeError (unreachable branches, unsupported cases). */
template <typename... Args>
[[noreturn]] inline void Panic(const Args&... msg) {
  Throw<ErrorKind::kRuntimeError>(msg...);
}

/*! \brief ceil(a / b) for integral a >= 0, b > 0, without the overflow of (a + b - 1) / b. */
template <std::integral T, std::integral U>
constexpr std::common_type_t<T, U> div_ceil(T a, U b) {
  using R = std::common_type_t<T, U>;
  return static_cast<R>(a) / static_cast<R>(b) + (static_cast<R>(a) % static_cast<R>(b) != 0);
}

/*! \brief Bytes per element of \p dtype (bits * lanes / 8); ValueError for sub-byte types. */
inline int64_t dtype_bytes(DLDataType dtype) {
  ValueCheck(dtype.bits % 8 == 0 && dtype.bits > 0, "dtype_bytes: sub-byte dtype (code=",
             static_cast<int>(dtype.code), ", bits=", static_cast<int>(dtype.bits),
             ", lanes=", dtype.lanes, ") has no whole-byte element size");
  return static_cast<int64_t>(dtype.bits) * static_cast<int64_t>(dtype.lanes) / 8;
}

}  // namespace mllm_kernel::host

#endif  // MLLM_KERNEL_UTILS_HPP_
