/*!
 * \file mllm_kernel/utils.cuh
 * \brief Umbrella header: includes every CUDA helper header under mllm_kernel/cuda/, so a kernel
 *        may include just this one. New code may include only the headers it needs:
 *
 *   cuda/types.cuh         fp16_t / bf16_t / fp8 / fp32_t, to_float / from_float
 *   cuda/reduce.cuh        kWarpThreads, max_of, warp_reduce_* and block_reduce_* (sum, max), warp_argmax
 *   cuda/vec.cuh           kVecBytes / kVecSize, AlignedVector, is_aligned
 *   cuda/fast_math.cuh     SFU exp2_approx / rcp_approx
 *   cuda/launch.cuh        LaunchKernel (torch's stream, PDL, clusters), pdl_wait_primary /
 *                          pdl_launch_dependents, CudaCheck / MLLM_CUDA_CHECK, device attributes
 *   cuda/cluster.cuh       cluster_rank / cluster_size / cluster_sync / cluster_peer (sm_90)
 *   cuda/error_record.cuh  record_error: a kernel's report of an out-of-range index
 *
 * Launch plans for kernel families live beside it: row_block.cuh with row_plan.hpp (a row held
 * in registers: norms, softmax) and row_copy.cuh (rows copied unchanged: embedding, KV-cache
 * stores).
 */
#ifndef MLLM_KERNEL_UTILS_CUH_
#define MLLM_KERNEL_UTILS_CUH_

#include <mllm_kernel/cuda/cluster.cuh>
#include <mllm_kernel/cuda/error_record.cuh>
#include <mllm_kernel/cuda/fast_math.cuh>
#include <mllm_kernel/cuda/launch.cuh>
#include <mllm_kernel/cuda/mma.cuh>
#include <mllm_kernel/cuda/reduce.cuh>
#include <mllm_kernel/cuda/types.cuh>
#include <mllm_kernel/cuda/vec.cuh>

#endif  // MLLM_KERNEL_UTILS_CUH_
