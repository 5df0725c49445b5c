/*!
 * \file kernels/sampling/sampling.cpp
 * \brief CPU token sampling: greedy (argmax), top-k/top-p and min-p by inverse CDF.
 *
 * Scalar C++ (the work per row is dominated by selection, not arithmetic); logits/probs in
 * float32, float16 or bfloat16, read as float32; sums in float64. The random numbers come
 * from the caller (one float32 uniform in [0, 1) per row), so CPU and CUDA pick the same token
 * for the same uniforms up to rounding at CDF boundaries.
 *
 * Selection rules (shared with sampling.cuh and the Python reference in the tests):
 *  - top-k keeps every token whose logit is >= the k-th largest logit (ties at the boundary
 *    are all kept); k <= 0 or k >= vocab disables it.
 *  - top-p then keeps the tokens with logit >= t, for the largest t whose kept mass is
 *    >= top_p * (mass kept by top-k): the smallest descending-probability prefix reaching
 *    top_p (ties included); top_p >= 1 disables it. The top token always stays.
 *  - min-p keeps the tokens with p >= min_p * max(p) (the product rounded to float32).
 *  - sampling: with w_i the kept (unnormalized) weights and Z their sum, pick the first index
 *    i, in index order, whose running sum of w exceeds u * Z.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::{greedy_sample, top_k_top_p_sample, min_p_sample}.
 */
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <hwy/base.h>  // hwy::float16_t / bfloat16_t and their float conversions

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace mllm_kernel::cpu {

namespace sampling_detail {

inline float ToFloat(float v) { return v; }
inline float ToFloat(hwy::float16_t v) { return hwy::F32FromF16(v); }
inline float ToFloat(hwy::bfloat16_t v) { return hwy::F32FromBF16(v); }

struct Rows {
  int64_t batch;
  int64_t vocab;
  int64_t stride;  // elements between rows
  DLDataType dtype;
};

// x: [batch, vocab] float32/float16/bfloat16 on CPU, unit last stride, any row stride.
inline Rows VerifyRows(const char* op, const char* name, tvm::ffi::TensorView x,
                       host::SymbolicSize& batch) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize vocab{"vocab"}, stride{"row_stride"};
  SymbolicDType dtype{"dtype"};
  TensorMatcher({batch, vocab})
      .for_op(op)
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDLCPU>()
      .with_strides({stride, 1})
      .verify(x, name);
  ValueCheck(vocab.unwrap() > 0, op, ": argument '", name, "': the vocab dim must be non-empty");
  return {batch.unwrap(), vocab.unwrap(), stride.unwrap(), dtype.unwrap()};
}

// A 1-D [batch] contiguous CPU tensor of T.
template <typename T>
inline const T* VerifyPerRow(const char* op, const char* name, tvm::ffi::TensorView t,
                             host::SymbolicSize& batch) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  TensorMatcher({batch}).for_op(op).with_device<kDLCPU>().with_dtype<T>().verify(t, name);
  return data_ptr<const T>(t);
}

inline int64_t* VerifyOut(const char* op, tvm::ffi::TensorView out, host::SymbolicSize& batch) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  TensorMatcher({batch}).for_op(op).with_dtype<int64_t>().with_device<kDLCPU>().verify(out, "out");
  return data_ptr<int64_t>(out);
}

// Calls fn(const T* base) with the row data typed by its dtype.
template <typename Fn>
inline void WithTyped(const Rows& rows, tvm::ffi::TensorView x, Fn&& fn) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  if (rows.dtype == kDType<float>) {
    fn(data_ptr<const float>(x));
  } else if (rows.dtype == kDType<float16_tag>) {
    fn(data_ptr<const hwy::float16_t>(x));
  } else {
    fn(data_ptr<const hwy::bfloat16_t>(x));
  }
}

// Inverse CDF over the kept weights (w[i] = 0 for dropped tokens), in index order.
inline int64_t SampleIndex(const std::vector<double>& w, float u) {
  double total = 0.0;
  int64_t last_kept = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    total += w[i];
    if (w[i] > 0.0) last_kept = static_cast<int64_t>(i);
  }
  const double target = static_cast<double>(u) * total;
  double cum = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0.0) continue;
    cum += w[i];
    if (cum > target) return static_cast<int64_t>(i);
  }
  return last_kept;  // u * total rounded past the sum
}

inline void CheckUniform(const char* op, float u, int64_t row) {
  host::ValueCheck(u >= 0.0f && u < 1.0f, op, ": uniforms[", row, "] = ", u,
                   " is outside [0, 1)");
}

}  // namespace sampling_detail

/*! \brief out[b] = argmax(logits[b]) (first index on ties; a NaN wins, like torch.argmax). */
inline void greedy_sample(tvm::ffi::TensorView out, tvm::ffi::TensorView logits) {
  using namespace sampling_detail;  // NOLINT(*)
  host::SymbolicSize batch{"batch"};
  const Rows rows = VerifyRows("greedy_sample", "logits", logits, batch);
  int64_t* dst = VerifyOut("greedy_sample", out, batch);
  WithTyped(rows, logits, [&](const auto* base) {
    for (int64_t b = 0; b < rows.batch; ++b) {
      const auto* row = base + b * rows.stride;
      int64_t best = 0;
      float best_v = ToFloat(row[0]);
      for (int64_t i = 1; i < rows.vocab && !std::isnan(best_v); ++i) {
        const float v = ToFloat(row[i]);
        if (v > best_v || std::isnan(v)) {
          best = i;
          best_v = v;
        }
      }
      dst[b] = best;
    }
  });
}

/*!
 * \brief Sample from softmax(logits) restricted by top-k then top-p (see the file comment).
 * \param top_k int64 [batch]; <= 0 disables. \param top_p float32 [batch] in (0, 1].
 * \param uniforms float32 [batch] in [0, 1).
 */
inline void top_k_top_p_sample(tvm::ffi::TensorView out, tvm::ffi::TensorView logits,
                               tvm::ffi::TensorView uniforms, tvm::ffi::TensorView top_k,
                               tvm::ffi::TensorView top_p) {
  using namespace sampling_detail;  // NOLINT(*)
  constexpr const char* kOp = "top_k_top_p_sample";
  host::SymbolicSize batch{"batch"};
  const Rows rows = VerifyRows(kOp, "logits", logits, batch);
  int64_t* dst = VerifyOut(kOp, out, batch);
  const float* u = VerifyPerRow<float>(kOp, "uniforms", uniforms, batch);
  const int64_t* ks = VerifyPerRow<int64_t>(kOp, "top_k", top_k, batch);
  const float* ps = VerifyPerRow<float>(kOp, "top_p", top_p, batch);
  for (int64_t b = 0; b < rows.batch; ++b) {
    host::ValueCheck(ps[b] > 0.0f && ps[b] <= 1.0f, kOp, ": top_p[", b, "] = ", ps[b],
                     " is outside (0, 1]");
    CheckUniform(kOp, u[b], b);
  }
  const int64_t n = rows.vocab;
  std::vector<float> x(n), scratch;
  std::vector<double> w(n);
  WithTyped(rows, logits, [&](const auto* base) {
    for (int64_t b = 0; b < rows.batch; ++b) {
      const auto* row = base + b * rows.stride;
      for (int64_t i = 0; i < n; ++i) x[i] = ToFloat(row[i]);
      const float row_max = *std::max_element(x.begin(), x.end());
      float threshold = -std::numeric_limits<float>::infinity();
      const int64_t k = ks[b];
      if (k > 0 && k < n) {  // k-th largest logit
        scratch.assign(x.begin(), x.end());
        std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(),
                         std::greater<float>());
        threshold = scratch[k - 1];
      }
      if (ps[b] < 1.0f) {  // walk the kept logits in descending order until top_p of the mass
        scratch.clear();
        double kept_mass = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          if (x[i] >= threshold) {
            scratch.push_back(x[i]);
            kept_mass += std::exp(static_cast<double>(x[i]) - row_max);
          }
        }
        std::sort(scratch.begin(), scratch.end(), std::greater<float>());
        const double target = static_cast<double>(ps[b]) * kept_mass;
        double cum = 0.0;
        for (const float v : scratch) {
          cum += std::exp(static_cast<double>(v) - row_max);
          if (cum >= target) {
            threshold = v;
            break;
          }
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        w[i] = x[i] >= threshold ? std::exp(static_cast<double>(x[i]) - row_max) : 0.0;
      }
      dst[b] = SampleIndex(w, u[b]);
    }
  });
}

/*!
 * \brief Sample from probs restricted to p >= min_p * max(p), renormalized.
 * \param min_p float32 [batch] in [0, 1]. \param uniforms float32 [batch] in [0, 1).
 */
inline void min_p_sample(tvm::ffi::TensorView out, tvm::ffi::TensorView probs,
                         tvm::ffi::TensorView uniforms, tvm::ffi::TensorView min_p) {
  using namespace sampling_detail;  // NOLINT(*)
  constexpr const char* kOp = "min_p_sample";
  host::SymbolicSize batch{"batch"};
  const Rows rows = VerifyRows(kOp, "probs", probs, batch);
  int64_t* dst = VerifyOut(kOp, out, batch);
  const float* u = VerifyPerRow<float>(kOp, "uniforms", uniforms, batch);
  const float* mp = VerifyPerRow<float>(kOp, "min_p", min_p, batch);
  for (int64_t b = 0; b < rows.batch; ++b) {
    host::ValueCheck(mp[b] >= 0.0f && mp[b] <= 1.0f, kOp, ": min_p[", b, "] = ", mp[b],
                     " is outside [0, 1]");
    CheckUniform(kOp, u[b], b);
  }
  const int64_t n = rows.vocab;
  std::vector<double> w(n);
  WithTyped(rows, probs, [&](const auto* base) {
    for (int64_t b = 0; b < rows.batch; ++b) {
      const auto* row = base + b * rows.stride;
      float max_p = ToFloat(row[0]);
      for (int64_t i = 1; i < n; ++i) max_p = std::max(max_p, ToFloat(row[i]));
      const float threshold = mp[b] * max_p;  // float32, as on CUDA
      for (int64_t i = 0; i < n; ++i) {
        const float p = ToFloat(row[i]);
        w[i] = p >= threshold ? static_cast<double>(p) : 0.0;
      }
      dst[b] = SampleIndex(w, u[b]);
    }
  });
}

}  // namespace mllm_kernel::cpu
