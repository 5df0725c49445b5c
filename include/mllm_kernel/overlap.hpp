/*!
 * \file mllm_kernel/overlap.hpp
 * \brief Memory-overlap checks for the arguments an op writes: internal overlap (an element
 * reachable through two indices) and sharing between two tensors.
 *
 * \code{.cpp}
 *   // fused_add_rms_norm writes x and residual and reads weight:
 *   CheckNoAliasing("fused_add_rms_norm", {{x, "x"}, {residual, "residual"}}, {{weight, "weight"}});
 * \endcode
 *
 * What is exact and what is conservative:
 *  - Internal overlap: exact for every layout in which each stride (by increasing stride, dims
 *    of size > 1) exceeds the extent of the dims with smaller strides, which includes every view
 *    of a tensor that slicing, transposing, narrowing and expanding produce. A stride-0 dim of
 *    size > 1 (an expanded tensor) or a stride smaller than the extent of the dims inside it
 *    (e.g. [T, H, D] with token stride < H * D) overlaps. Interleaved strides that torch's
 *    as_strided can build (e.g. shape [3, 2], strides [2, 3]) are reported as overlapping.
 *  - Two tensors: disjoint byte ranges never overlap. For "rows of contiguous blocks with one
 *    outer stride" (contiguous tensors, row-strided 2-D tensors, [T, H, D] with strides
 *    (S, D, 1), e.g. q and k as interleaved slices of one fused qkv tensor) the answer is exact
 *    (integer arithmetic on the byte offset modulo the stride) when both tensors have the same
 *    row stride or one of them is a single block. Otherwise intersecting byte ranges are
 *    reported as overlapping (conservative).
 * Tensors on different devices or with no elements never overlap. All checks are a few integer
 * operations per dim; nothing allocates unless a check fails.
 */
#ifndef MLLM_KERNEL_OVERLAP_HPP_
#define MLLM_KERNEL_OVERLAP_HPP_

#include <dlpack/dlpack.h>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace mllm_kernel::host {

namespace overlap_detail {

constexpr int kMaxDims = 16;

/*! \brief A tensor's layout in bytes: the address of element 0 and (size, byte stride) per
 * dim, dims of size 1 dropped. */
struct ByteLayout {
  int64_t base = 0;
  int32_t ndim = 0;
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];
  int64_t elem = 1;
  bool empty = false;
  DLDevice device{};

  /*! \brief [lo, hi): every byte an element of the tensor touches. */
  int64_t lo() const {
    int64_t v = base;
    for (int32_t i = 0; i < ndim; ++i) v += std::min<int64_t>(0, (size[i] - 1) * stride[i]);
    return v;
  }
  int64_t hi() const {
    int64_t v = base + elem;
    for (int32_t i = 0; i < ndim; ++i) v += std::max<int64_t>(0, (size[i] - 1) * stride[i]);
    return v;
  }
};

inline ByteLayout Describe(const tvm::ffi::TensorView& t) {
  ByteLayout l;
  l.device = t.device();
  l.base = static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr())) +
           static_cast<int64_t>(t.byte_offset());
  const DLDataType dtype = t.dtype();
  l.elem = std::max<int64_t>(1, static_cast<int64_t>(dtype.bits) * dtype.lanes / 8);
  const int32_t ndim = t.ndim();
  RuntimeCheck(ndim <= kMaxDims, "overlap check: tensors of up to ", kMaxDims, " dims, got ", ndim);
  const int64_t* shape = t.shape().data();
  // Contiguous views may carry null DLPack strides: use the compact strides then.
  const bool contiguous = t.IsContiguous();
  const int64_t* strides = contiguous ? nullptr : t.strides().data();
  int64_t compact = 1;
  int64_t kept_size[kMaxDims], kept_stride[kMaxDims];
  int32_t kept = 0;
  for (int32_t i = ndim - 1; i >= 0; --i) {
    const int64_t stride = strides ? strides[i] : compact;
    compact *= shape[i];
    if (shape[i] == 0) l.empty = true;
    if (shape[i] == 1) continue;
    kept_size[kept] = shape[i];
    kept_stride[kept] = stride * l.elem;
    ++kept;
  }
  // kept_* run from the innermost dim outwards; store outermost first.
  l.ndim = kept;
  for (int32_t i = 0; i < kept; ++i) {
    l.size[i] = kept_size[kept - 1 - i];
    l.stride[i] = kept_stride[kept - 1 - i];
  }
  return l;
}

/*! \brief The first dim (outermost first) at which `l` overlaps itself, or -1: dims sorted by
 * |stride|, each |stride| must exceed the extent of the dims with smaller strides. */
inline int32_t InternalOverlapDim(const ByteLayout& l, int64_t* inner_extent) {
  if (l.empty) return -1;
  int32_t order[kMaxDims];
  for (int32_t i = 0; i < l.ndim; ++i) order[i] = i;
  auto abs_stride = [&](int32_t i) { return l.stride[i] < 0 ? -l.stride[i] : l.stride[i]; };
  std::sort(order, order + l.ndim, [&](int32_t a, int32_t b) { return abs_stride(a) < abs_stride(b); });
  int64_t extent = l.elem;  // bytes spanned by the dims visited so far
  for (int32_t k = 0; k < l.ndim; ++k) {
    const int32_t i = order[k];
    if (abs_stride(i) < extent) {
      *inner_extent = extent;
      return i;
    }
    extent += abs_stride(i) * (l.size[i] - 1);
  }
  return -1;
}

/*! \brief "Rows of contiguous blocks with one outer stride": rows * (block bytes), rows `step`
 * bytes apart (step >= block), starting at `start`. */
struct Rows {
  int64_t start, rows, block, step;
};

/*! \brief The Rows form of `l`, if it has one. */
inline bool AsRows(const ByteLayout& l, Rows* r) {
  // The contiguous block: innermost dims with compact (positive) byte strides.
  int64_t block = l.elem;
  int32_t i = l.ndim - 1;
  while (i >= 0 && l.stride[i] == block) {
    block *= l.size[i];
    --i;
  }
  if (i < 0) {
    *r = {l.base, 1, block, block};
    return true;
  }
  // The outer dims must collapse into one dim of stride l.stride[i].
  int64_t rows = l.size[i];
  const int64_t step = l.stride[i];
  for (int32_t j = i - 1; j >= 0; --j) {
    if (l.stride[j] != l.stride[j + 1] * l.size[j + 1]) return false;
    rows *= l.size[j];
  }
  if (step < block) return false;  // rows overlap (or negative strides): not this form
  *r = {l.base, rows, block, step};
  return true;
}

/*! \brief floor(a / b) for b > 0. */
inline int64_t FloorDiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

/*! \brief Exact overlap of two Rows with one common step (a single block takes any step):
 * rows i of a and j of b intersect iff -b.block < d + (j - i) * step < a.block, d = b.start -
 * a.start; k = j - i ranges over [-(a.rows - 1), b.rows - 1]. */
inline bool RowsOverlap(const Rows& a, const Rows& b, int64_t step) {
  const int64_t d = b.start - a.start;
  const int64_t k_min = -(a.rows - 1), k_max = b.rows - 1;
  // The smallest k with d + k * step > -b.block.
  const int64_t k = std::max(k_min, FloorDiv(-b.block - d, step) + 1);
  return k <= k_max && d + k * step < a.block;
}

enum class Sharing { kNone, kOverlap, kMayOverlap };

inline Sharing Share(const ByteLayout& a, const ByteLayout& b) {
  if (a.empty || b.empty) return Sharing::kNone;
  if (a.device.device_type != b.device.device_type || a.device.device_id != b.device.device_id) {
    return Sharing::kNone;
  }
  if (a.hi() <= b.lo() || b.hi() <= a.lo()) return Sharing::kNone;
  Rows ra, rb;
  if (AsRows(a, &ra) && AsRows(b, &rb)) {
    if (ra.rows == 1 || rb.rows == 1 || ra.step == rb.step) {
      const int64_t step = ra.rows > 1 ? ra.step : rb.rows > 1 ? rb.step : std::max(ra.block, rb.block);
      return RowsOverlap(ra, rb, step) ? Sharing::kOverlap : Sharing::kNone;
    }
  }
  return Sharing::kMayOverlap;
}

inline std::string LayoutStr(const tvm::ffi::TensorView& t) {
  std::string s = "shape [";
  const int64_t* shape = t.shape().data();
  for (int32_t i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  s += "], strides [";
  if (t.IsContiguous()) {
    s += "contiguous";
  } else {
    const int64_t* strides = t.strides().data();
    for (int32_t i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(strides[i]);
  }
  return s + "]";
}

}  // namespace overlap_detail

/*! \brief A tensor argument and its name, for the checks below. */
struct NamedTensor {
  tvm::ffi::TensorView tensor;
  const char* name;
};

/*! \brief Whether two tensors may share memory: 0 no, 1 yes (exact), 2 their byte ranges
 * intersect and the layouts are outside the exact cases (treated as overlapping). */
inline int OverlapKind(const tvm::ffi::TensorView& a, const tvm::ffi::TensorView& b) {
  return static_cast<int>(overlap_detail::Share(overlap_detail::Describe(a), overlap_detail::Describe(b)));
}

/*! \brief ValueError unless `t` (written by `op`) reaches each element through one index only. */
inline void CheckNoInternalOverlap(const char* op, const tvm::ffi::TensorView& t, const char* name) {
  using namespace overlap_detail;  // NOLINT(*)
  const ByteLayout l = Describe(t);
  int64_t inner = 0;
  const int32_t dim = InternalOverlapDim(l, &inner);
  if (TVM_FFI_PREDICT_TRUE(dim < 0)) return;
  const int64_t stride = l.stride[dim] / l.elem;
  Throw<ErrorKind::kValueError>(
      op, ": argument '", name, "' overlaps itself (", LayoutStr(t), "): ",
      stride == 0 ? detail::StrCat("a dim of size ", l.size[dim], " has stride 0 (an expanded tensor)")
                  : detail::StrCat("stride ", stride, " of a dim of size ", l.size[dim],
                                   " is smaller than the ", inner / l.elem,
                                   " elements spanned by the dims inside it"),
      "; a tensor that the op writes needs distinct memory for every element (pass a "
      "contiguous copy)");
}

/*! \brief ValueError if `a` and `b` share memory (see the file comment for what is exact). */
inline void CheckNoOverlap(const char* op, const NamedTensor& a, const NamedTensor& b) {
  using namespace overlap_detail;  // NOLINT(*)
  const Sharing s = Share(Describe(a.tensor), Describe(b.tensor));
  if (TVM_FFI_PREDICT_TRUE(s == Sharing::kNone)) return;
  Throw<ErrorKind::kValueError>(
      op, ": arguments '", a.name, "' (", LayoutStr(a.tensor), ") and '", b.name, "' (",
      LayoutStr(b.tensor), ") ",
      s == Sharing::kOverlap ? "overlap in memory"
                             : "may overlap in memory (their byte ranges intersect)",
      "; '", a.name, "' is written by the op, so it must not share memory with another argument "
      "(pass a copy, e.g. .clone())");
}

/*!
 * \brief The aliasing contract of an op: every written tensor has no internal overlap and shares
 * no memory with any other written or read tensor. Read tensors may alias each other.
 */
inline void CheckNoAliasing(const char* op, std::initializer_list<NamedTensor> written,
                            std::initializer_list<NamedTensor> read = {}) {
  for (auto w = written.begin(); w != written.end(); ++w) {
    CheckNoInternalOverlap(op, w->tensor, w->name);
    for (auto o = w + 1; o != written.end(); ++o) CheckNoOverlap(op, *w, *o);
    for (const NamedTensor& r : read) CheckNoOverlap(op, *w, r);
  }
}

}  // namespace mllm_kernel::host

#endif  // MLLM_KERNEL_OVERLAP_HPP_
