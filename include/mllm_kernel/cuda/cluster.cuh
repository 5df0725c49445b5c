/*!
 * \file mllm_kernel/cuda/cluster.cuh
 * \brief Thread-block clusters (sm_90 and up): this block's rank, the cluster's size, a barrier
 *        over all its threads and a peer block's copy of a shared variable (distributed shared
 *        memory). Compiled for an older arch, every launch is a cluster of one block: rank 0,
 *        size 1, the barrier is __syncthreads and the peer is this block.
 *
 * Launch with host::LaunchKernel(...).cluster(n). A block must not exit while a peer may still
 * read or write its shared memory: end such kernels with cluster_sync(). A block that only
 * writes into peers may cluster_arrive() and exit (an exited thread counts as arrived).
 */
#ifndef MLLM_KERNEL_CUDA_CLUSTER_CUH_
#define MLLM_KERNEL_CUDA_CLUSTER_CUH_

#include <cstdint>

namespace mllm_kernel::device {

/*! \brief This block's rank in its cluster. */
__device__ __forceinline__ unsigned cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
#else
  return 0;
#endif
}

/*! \brief The number of blocks in this block's cluster. */
__device__ __forceinline__ unsigned cluster_size() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned size;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
  return size;
#else
  return 1;
#endif
}

/*! \brief Barrier of every thread of the cluster: shared-memory writes before it are visible to
 *         all of the cluster's threads after it. Every thread must call it. */
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
#else
  __syncthreads();
#endif
}

/*! \brief cluster_sync in two halves: after cluster_arrive a block may still work on its own
 *         data; cluster_wait then returns once every block of the cluster has arrived. Every
 *         thread must call both, in this order, with no other cluster barrier between. */
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __syncthreads();
#endif
}

/*! \brief The address of shared variable *ptr in the shared memory of cluster block \p rank. */
template <typename T>
__device__ __forceinline__ const T* cluster_peer(const T* ptr, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t peer;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(peer) : "l"(reinterpret_cast<uint64_t>(ptr)), "r"(rank));
  return reinterpret_cast<const T*>(peer);
#else
  (void)rank;
  return ptr;
#endif
}

/*! \brief The same for a variable this block writes into a peer's shared memory. */
template <typename T>
__device__ __forceinline__ T* cluster_peer(T* ptr, unsigned rank) {
  return const_cast<T*>(cluster_peer(static_cast<const T*>(ptr), rank));
}

/*! \brief The largest cluster (non-portable; 8 is the portable limit). */
inline constexpr unsigned kMaxClusterBlocks = 16;

/*!
 * \brief fn(rank, value) for each block of the cluster in rank order, value = that block's copy of
 *        shared variable *ptr. Loads are issued 8 at a time before fn runs on them: a peer load
 *        takes hundreds of cycles, so a loop of dependent loads would cost the cluster size
 *        times that (8, not 16, at a time keeps the registers of 64-bit values in check).
 */
template <typename T, typename Fn>
__device__ __forceinline__ void for_each_peer(const T* ptr, Fn&& fn) {
  constexpr unsigned kInFlight = 8;
  const unsigned n = cluster_size();
#pragma unroll
  for (unsigned base = 0; base < kMaxClusterBlocks; base += kInFlight) {
    if (base >= n) break;
    T values[kInFlight];
#pragma unroll
    for (unsigned j = 0; j < kInFlight; ++j) {
      if (base + j < n) values[j] = *cluster_peer(ptr, base + j);
    }
#pragma unroll
    for (unsigned j = 0; j < kInFlight; ++j) {
      if (base + j < n) fn(base + j, values[j]);
    }
  }
}

}  // namespace mllm_kernel::device

#endif  // MLLM_KERNEL_CUDA_CLUSTER_CUH_
