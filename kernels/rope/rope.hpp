/*!
 * \file kernels/rope/rope.hpp
 * \brief The argument contract of apply_rope, shared by the CPU (rope.cpp) and CUDA (rope.cuh)
 * entry points, which take the same arguments.
 *
 * q [T, H, D] and k [T, KH, D]: float32/float16/bfloat16 (one dtype), any token stride, heads
 * and dims contiguous; positions: int64 [T]; cos_sin_cache: float32 [max_pos, rot_dim] (cos in
 * the first rot_dim/2 columns, sin in the rest), rot_dim even and <= D; error: int64 [3], the
 * device-error record {flag, token, position} that CUDA fills for an out-of-range position.
 * All on one device. q and k (written) have no internal overlap and share no memory with any
 * other argument (mllm_kernel/overlap.hpp).
 */
#ifndef MLLM_KERNEL_KERNELS_ROPE_HPP_
#define MLLM_KERNEL_KERNELS_ROPE_HPP_

#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace mllm_kernel::rope {

/*! \brief A verified call (strides in elements). */
struct RopeArgs {
  DLDataType dtype;
  DLDevice device;
  int64_t num_tokens, num_heads, num_kv_heads, head_dim, rot_dim, q_stride, k_stride, max_pos;
  bool empty() const { return num_tokens == 0 || num_heads + num_kv_heads == 0; }
};

template <DLDeviceType kDev>
RopeArgs VerifyApplyRope(tvm::ffi::TensorView q, tvm::ffi::TensorView k,
                         tvm::ffi::TensorView positions, tvm::ffi::TensorView cos_sin_cache,
                         tvm::ffi::TensorView error) {
  using namespace mllm_kernel::host;  // NOLINT(*)
  SymbolicSize T{"num_tokens"}, H{"num_heads"}, KH{"num_kv_heads"}, D{"head_dim"};
  SymbolicSize QS{"q_token_stride"}, KS{"k_token_stride"}, P{"max_pos"}, R{"rot_dim"};
  SymbolicDType dtype;
  SymbolicDevice device{"device"};
  TensorMatcher({T, H, D})
      .for_op("apply_rope")
      .with_dtype<float, float16_tag, bfloat16_tag>(dtype)
      .with_device<kDev>(device)
      .with_strides({QS, D, 1})
      .verify(q, "q");
  TensorMatcher({T, KH, D})
      .for_op("apply_rope")
      .with_dtype(dtype)
      .with_device(device)
      .with_strides({KS, D, 1})
      .verify(k, "k");
  TensorMatcher({T}).for_op("apply_rope").with_dtype<int64_t>().with_device(device).verify(
      positions, "positions");
  TensorMatcher({P, R}).for_op("apply_rope").with_dtype<float>().with_device(device).verify(
      cos_sin_cache, "cos_sin_cache");
  // The CPU ignores the error record: it checks every position on the host and raises at once.
  if constexpr (kDev == kDLCUDA) {
    TensorMatcher({3}).for_op("apply_rope").with_dtype<int64_t>().with_device(device).verify(
        error, "error");
  }
  const RopeArgs args{dtype.unwrap(), device.unwrap(), T.unwrap(),  H.unwrap(),  KH.unwrap(),
                      D.unwrap(),     R.unwrap(),      QS.unwrap(), KS.unwrap(), P.unwrap()};
  ValueCheck(args.rot_dim > 0 && args.rot_dim % 2 == 0 && args.rot_dim <= args.head_dim,
             "apply_rope: cos_sin_cache rot_dim (dim 1) must be even and in [2, head_dim=",
             args.head_dim, "], got ", args.rot_dim);
  // q and k are rotated in place: each must reach every element through one index only (no
  // expanded or too-small token stride) and share no memory with the other arguments. Disjoint
  // slices of one fused qkv tensor pass (the test is exact for that layout).
  CheckNoAliasing("apply_rope", {{q, "q"}, {k, "k"}},
                  {{positions, "positions"}, {cos_sin_cache, "cos_sin_cache"}});
  return args;
}

}  // namespace mllm_kernel::rope

#endif  // MLLM_KERNEL_KERNELS_ROPE_HPP_
