/*!
 * \file kernels/penalties/penalties.cpp
 * \brief CPU repetition / frequency / presence penalties, in place on logits.
 *
 * Scalar C++: the work is a sort of each row's ids (or one pass over its counts) and touches
 * only the penalized logits, so there is nothing for SIMD to win. Everything is checked before
 * the first write (ids < vocab, counts >= 0, parameters valid), so a bad call changes nothing.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::{apply_penalties_ids, apply_penalties_counts} (arguments: penalties.hpp).
 */
#include <hwy/base.h>  // hwy::float16_t / bfloat16_t and their float conversions

#include "penalties.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace mllm_kernel::cpu {

namespace penalties_detail {

using penalties::RowPenalties;

inline float ToFloat(float v) { return v; }
inline float ToFloat(hwy::float16_t v) { return hwy::F32FromF16(v); }
inline float ToFloat(hwy::bfloat16_t v) { return hwy::F32FromBF16(v); }

template <typename T>
T FromFloat(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, hwy::float16_t>) {
    return hwy::F16FromF32(v);
  } else {
    return hwy::BF16FromF32(v);
  }
}

/*! \brief The rows' parameters, each value checked (ValueError names the argument and row). */
inline std::vector<RowPenalties> CheckedParams(const float* repetition, const float* frequency,
                                               const float* presence, int64_t batch) {
  std::vector<RowPenalties> rows(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    host::ValueCheck(repetition[b] > 0.0f && std::isfinite(repetition[b]), "apply_penalties: repetition[", b,
                     "] = ", repetition[b], " must be a positive finite number");
    host::ValueCheck(std::isfinite(frequency[b]), "apply_penalties: frequency[", b, "] = ", frequency[b],
                     " must be finite");
    host::ValueCheck(std::isfinite(presence[b]), "apply_penalties: presence[", b, "] = ", presence[b],
                     " must be finite");
    rows[b] = {repetition[b], frequency[b], presence[b]};
  }
  return rows;
}

template <typename T>
void Penalize(T* row, int64_t token, int64_t count, const RowPenalties& p) {
  row[token] = FromFloat<T>(p.Apply(ToFloat(row[token]), static_cast<float>(count)));
}

/*! \brief Every id < vocab (ids < 0 are padding), checked before anything is written. */
template <typename IdT>
void CheckIds(const IdT* ids, const penalties::PenaltyArgs& a) {
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t j = 0; j < a.source_len; ++j) {
      const auto id = static_cast<int64_t>(ids[b * a.source_stride + j]);
      host::ValueCheck(id < a.vocab, "apply_penalties: token_ids (flattened)[", b * a.source_len + j, "] = ", id,
                       " is out of range [0, vocab=", a.vocab, ") (ids < 0 are padding)");
    }
  }
}

template <typename T, typename IdT>
void FromIds(T* logits, const IdT* ids, const penalties::PenaltyArgs& a, const std::vector<RowPenalties>& params) {
  std::vector<int64_t> seen;
  for (int64_t b = 0; b < a.batch; ++b) {
    seen.clear();
    for (int64_t j = 0; j < a.source_len; ++j) {
      const auto id = static_cast<int64_t>(ids[b * a.source_stride + j]);
      if (id >= 0) seen.push_back(id);
    }
    std::sort(seen.begin(), seen.end());  // equal ids become runs: one update with the run's length
    T* row = logits + b * a.logits_stride;
    for (size_t i = 0; i < seen.size();) {
      size_t end = i + 1;
      while (end < seen.size() && seen[end] == seen[i]) ++end;
      Penalize(row, seen[i], static_cast<int64_t>(end - i), params[b]);
      i = end;
    }
  }
}

template <typename T, typename C>
void FromCounts(T* logits, const C* counts, const penalties::PenaltyArgs& a, const std::vector<RowPenalties>& params) {
  for (int64_t b = 0; b < a.batch; ++b) {  // validate first: a negative count writes nothing
    for (int64_t v = 0; v < a.vocab; ++v) {
      const int64_t c = penalties::CountOf(counts + b * a.source_stride + v);
      host::ValueCheck(c >= 0, "apply_penalties: counts_or_mask (flattened)[", b * a.vocab + v, "] = ", c,
                       " is negative");
    }
  }
  for (int64_t b = 0; b < a.batch; ++b) {
    T* row = logits + b * a.logits_stride;
    const C* c = counts + b * a.source_stride;
    for (int64_t v = 0; v < a.vocab; ++v) {
      const int64_t count = penalties::CountOf(c + v);
      if (count != 0) Penalize(row, v, count, params[b]);
    }
  }
}

}  // namespace penalties_detail

/*!
 * \brief Penalize logits in place for the tokens of token_ids (ids < 0: padding), arguments:
 * penalties.hpp. An id >= vocab or a bad parameter raises ValueError before any write. error: the
 * CUDA export's record, taken for the same signature and ignored.
 */
inline void apply_penalties_ids(tvm::ffi::TensorView logits, tvm::ffi::TensorView token_ids,
                                tvm::ffi::TensorView repetition, tvm::ffi::TensorView frequency,
                                tvm::ffi::TensorView presence, tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a = penalties::VerifyPenaltiesIds<kDLCPU>(logits, token_ids, repetition, frequency, presence, error);
  const auto params = penalties_detail::CheckedParams(data_ptr<const float>(repetition), data_ptr<const float>(frequency),
                                                      data_ptr<const float>(presence), a.batch);
  host::DispatchIndex(a.source_dtype, [&]<typename IdT>() {
    penalties_detail::CheckIds(data_ptr<const IdT>(token_ids), a);  // also with vocab 0: every id is bad
    if (a.empty()) return;
    host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
      penalties_detail::FromIds(data_ptr<T>(logits), data_ptr<const IdT>(token_ids), a, params);
    });
  });
}

/*!
 * \brief Penalize logits in place by counts (int32/int64) or a bool mask, arguments:
 * penalties.hpp. A negative count or a bad parameter raises ValueError before any write.
 */
inline void apply_penalties_counts(tvm::ffi::TensorView logits, tvm::ffi::TensorView counts,
                                   tvm::ffi::TensorView repetition, tvm::ffi::TensorView frequency,
                                   tvm::ffi::TensorView presence, tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a = penalties::VerifyPenaltiesCounts<kDLCPU>(logits, counts, repetition, frequency, presence, error);
  const auto params = penalties_detail::CheckedParams(data_ptr<const float>(repetition), data_ptr<const float>(frequency),
                                                      data_ptr<const float>(presence), a.batch);
  if (a.empty()) return;
  host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
    penalties::DispatchCount(a.source_dtype, [&]<typename C>() {
      penalties_detail::FromCounts(data_ptr<T>(logits), data_ptr<const C>(counts), a, params);
    });
  });
}

}  // namespace mllm_kernel::cpu
