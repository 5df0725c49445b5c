/*!
 * \file mllm_kernel/row_copy.cuh
 * \brief Row-copy kernels (embedding lookup, KV-cache stores): rows of bytes moved unchanged,
 *        in units U of the widest of 16/8/4/2 bytes that every address, row stride and the row
 *        size allow. A block (G, R) takes R rows at a time and G threads copy each row: the
 *        row's unit count rounded up to a power of 2, at most the block's 256 threads. The grid
 *        strides over rows (at most 2^20 blocks).
 *
 * \code{.cpp}
 *   // host
 *   dispatch_copy_unit(copy_alignment(dst, src, row_bytes, src_stride_bytes), [&]<typename U>() {
 *     const RowCopyPlan plan = plan_row_copy(rows, row_bytes / sizeof(U));
 *     LaunchKernel(plan.grid, plan.block, device)(MyCopy<U>, ...);
 *   });
 *   // device (MyCopy<U>)
 *   const int64_t step = device::copy_row_step();
 *   for (int64_t r = device::first_copy_row(); r < rows; r += step) {
 *     for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) dst[r * row_units + i] = ...;
 *   }
 * \endcode
 */
#ifndef MLLM_KERNEL_ROW_COPY_CUH_
#define MLLM_KERNEL_ROW_COPY_CUH_

#include <cuda_runtime.h>
#include <mllm_kernel/cuda/vec.cuh>
#include <mllm_kernel/utils.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace mllm_kernel::device {

// The row loop of a kernel launched with a RowCopyPlan: threadIdx.y picks the row, threadIdx.x
// the unit (see the example above).

/*! \brief The first row this thread copies. */
__device__ __forceinline__ int64_t first_copy_row() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
}

/*! \brief The grid-stride step from one of this thread's rows to its next. */
__device__ __forceinline__ int64_t copy_row_step() {
  return static_cast<int64_t>(gridDim.x) * blockDim.y;
}

}  // namespace mllm_kernel::device

namespace mllm_kernel::host {

/*! \brief Grid and block of a row-copy kernel. */
struct RowCopyPlan {
  dim3 grid;
  dim3 block;
};

/*! \brief Plans `rows` rows of `row_units` copy units each (both > 0). */
inline RowCopyPlan plan_row_copy(int64_t rows, int64_t row_units) {
  constexpr int64_t kThreads = 256;
  constexpr int64_t kMaxBlocks = 1 << 20;  // the grid-stride loop covers more rows
  // Threads per row: the row's unit count rounded up to a power of 2, at most the block.
  int64_t group = 1;
  while (group < row_units && group < kThreads) group *= 2;
  const int64_t rows_per_block = kThreads / group;
  const auto blocks = static_cast<unsigned>(std::min(div_ceil(rows, rows_per_block), kMaxBlocks));
  return {dim3(blocks), dim3(static_cast<unsigned>(group), static_cast<unsigned>(rows_per_block))};
}

/*! \brief The OR of addresses and byte counts: its lowest set bit bounds the copy unit. */
template <typename... Xs>
inline uintptr_t copy_alignment(Xs... xs) {
  const auto bits = [](auto x) {
    if constexpr (std::is_pointer_v<decltype(x)>) {
      return reinterpret_cast<uintptr_t>(x);
    } else {
      static_assert(std::is_integral_v<decltype(x)>, "copy_alignment: pointers and byte counts");
      return static_cast<uintptr_t>(x);
    }
  };
  return (bits(xs) | ...);
}

/*!
 * \brief Calls f.template operator()<U>() with the widest copy unit U that divides `alignment`
 *        (see copy_alignment): 16 or 8 bytes (AlignedVector of uint32_t), 4 (uint32_t) or 2
 *        (uint16_t; rows of 16-bit elements always allow it).
 */
template <typename F>
inline void dispatch_copy_unit(uintptr_t alignment, F&& f) {
  if (alignment % 16 == 0) {
    f.template operator()<device::AlignedVector<uint32_t, 4>>();
  } else if (alignment % 8 == 0) {
    f.template operator()<device::AlignedVector<uint32_t, 2>>();
  } else if (alignment % 4 == 0) {
    f.template operator()<uint32_t>();
  } else {
    f.template operator()<uint16_t>();
  }
}

}  // namespace mllm_kernel::host

#endif  // MLLM_KERNEL_ROW_COPY_CUH_
