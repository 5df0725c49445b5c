/*!
 * \file kernels/embedding/embedding.hpp
 * \brief The argument contract of embedding, shared by the CPU (embedding.cpp) and CUDA
 * (embedding.cuh) entry points, which take the same arguments.
 *
 * table [vocab, H]: float32/float16/bfloat16, any row stride, hidden contiguous; out [N, H]:
 * contiguous, table's dtype; ids [N]: int32 or int64; error: int64 [3], the device-error record
 * {flag, flattened position, id} that CUDA fills for an out-of-range id. All on one device; out
 * (written) shares no memory with ids or table (mllm_kernel/overlap.hpp).
 */
#ifndef MLLM_KERNEL_KERNELS_EMBEDDING_HPP_
#define MLLM_KERNEL_KERNELS_EMBEDDING_HPP_

#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace mllm_kernel::embedding {

/*! \brief A verified call; rows are copied as bytes, whatever the dtype. */
struct EmbeddingArgs {
  DLDataType id_dtype;
  DLDevice device;
  int64_t num_ids, vocab, row_bytes, table_stride_bytes;
  bool empty() const { return num_ids == 0 || row_bytes == 0; }
};

template <DLDeviceType kDev>
EmbeddingArgs VerifyEmbedding(tvm::ffi::TensorView out, tvm::ffi::TensorView ids,
                              tvm::ffi::TensorView table, tvm::ffi::TensorView error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize N{"num_ids"}, V{"vocab_size"}, H{"hidden"}, TS{"table_row_stride"};
  SymbolicDType dtype, id_dtype;
  SymbolicDevice device{"device"};
  TensorMatcher({V, H})
      .for_op("embedding")
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDev>(device)
      .with_strides({TS, 1})
      .verify(table, "table");
  TensorMatcher({N})
      .for_op("embedding")
      .with_dtype<int32_t, int64_t>(id_dtype)
      .with_device(device)
      .verify(ids, "ids");
  TensorMatcher({N, H}).for_op("embedding").with_dtype(dtype).with_device(device).verify(out, "out");
  // The CPU ignores the error record: it checks every id on the host and raises at once.
  if constexpr (kDev == kDLCUDA) {
    TensorMatcher({3}).for_op("embedding").with_dtype<int64_t>().with_device(device).verify(
        error, "error");
  }
  CheckNoAliasing("embedding", {{out, "out"}}, {{ids, "ids"}, {table, "table"}});
  const int64_t elem = dtype_bytes(dtype.unwrap());
  return {id_dtype.unwrap(), device.unwrap(), N.unwrap(),
          V.unwrap(),        H.unwrap() * elem, TS.unwrap() * elem};
}

}  // namespace mllm_kernel::embedding

#endif  // MLLM_KERNEL_KERNELS_EMBEDDING_HPP_
