/*!
 * \file mllm_kernel/cuda/error_record.cuh
 * \brief record_error: how a kernel reports a bad index (a RoPE position, a KV slot, an
 *        embedding id) instead of touching memory out of bounds.
 *
 * The record is an int64 tensor {flag, index, value} (see mllm_kernel/kernels/device_errors.py);
 * only the first reporter (flag 0 -> 1) writes index and value, later ones keep it.
 */
#ifndef MLLM_KERNEL_CUDA_ERROR_RECORD_CUH_
#define MLLM_KERNEL_CUDA_ERROR_RECORD_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace mllm_kernel::device {

__device__ __forceinline__ void record_error(int64_t* record, int64_t index, int64_t value) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(record), 0ull, 1ull) == 0ull) {
    record[1] = index;
    record[2] = value;
  }
}

}  // namespace mllm_kernel::device

#endif  // MLLM_KERNEL_CUDA_ERROR_RECORD_CUH_
