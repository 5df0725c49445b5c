/*!
 * \file kernels/embedding/embedding.cpp
 * \brief CPU embedding lookup: out[i] = table[ids[i]] (one memcpy per row).
 *
 * A pure gather, so no Highway body: memcpy is already vectorized by the C library.
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * TVM_FFI_DLL_EXPORT_TYPED_FUNC(embedding, mllm_kernel::cpu::embedding).
 */
#include "embedding.hpp"

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
 * \brief out [N, H] = table [vocab, H] rows picked by ids [N] (arguments: embedding.hpp).
 *
 * An id < 0 or >= vocab raises ValueError naming its (flattened) position. error: the CUDA
 * export's device-error record, taken for the same signature and ignored (the CPU raises at
 * once instead).
 */
inline void embedding(tvm::ffi::TensorView out, tvm::ffi::TensorView ids, tvm::ffi::TensorView table,
                      tvm::ffi::TensorView error) {
  using host::data_ptr;
  const auto a = mllm_kernel::embedding::VerifyEmbedding<kDLCPU>(out, ids, table, error);
  host::DispatchIndex(a.id_dtype, [&]<typename IdT>() {
    embedding_detail::Gather(data_ptr<char>(out), data_ptr<const char>(table),
                             data_ptr<const IdT>(ids), a.num_ids, a.vocab, a.row_bytes,
                             a.table_stride_bytes);
  });
}

}  // namespace mllm_kernel::cpu
