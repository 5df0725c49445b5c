/*!
 * \file kernels/sampling/sampling.cpp
 * \brief CPU token sampling: greedy (argmax), top-k/top-p and min-p by inverse CDF, and the
 *        top-k / top-p filters.
 *
 * greedy and min-p are vectorized with Highway (sampling-inl.h, dynamic dispatch); the rest is
 * scalar C++ (the work per row is dominated by selection, not arithmetic); logits/probs in
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
 * mllm_kernel::cpu::{greedy_sample, top_k_top_p_sample, min_p_sample, top_k_mask_logits,
 * top_k_renorm_probs, top_p_renorm_probs} (arguments: sampling.hpp). The CPU also checks the
 * per-row parameter values (CUDA clamps them: no host read of device data).
 */
#include <hwy/base.h>  // hwy::float16_t / bfloat16_t and their float conversions

#include "sampling.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "sampling-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "sampling-inl.h"
#include "mllm_kernel/cpu/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#if HWY_ONCE
namespace mllm_kernel::cpu {

namespace sampling_detail {

inline float ToFloat(float v) { return v; }
inline float ToFloat(hwy::float16_t v) { return hwy::F32FromF16(v); }
// bfloat16 -> float by its bits: exact, and no library call per element (some compilers turn
// a native __bf16 conversion into one, which made bf16 rows 4x slower than float32 ones).
inline float ToFloat(hwy::bfloat16_t v) {
  uint16_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

// Inverse CDF over the kept weights weight(i) (0 for dropped tokens), in index order: two passes
// over weight, which may compute its values from the row rather than read them from a vector.
template <typename Weight>
inline int64_t SampleIndex(int64_t n, Weight&& weight, float u) {
  double total = 0.0;
  int64_t last_kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = weight(i);
    total += w;
    if (w > 0.0) last_kept = i;
  }
  const double target = static_cast<double>(u) * total;
  double cum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = weight(i);
    if (w <= 0.0) continue;
    cum += w;
    if (cum > target) return i;
  }
  return last_kept;  // u * total rounded past the sum
}
inline int64_t SampleIndex(const std::vector<double>& w, float u) {
  return SampleIndex(static_cast<int64_t>(w.size()), [&](int64_t i) { return w[i]; }, u);
}

// The k-th largest of x; -inf (keep all) unless 0 < k < n. Small k: a min-heap of the k largest
// seen, which most elements only compare against its top (one pass, no copy of the row);
// large k: partial selection of a copy.
inline float TopKThreshold(const std::vector<float>& x, int64_t k, std::vector<float>& scratch) {
  if (k <= 0 || k >= static_cast<int64_t>(x.size())) return -std::numeric_limits<float>::infinity();
  constexpr int64_t kHeapLimit = 1024;
  if (k <= kHeapLimit) {
    scratch.assign(x.begin(), x.begin() + k);
    std::make_heap(scratch.begin(), scratch.end(), std::greater<float>());  // top: the smallest
    for (size_t i = static_cast<size_t>(k); i < x.size(); ++i) {
      if (x[i] > scratch.front()) {
        std::pop_heap(scratch.begin(), scratch.end(), std::greater<float>());
        scratch.back() = x[i];
        std::push_heap(scratch.begin(), scratch.end(), std::greater<float>());
      }
    }
    return scratch.front();
  }
  scratch.assign(x.begin(), x.end());
  std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), std::greater<float>());
  return scratch[k - 1];
}

// Order-preserving map float -> uint32 (for non-NaN); -0 and +0 map to the same key.
inline uint32_t Key(float f) {
  if (f == 0.0f) f = 0.0f;
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

inline float FromKey(uint32_t key) {
  const uint32_t u = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

/*!
 * \brief The largest t such that the elements of x with t <= x (and floor <= x) weigh >= need > 0:
 *        the top-p threshold without sorting the row. Radix selection on Key, 8 bits per pass
 *        from the top (as on CUDA); a pass stops early once its bin holds one element.
 */
template <typename WeightFn>
float MassThreshold(const std::vector<float>& x, float floor, double need, WeightFn&& weight) {
  const uint32_t floor_key = Key(floor);
  uint32_t prefix = 0, prefix_mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    double mass[256] = {};
    uint32_t count[256] = {};
    for (const float v : x) {
      const uint32_t key = Key(v);
      if (key < floor_key || (key & prefix_mask) != prefix) continue;
      const uint32_t digit = (key >> shift) & 0xffu;
      mass[digit] += weight(v);
      ++count[digit];
    }
    int digit = 255;  // the bin where the mass counted from the top reaches need
    double above = 0.0;
    for (; digit > 0 && above + mass[digit] < need; --digit) above += mass[digit];
    need -= above;
    prefix |= static_cast<uint32_t>(digit) << shift;
    prefix_mask |= 0xffu << shift;
    if (count[digit] <= 1) break;  // keys >= the bin's lowest key select the same elements
  }
  return std::max(FromKey(prefix), floor);
}

template <typename T>
T FromFloat(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, hwy::float16_t>) return hwy::F16FromF32(v);
  else return hwy::BF16FromF32(v);
}

// Workers for a row op: waking a pool thread and its first touch of its scratch cost
// microseconds, so each gets at least `min_elements` of the rows' elements (and whole rows).
inline int64_t RowWorkers(const char* op, int64_t num_threads, const sampling::SampleArgs& rows,
                          int64_t min_elements) {
  const int64_t worth = (rows.batch * rows.vocab + min_elements - 1) / min_elements;
  return WorkerCount(op, num_threads, std::min(rows.batch, worth));
}
constexpr int64_t kMinElementsPerWorker = int64_t{1} << 14;  // the selection and sampling ops
constexpr int64_t kMinArgMaxElementsPerWorker = int64_t{1} << 18;  // argmax: a fast streaming pass

// Per-worker buffers of a row op, made by each worker on its first row (first-touching the
// pages in parallel).
struct RowScratch {
  std::vector<float> x, selection;  // the row as float; the top-k / top-p selection's candidates
  std::vector<double> weights;
  RowScratch(int64_t vocab, bool with_weights)
      : x(static_cast<size_t>(vocab)), weights(with_weights ? static_cast<size_t>(vocab) : 0) {
    selection.reserve(static_cast<size_t>(vocab));
  }
};

// Runs fn(row, scratch) over the rows on `workers` workers (rows are independent, so results do
// not depend on the thread count).
template <typename Fn>
void ForEachRow(int64_t batch, int64_t vocab, int64_t workers, bool with_weights, Fn&& fn) {
  std::vector<std::optional<RowScratch>> scratch(static_cast<size_t>(workers));
  ParallelFor(batch, workers, 1, [&](int64_t worker, int64_t begin, int64_t end) {
    std::optional<RowScratch>& own = scratch[static_cast<size_t>(worker)];
    if (!own) own.emplace(vocab, with_weights);
    for (int64_t b = begin; b < end; ++b) fn(b, *own);
  });
}

// Runs fn(row index, row as float, selection scratch, write) over the rows of a filter op.
template <typename Fn>
void ForEachFilteredRow(const char* op, const sampling::SampleArgs& rows, tvm::ffi::TensorView out,
                        tvm::ffi::TensorView in, int64_t num_threads, Fn&& fn) {
  const int64_t workers = RowWorkers(op, num_threads, rows, kMinElementsPerWorker);
  host::DispatchFloat<kDLCPU>(rows.dtype, [&]<typename T>() {
    const T* base = host::data_ptr<const T>(in);
    T* dst = host::data_ptr<T>(out);
    ForEachRow(rows.batch, rows.vocab, workers, false, [&](int64_t b, RowScratch& own) {
      const T* row = base + b * rows.stride;
      for (int64_t i = 0; i < rows.vocab; ++i) own.x[i] = ToFloat(row[i]);
      fn(b, own.x, own.selection, [&](int64_t i, float v) { dst[b * rows.vocab + i] = FromFloat<T>(v); });
    });
  });
}

inline void CheckUniform(const char* op, float u, int64_t row) {
  host::ValueCheck(u >= 0.0f && u < 1.0f, op, ": uniforms[", row, "] = ", u,
                   " is outside [0, 1)");
}

}  // namespace sampling_detail

/*! \brief out[b] = argmax(logits[b]) (first index on ties; a NaN wins, like torch.argmax);
 *  Highway, dynamic dispatch (sampling-inl.h). */
inline void greedy_sample(tvm::ffi::TensorView out, tvm::ffi::TensorView logits, int64_t num_threads) {
  using host::data_ptr;
  const auto rows = mllm_kernel::sampling::VerifyGreedySample<kDLCPU>(out, logits);
  const int64_t workers =
      sampling_detail::RowWorkers("greedy_sample", num_threads, rows, sampling_detail::kMinArgMaxElementsPerWorker);
  host::DispatchFloat<kDLCPU>(rows.dtype, [&]<typename T>() {
    HWY_EXPORT_T(Table, sampling_detail::ArgMaxRows<T>);
    ParallelFor(rows.batch, workers, 1, [&](int64_t, int64_t begin, int64_t end) {
      HWY_DYNAMIC_DISPATCH_T(Table)(data_ptr<int64_t>(out) + begin, data_ptr<const T>(logits) + begin * rows.stride,
                                    end - begin, rows.vocab, rows.stride);
    });
  });
}

/*!
 * \brief Sample from softmax(logits) restricted by top-k then top-p (see the file comment).
 * \param top_k int64 [batch]; <= 0 disables. \param top_p float32 [batch] in (0, 1].
 * \param uniforms float32 [batch] in [0, 1).
 */
inline void top_k_top_p_sample(tvm::ffi::TensorView out, tvm::ffi::TensorView logits,
                               tvm::ffi::TensorView uniforms, tvm::ffi::TensorView top_k,
                               tvm::ffi::TensorView top_p, int64_t num_threads) {
  using namespace sampling_detail;  // NOLINT(*)
  using host::data_ptr;
  constexpr const char* kOp = "top_k_top_p_sample";
  const auto rows =
      mllm_kernel::sampling::VerifyTopKTopPSample<kDLCPU>(out, logits, uniforms, top_k, top_p);
  int64_t* dst = data_ptr<int64_t>(out);
  const float* u = data_ptr<const float>(uniforms);
  const int64_t* ks = data_ptr<const int64_t>(top_k);
  const float* ps = data_ptr<const float>(top_p);
  for (int64_t b = 0; b < rows.batch; ++b) {
    host::ValueCheck(ps[b] > 0.0f && ps[b] <= 1.0f, kOp, ": top_p[", b, "] = ", ps[b],
                     " is outside (0, 1]");
    CheckUniform(kOp, u[b], b);
  }
  const int64_t n = rows.vocab;
  const int64_t workers = RowWorkers(kOp, num_threads, rows, kMinElementsPerWorker);
  host::DispatchFloat<kDLCPU>(rows.dtype, [&]<typename T>() {
    const T* base = data_ptr<const T>(logits);
    ForEachRow(rows.batch, n, workers, true, [&](int64_t b, RowScratch& own) {
      std::vector<float>& x = own.x;
      std::vector<float>& scratch = own.selection;  // the top-k selection's copy, then the survivors
      std::vector<double>& w = own.weights;
      const T* row = base + b * rows.stride;
      for (int64_t i = 0; i < n; ++i) x[i] = ToFloat(row[i]);
      const float row_max = *std::max_element(x.begin(), x.end());
      float threshold = TopKThreshold(x, ks[b], scratch);  // the k-th largest logit
      if (ps[b] < 1.0f) {  // the largest threshold keeping top_p of the top-k set's mass
        auto weight = [&](float v) { return std::exp(static_cast<double>(v) - row_max); };
        scratch.clear();  // the top-k survivors: few when top-k is on, so the search stays small
        double kept_mass = 0.0;
        for (const float v : x) {
          if (v >= threshold) {
            scratch.push_back(v);
            kept_mass += weight(v);
          }
        }
        if (kept_mass > 0.0) threshold = MassThreshold(scratch, threshold, ps[b] * kept_mass, weight);
      }
      for (int64_t i = 0; i < n; ++i) {
        w[i] = x[i] >= threshold ? std::exp(static_cast<double>(x[i]) - row_max) : 0.0;
      }
      dst[b] = SampleIndex(w, u[b]);
    });
  });
}

/*!
 * \brief Sample from probs restricted to p >= min_p * max(p), renormalized.
 * \param min_p float32 [batch] in [0, 1]. \param uniforms float32 [batch] in [0, 1).
 */
inline void min_p_sample(tvm::ffi::TensorView out, tvm::ffi::TensorView probs,
                         tvm::ffi::TensorView uniforms, tvm::ffi::TensorView min_p, int64_t num_threads) {
  using namespace sampling_detail;  // NOLINT(*)
  using host::data_ptr;
  constexpr const char* kOp = "min_p_sample";
  const auto rows = mllm_kernel::sampling::VerifyMinPSample<kDLCPU>(out, probs, uniforms, min_p);
  int64_t* dst = data_ptr<int64_t>(out);
  const float* u = data_ptr<const float>(uniforms);
  const float* mp = data_ptr<const float>(min_p);
  for (int64_t b = 0; b < rows.batch; ++b) {
    host::ValueCheck(mp[b] >= 0.0f && mp[b] <= 1.0f, kOp, ": min_p[", b, "] = ", mp[b],
                     " is outside [0, 1]");
    CheckUniform(kOp, u[b], b);
  }
  const int64_t n = rows.vocab;
  const int64_t workers = RowWorkers(kOp, num_threads, rows, kMinElementsPerWorker);
  host::DispatchFloat<kDLCPU>(rows.dtype, [&]<typename T>() {
    HWY_EXPORT_T(Table, sampling_detail::MinPRow<T>);
    const T* base = data_ptr<const T>(probs);
    ForEachRow(rows.batch, n, workers, false, [&](int64_t b, RowScratch&) {
      const T* row = base + b * rows.stride;
      if (const int64_t token = HWY_DYNAMIC_DISPATCH_T(Table)(row, n, mp[b], u[b]); token >= 0) {
        dst[b] = token;  // Highway (sampling-inl.h); rows with a NaN take the loops below
        return;
      }
      float max_p = ToFloat(row[0]);
      for (int64_t i = 1; i < n; ++i) max_p = std::max(max_p, ToFloat(row[i]));
      const float threshold = mp[b] * max_p;  // float32, as on CUDA
      // The kept probabilities straight from the row (a worker's cache holds it), no vector of
      // doubles written and read back.
      dst[b] = SampleIndex(
          n,
          [&](int64_t i) {
            const float p = ToFloat(row[i]);
            return p >= threshold ? static_cast<double>(p) : 0.0;
          },
          u[b]);
    });
  });
}

/*! \brief out = logits, with logits below the row's k-th largest set to -inf (ties kept);
 *  top_k int64 [batch]: <= 0 or >= vocab keeps the row. */
inline void top_k_mask_logits(tvm::ffi::TensorView out, tvm::ffi::TensorView logits, tvm::ffi::TensorView top_k,
                              int64_t num_threads) {
  using namespace sampling_detail;  // NOLINT(*)
  constexpr const char* kOp = "top_k_mask_logits";
  const auto rows = sampling::VerifyFilter<kDLCPU, int64_t>(kOp, "logits", "top_k", out, logits, top_k);
  const int64_t* ks = host::data_ptr<const int64_t>(top_k);
  ForEachFilteredRow(kOp, rows, out, logits, num_threads, [&](int64_t b, const std::vector<float>& x,
                                                              std::vector<float>& scratch, auto&& write) {
    const float kth = TopKThreshold(x, ks[b], scratch);
    for (int64_t i = 0; i < rows.vocab; ++i) write(i, x[i] >= kth ? x[i] : -std::numeric_limits<float>::infinity());
  });
}

/*! \brief out = probs kept by top-k (ties kept) divided by their sum, the others 0; a row that
 *  keeps no mass is written as zeros. */
inline void top_k_renorm_probs(tvm::ffi::TensorView out, tvm::ffi::TensorView probs, tvm::ffi::TensorView top_k,
                               int64_t num_threads) {
  using namespace sampling_detail;  // NOLINT(*)
  constexpr const char* kOp = "top_k_renorm_probs";
  const auto rows = sampling::VerifyFilter<kDLCPU, int64_t>(kOp, "probs", "top_k", out, probs, top_k);
  const int64_t* ks = host::data_ptr<const int64_t>(top_k);
  ForEachFilteredRow(kOp, rows, out, probs, num_threads, [&](int64_t b, const std::vector<float>& x,
                                                             std::vector<float>& scratch, auto&& write) {
    const float kth = TopKThreshold(x, ks[b], scratch);
    double kept = 0.0;
    for (const float p : x) kept += p >= kth ? static_cast<double>(p) : 0.0;
    const double inv = kept > 0.0 ? 1.0 / kept : 0.0;
    for (int64_t i = 0; i < rows.vocab; ++i) write(i, x[i] >= kth ? static_cast<float>(x[i] * inv) : 0.0f);
  });
}

/*! \brief out = probs of the smallest descending prefix with mass >= top_p of the row's mass
 *  (ties kept) divided by their sum, the others 0. top_p float32 [batch] in (0, 1]. */
inline void top_p_renorm_probs(tvm::ffi::TensorView out, tvm::ffi::TensorView probs, tvm::ffi::TensorView top_p,
                               int64_t num_threads) {
  using namespace sampling_detail;  // NOLINT(*)
  constexpr const char* kOp = "top_p_renorm_probs";
  const auto rows = sampling::VerifyFilter<kDLCPU, float>(kOp, "probs", "top_p", out, probs, top_p);
  const float* ps = host::data_ptr<const float>(top_p);
  for (int64_t b = 0; b < rows.batch; ++b) {
    host::ValueCheck(ps[b] > 0.0f && ps[b] <= 1.0f, kOp, ": top_p[", b, "] = ", ps[b], " is outside (0, 1]");
  }
  ForEachFilteredRow(kOp, rows, out, probs, num_threads, [&](int64_t b, const std::vector<float>& x,
                                                             std::vector<float>&, auto&& write) {
    float threshold = -std::numeric_limits<float>::infinity();
    auto weight = [](float p) { return p > 0.0f ? static_cast<double>(p) : 0.0; };
    double total = 0.0;
    for (const float p : x) total += weight(p);
    if (ps[b] < 1.0f && total > 0.0) threshold = MassThreshold(x, threshold, ps[b] * total, weight);
    double kept = 0.0;
    for (const float p : x) kept += p >= threshold && p > 0.0f ? static_cast<double>(p) : 0.0;
    const double inv = kept > 0.0 ? 1.0 / kept : 0.0;
    for (int64_t i = 0; i < rows.vocab; ++i) write(i, x[i] >= threshold ? static_cast<float>(x[i] * inv) : 0.0f);
  });
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
