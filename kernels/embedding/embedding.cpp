/*!
 * \file kernels/embedding/embedding.cpp
 * \brief CPU embedding lookup: out[i] = table[ids[i]] (one memcpy per row).
 *
 * A pure gather, so no Highway body: memcpy is already vectorized by the C library.
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * TVM_FFI_DLL_EXPORT_TYPED_FUNC(embedding, mllm_kernel::cpu::embedding).
 */
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <cstring>

namespace mllm_kernel::cpu {

namespace embedding_detail {

template <typename IdT>
void Gather(char* out, const char* table, const IdT* ids, int64_t n, int64_t vocab,
            int64_t row_bytes, int64_t table_stride_bytes) {
  // Validate first, so a bad id leaves out untouched.
  for (int64_t i = 0; i < n; ++i) {
    const auto id = static_cast<int64_t>(ids[i]);
    host::ValueCheck(id >= 0 && id < vocab, "embedding: ids (flattened)[", i, "] = ", id,
                     " is out of range [0, vocab_size=", vocab, ")");
  }
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out + i * row_bytes, table + static_cast<int64_t>(ids[i]) * table_stride_bytes,
                static_cast<size_t>(row_bytes));
  }
}

}  // namespace embedding_detail

/*!
 * \brief out [N, H] = table [vocab, H] rows picked by ids [N] (int32 or int64).
 *
 * table: float32/float16/bfloat16, any row stride, hidden contiguous; out: contiguous, table's
 * dtype. An id < 0 or >= vocab raises ValueError naming its (flattened) position.
 */
inline void embedding(tvm::ffi::TensorView out, tvm::ffi::TensorView ids, tvm::ffi::TensorView table) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize N{"num_ids"}, V{"vocab_size"}, H{"hidden"}, TS{"table_row_stride"};
  SymbolicDType dtype, id_dtype;
  TensorMatcher({V, H})
      .for_op("embedding")
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDLCPU>()
      .with_strides({TS, 1})
      .verify(table, "table");
  TensorMatcher({N, H}).for_op("embedding").with_dtype(dtype).with_device<kDLCPU>().verify(out, "out");
  TensorMatcher({N})
      .for_op("embedding")
      .with_dtype<int32_t, int64_t>(id_dtype)
      .with_device<kDLCPU>()
      .verify(ids, "ids");
  const int64_t elem = dtype_bytes(dtype.unwrap());
  auto* dst = data_ptr<char>(out);
  const auto* src = data_ptr<const char>(table);
  const int64_t n = N.unwrap(), vocab = V.unwrap(), row_bytes = H.unwrap() * elem;
  const int64_t stride_bytes = TS.unwrap() * elem;
  if (id_dtype.is<int32_t>()) {
    embedding_detail::Gather(dst, src, data_ptr<const int32_t>(ids), n, vocab, row_bytes, stride_bytes);
  } else {
    embedding_detail::Gather(dst, src, data_ptr<const int64_t>(ids), n, vocab, row_bytes, stride_bytes);
  }
}

}  // namespace mllm_kernel::cpu
