/*!
 * \file kernels/softmax/softmax.cpp
 * \brief CPU softmax / log_softmax over the last dim (float32, float16, bfloat16), vectorized
 *        with Highway dynamic dispatch; float32 accumulation.
 *
 * Includable: the JIT runtime compiles a wrapper TU that #includes this file and exports
 * mllm_kernel::cpu::softmax and mllm_kernel::cpu::log_softmax (contract: softmax.hpp).
 */
#include "softmax.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "softmax-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "softmax-inl.h"
#include "mllm_kernel/cpu/parallel.hpp"

#include <algorithm>
#include <cstdint>

#if HWY_ONCE
namespace mllm_kernel::cpu {

namespace softmax_detail {

// Waking a pool thread takes microseconds: each worker gets at least this many elements.
constexpr int64_t kMinElementsPerWorker = int64_t{1} << 15;

inline void Run(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView x, float inv_temp, bool log,
                int64_t num_threads) {
  using host::data_ptr;
  const auto a = mllm_kernel::softmax::VerifySoftmax<kDLCPU>(op, out, x);
  const int64_t worth = (a.rows * a.vocab + kMinElementsPerWorker - 1) / kMinElementsPerWorker;
  const int64_t workers = WorkerCount(op, num_threads, std::min(a.rows, worth));
  if (a.empty()) return;
  host::DispatchFloat<kDLCPU>(a.dtype, [&]<typename T>() {
    HWY_EXPORT_T(Table, softmax_detail::Rows<T>);
    ParallelFor(a.rows, workers, 1, [&](int64_t, int64_t begin, int64_t end) {  // rows are independent
      HWY_DYNAMIC_DISPATCH_T(Table)(data_ptr<T>(out) + begin * a.vocab, data_ptr<const T>(x) + begin * a.x_stride,
                                    end - begin, a.vocab, a.x_stride, inv_temp, log);
    });
  });
}

}  // namespace softmax_detail

/*! \brief out = softmax(x / temperature) over the last dim; temperature > 0; rows over
 *  num_threads (>= 1) threads of the pool (mllm_kernel/cpu/parallel.hpp). */
inline void softmax(tvm::ffi::TensorView out, tvm::ffi::TensorView x, double temperature, int64_t num_threads) {
  softmax_detail::Run("softmax", out, x, mllm_kernel::softmax::InvTemperature(temperature), false, num_threads);
}

/*! \brief out = log_softmax(x) over the last dim; rows over num_threads (>= 1) threads. */
inline void log_softmax(tvm::ffi::TensorView out, tvm::ffi::TensorView x, int64_t num_threads) {
  softmax_detail::Run("log_softmax", out, x, 1.0f, true, num_threads);
}

}  // namespace mllm_kernel::cpu
#endif  // HWY_ONCE
