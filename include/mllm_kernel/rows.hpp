/*!
 * \file mllm_kernel/rows.hpp
 * \brief The argument most row ops share: a [rows, n] float tensor (float32, float16 or
 * bfloat16) with unit stride along n and any row stride. Used by the op contracts
 * (kernels/<op>/<op>.hpp) of both devices.
 */
#ifndef MLLM_KERNEL_ROWS_HPP_
#define MLLM_KERNEL_ROWS_HPP_

#include <dlpack/dlpack.h>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace mllm_kernel::host {

/*!
 * \brief Verify \p t as [rows, n] on a \p kDev device, binding (or checking against) the
 * shared symbols; returns its row stride. \p written: the op writes \p t, so its rows must not
 * overlap (e.g. an expanded, stride-0 view).
 */
template <DLDeviceType kDev>
int64_t VerifyFloatRows(const char* op, tvm::ffi::TensorView t, const char* name, SymbolicSize& rows,
                        SymbolicSize& n, SymbolicDType& dtype, SymbolicDevice& device,
                        bool written = false) {
  SymbolicSize stride{"row_stride"};
  TensorMatcher({rows, n})
      .for_op(op)
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDev>(device)
      .with_strides({stride, 1})
      .verify(t, name);
  const int64_t row_stride = stride.unwrap();
  ValueCheck(!written || rows.unwrap() <= 1 || row_stride >= n.unwrap(), op, ": argument '", name,
             "': row stride ", row_stride, " is smaller than ", n.name(), "=", n.unwrap(),
             ": rows written would overlap");
  return row_stride;
}

}  // namespace mllm_kernel::host

#endif  // MLLM_KERNEL_ROWS_HPP_
