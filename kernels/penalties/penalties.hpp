/*!
 * \file kernels/penalties/penalties.hpp
 * \brief The argument contract of apply_penalties_ids and apply_penalties_counts, and the
 * penalty rule, shared by the CPU (penalties.cpp) and CUDA (penalties.cuh) entry points.
 *
 * logits (written in place): [batch, vocab] float32/float16/bfloat16, unit last stride, rows not
 * overlapping; token_ids: [batch, L] int32/int64, unit last stride; counts: [batch, vocab]
 * int32/int64/bool, unit last stride; repetition / frequency / presence: float32 [batch]; error:
 * int64 [3], the device-error record {flag, flattened index, value} CUDA fills for an id >= vocab
 * or a negative count (the CPU raises instead). All on one device; logits shares no memory with
 * the others.
 */
#ifndef MLLM_KERNEL_KERNELS_PENALTIES_HPP_
#define MLLM_KERNEL_KERNELS_PENALTIES_HPP_

#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/rows.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#ifdef __CUDACC__
#define MLLM_KERNEL_PENALTIES_HD __host__ __device__ __forceinline__
#else
#define MLLM_KERNEL_PENALTIES_HD inline
#endif

namespace mllm_kernel::penalties {

/*! \brief One row's penalties, already made valid (see Sanitized). */
struct RowPenalties {
  float repetition, frequency, presence;

  /*! \brief The penalized logit of a token seen `count` > 0 times (float32 math, as on both devices). */
  MLLM_KERNEL_PENALTIES_HD float Apply(float x, float count) const {
#ifdef __CUDA_ARCH__
    // Each operation rounded on its own: nvcc would fuse a multiply with an add into an FMA (one
    // rounding fewer than the CPU build, which targets baseline x86-64), and the devices must agree.
    x = x > 0.0f ? __fdiv_rn(x, repetition) : __fmul_rn(x, repetition);
    return __fsub_rn(x, __fadd_rn(__fmul_rn(frequency, count), presence));
#else
    x = x > 0.0f ? x / repetition : x * repetition;
    return x - (frequency * count + presence);
#endif
  }

  /*! \brief CUDA cannot raise on device values: a bad one acts as its no-op value. */
  MLLM_KERNEL_PENALTIES_HD static RowPenalties Sanitized(float repetition, float frequency, float presence) {
    const bool rep_ok = repetition > 0.0f && repetition <= 3.402823466e38f;  // false for NaN
    const auto finite = [](float v) { return v >= -3.402823466e38f && v <= 3.402823466e38f; };
    return {rep_ok ? repetition : 1.0f, finite(frequency) ? frequency : 0.0f, finite(presence) ? presence : 0.0f};
  }
};

/*! \brief A verified call. `source_stride`: token_ids' or counts' row stride (elements). */
struct PenaltyArgs {
  DLDataType dtype, source_dtype;
  DLDevice device;
  int64_t batch, vocab, logits_stride, source_len, source_stride;
  bool empty() const { return batch == 0 || vocab == 0; }
};

/*! \brief The shared part: logits, the three per-row parameters, the error record, no aliasing.
 *  `source_dims` is token_ids' [batch, L] or counts' [batch, vocab]. */
template <DLDeviceType kDev>
struct PenaltyVerifier {
  const char* op = "apply_penalties";
  host::SymbolicSize batch{"batch"}, vocab{"vocab"};
  host::SymbolicDType dtype{"dtype"};
  host::SymbolicDevice device{"device"};

  int64_t Logits(tvm::ffi::TensorView logits) {
    return host::VerifyFloatRows<kDev>(op, logits, "logits", batch, vocab, dtype, device, /*written=*/true);
  }

  void Params(tvm::ffi::TensorView repetition, tvm::ffi::TensorView frequency, tvm::ffi::TensorView presence,
              tvm::ffi::TensorView error) {
    using namespace mllm_kernel::host;  // NOLINT(*)
    for (auto [t, name] : {std::pair{repetition, "repetition"}, {frequency, "frequency"}, {presence, "presence"}}) {
      TensorMatcher({batch}).for_op(op).with_dtype<float>().with_device(device).verify(t, name);
    }
    if constexpr (kDev == kDLCUDA) {  // the CPU raises at once and ignores the record
      TensorMatcher({3}).for_op(op).with_dtype<int64_t>().with_device(device).verify(error, "error");
    }
  }
};

/*! \brief apply_penalties_ids(logits, token_ids, repetition, frequency, presence, error). */
template <DLDeviceType kDev>
PenaltyArgs VerifyPenaltiesIds(tvm::ffi::TensorView logits, tvm::ffi::TensorView token_ids,
                               tvm::ffi::TensorView repetition, tvm::ffi::TensorView frequency,
                               tvm::ffi::TensorView presence, tvm::ffi::TensorView error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  PenaltyVerifier<kDev> v;
  const int64_t logits_stride = v.Logits(logits);
  SymbolicSize len{"num_ids"}, stride{"token_ids_row_stride"};
  SymbolicDType id_dtype;
  TensorMatcher({v.batch, len})
      .for_op(v.op)
      .template with_dtype<int32_t, int64_t>(id_dtype)
      .with_device(v.device)
      .with_strides({stride, 1})
      .verify(token_ids, "token_ids");
  v.Params(repetition, frequency, presence, error);
  CheckNoAliasing(v.op, {{logits, "logits"}},
                  {{token_ids, "token_ids"}, {repetition, "repetition"}, {frequency, "frequency"},
                   {presence, "presence"}, {error, "error"}});
  if constexpr (kDev == kDLCUDA) {
    ValueCheck(v.vocab.unwrap() <= 0x7fffffff && len.unwrap() <= 0x7fffffff, v.op,
               ": vocab and num_ids must be below 2^31 on CUDA (32-bit counts), got ", v.vocab.unwrap(), " and ",
               len.unwrap());
  }
  return {v.dtype.unwrap(), id_dtype.unwrap(), v.device.unwrap(), v.batch.unwrap(), v.vocab.unwrap(),
          logits_stride,    len.unwrap(),      stride.unwrap()};
}

/*! \brief apply_penalties_counts(logits, counts, repetition, frequency, presence, error). */
template <DLDeviceType kDev>
PenaltyArgs VerifyPenaltiesCounts(tvm::ffi::TensorView logits, tvm::ffi::TensorView counts,
                                  tvm::ffi::TensorView repetition, tvm::ffi::TensorView frequency,
                                  tvm::ffi::TensorView presence, tvm::ffi::TensorView error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  PenaltyVerifier<kDev> v;
  const int64_t logits_stride = v.Logits(logits);
  SymbolicSize stride{"counts_or_mask_row_stride"};
  SymbolicDType count_dtype;
  TensorMatcher({v.batch, v.vocab})
      .for_op(v.op)
      .template with_dtype<int32_t, int64_t, bool>(count_dtype)
      .with_device(v.device)
      .with_strides({stride, 1})
      .verify(counts, "counts_or_mask");
  v.Params(repetition, frequency, presence, error);
  CheckNoAliasing(v.op, {{logits, "logits"}},
                  {{counts, "counts_or_mask"}, {repetition, "repetition"}, {frequency, "frequency"},
                   {presence, "presence"}, {error, "error"}});
  return {v.dtype.unwrap(), count_dtype.unwrap(), v.device.unwrap(), v.batch.unwrap(), v.vocab.unwrap(),
          logits_stride,    v.vocab.unwrap(),     stride.unwrap()};
}

/*! \brief A count element as a number; a bool counts 1 for any nonzero byte (torch may hold other
 *  values than 0 and 1 in a bool tensor's bytes, e.g. after a view from uint8). */
template <typename C>
MLLM_KERNEL_PENALTIES_HD int64_t CountOf(const C* p) {
  if constexpr (std::is_same_v<C, bool>) {
    return *reinterpret_cast<const uint8_t*>(p) != 0 ? 1 : 0;
  } else {
    return static_cast<int64_t>(*p);
  }
}

/*! \brief Call `fn.template operator()<C>()` with C the count element type (int32, int64, bool). */
template <typename Fn>
decltype(auto) DispatchCount(DLDataType dtype, Fn&& fn) {
  if (dtype == host::kDType<bool>) return fn.template operator()<bool>();
  return host::DispatchIndex(dtype, static_cast<Fn&&>(fn));
}

}  // namespace mllm_kernel::penalties

#undef MLLM_KERNEL_PENALTIES_HD

#endif  // MLLM_KERNEL_KERNELS_PENALTIES_HPP_
