/*!
 * \file kernels/sampling/sampling.hpp
 * \brief The argument contract of greedy_sample, top_k_top_p_sample, min_p_sample and the
 * filters (top_k_mask_logits, top_k_renorm_probs, top_p_renorm_probs), shared by the CPU
 * (sampling.cpp) and CUDA (sampling.cuh) entry points.
 *
 * logits / probs: [batch, vocab] float32/float16/bfloat16, unit last stride, any row stride,
 * vocab > 0; out: int64 [batch]; per-row parameters: 1-D [batch] (uniforms, top_p, min_p
 * float32; top_k int64); a filter's out: contiguous [batch, vocab] of the input's dtype. All on
 * one device; out (written) shares no memory with the others.
 */
#ifndef MLLM_KERNEL_KERNELS_SAMPLING_HPP_
#define MLLM_KERNEL_KERNELS_SAMPLING_HPP_

#include <mllm_kernel/dispatch.hpp>
#include <mllm_kernel/overlap.hpp>
#include <mllm_kernel/rows.hpp>
#include <mllm_kernel/tensor.hpp>
#include <mllm_kernel/utils.hpp>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace mllm_kernel::sampling {

/*! \brief A verified call: batch rows of vocab scores, `stride` elements apart. */
struct SampleArgs {
  DLDataType dtype;
  DLDevice device;
  int64_t batch, vocab, stride;
};

/*! \brief Verifies one op's tensors in turn; they share the batch size and the device.
 * The CUDA-only checks are limits of its kernels (a block per row, 32-bit token counts). */
template <DLDeviceType kDev>
struct SampleVerifier {
  const char* op;
  host::SymbolicSize batch{"batch"}, vocab{"vocab"};
  host::SymbolicDType dtype{"dtype"};
  host::SymbolicDevice device{"device"};

  /*! \brief The [batch, vocab] scores (logits or probs). */
  SampleArgs Rows(const char* name, tvm::ffi::TensorView x) {
    using namespace mllm_kernel::host;  // NOLINT(*)
    const int64_t stride = VerifyFloatRows<kDev>(op, x, name, batch, vocab, dtype, device);
    ValueCheck(vocab.unwrap() > 0, op, ": argument '", name, "': the vocab dim must be non-empty");
    if constexpr (kDev == kDLCUDA) {
      RuntimeCheck(batch.unwrap() <= 0x7fffffff, op, ": batch ", batch.unwrap(), " is too large");
    }
    return {dtype.unwrap(), device.unwrap(), batch.unwrap(), vocab.unwrap(), stride};
  }

  /*! \brief out: int64 [batch]. */
  void Out(tvm::ffi::TensorView out) {
    using namespace mllm_kernel::host;  // NOLINT(*)
    TensorMatcher({batch}).for_op(op).with_dtype<int64_t>().with_device<kDev>(device).verify(
        out, "out");
  }

  /*! \brief out of a filter: contiguous [batch, vocab] of the scores' dtype (after Rows). */
  void FilteredOut(tvm::ffi::TensorView out) {
    using namespace mllm_kernel::host;  // NOLINT(*)
    TensorMatcher({batch, vocab}).for_op(op).with_dtype(dtype).with_device(device).verify(out, "out");
  }

  /*! \brief A per-row parameter: [batch] of T, contiguous. */
  template <typename T>
  void PerRow(const char* name, tvm::ffi::TensorView t) {
    using namespace mllm_kernel::host;  // NOLINT(*)
    TensorMatcher({batch}).for_op(op).with_device<kDev>(device).template with_dtype<T>().verify(
        t, name);
  }
};

/*! \brief greedy_sample(out, logits). */
template <DLDeviceType kDev>
SampleArgs VerifyGreedySample(tvm::ffi::TensorView out, tvm::ffi::TensorView logits) {
  SampleVerifier<kDev> v{"greedy_sample"};
  const SampleArgs args = v.Rows("logits", logits);
  v.Out(out);
  host::CheckNoAliasing(v.op, {{out, "out"}}, {{logits, "logits"}});
  return args;
}

/*! \brief top_k_top_p_sample(out, logits, uniforms, top_k, top_p). */
template <DLDeviceType kDev>
SampleArgs VerifyTopKTopPSample(tvm::ffi::TensorView out, tvm::ffi::TensorView logits,
                                tvm::ffi::TensorView uniforms, tvm::ffi::TensorView top_k,
                                tvm::ffi::TensorView top_p) {
  SampleVerifier<kDev> v{"top_k_top_p_sample"};
  const SampleArgs args = v.Rows("logits", logits);
  v.Out(out);
  v.template PerRow<float>("uniforms", uniforms);
  v.template PerRow<int64_t>("top_k", top_k);
  v.template PerRow<float>("top_p", top_p);
  host::CheckNoAliasing(v.op, {{out, "out"}},
                        {{logits, "logits"}, {uniforms, "uniforms"}, {top_k, "top_k"}, {top_p, "top_p"}});
  if constexpr (kDev == kDLCUDA) {
    host::ValueCheck(args.vocab <= 0x7fffffff, v.op, ": argument 'logits': vocab ", args.vocab,
                     " is over 2^31 - 1 (token counts are 32-bit)");
  }
  return args;
}

/*! \brief min_p_sample(out, probs, uniforms, min_p). */
template <DLDeviceType kDev>
SampleArgs VerifyMinPSample(tvm::ffi::TensorView out, tvm::ffi::TensorView probs,
                            tvm::ffi::TensorView uniforms, tvm::ffi::TensorView min_p) {
  SampleVerifier<kDev> v{"min_p_sample"};
  const SampleArgs args = v.Rows("probs", probs);
  v.Out(out);
  v.template PerRow<float>("uniforms", uniforms);
  v.template PerRow<float>("min_p", min_p);
  host::CheckNoAliasing(v.op, {{out, "out"}}, {{probs, "probs"}, {uniforms, "uniforms"}, {min_p, "min_p"}});
  return args;
}

/*! \brief The filters: top_k_mask_logits(out, logits, top_k), top_k_renorm_probs(out, probs,
 *  top_k), top_p_renorm_probs(out, probs, top_p); P: the parameter's type (int64 / float32). */
template <DLDeviceType kDev, typename P>
SampleArgs VerifyFilter(const char* op, const char* in_name, const char* param_name, tvm::ffi::TensorView out,
                        tvm::ffi::TensorView in, tvm::ffi::TensorView param) {
  SampleVerifier<kDev> v{op};
  const SampleArgs args = v.Rows(in_name, in);  // first: a bad input is named, not the out made from it
  v.FilteredOut(out);
  v.template PerRow<P>(param_name, param);
  host::CheckNoAliasing(op, {{out, "out"}}, {{in, in_name}, {param, param_name}});
  if constexpr (kDev == kDLCUDA) {
    host::ValueCheck(args.vocab <= 0x7fffffff, op, ": argument '", in_name, "': vocab ", args.vocab,
                     " is over 2^31 - 1 (token counts are 32-bit)");
  }
  return args;
}

}  // namespace mllm_kernel::sampling

#endif  // MLLM_KERNEL_KERNELS_SAMPLING_HPP_
