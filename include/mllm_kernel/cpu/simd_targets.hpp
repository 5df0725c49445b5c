/*!
 * \file include/mllm_kernel/cpu/simd_targets.hpp
 * \brief Which Highway SIMD targets a CPU module can dispatch to, and a switch to restrict them
 *        (so tests can run every target the machine has, not only the best one).
 *
 * The JIT runtime's generated wrapper of every CPU module includes this header after the kernel
 * sources and exports these functions as mllm_simd_targets, mllm_set_simd_targets and
 * mllm_simd_target_name. Each module links its own copy of Highway's runtime (hwy/targets.cc,
 * hidden visibility), so a restriction applies to that module only.
 */
#pragma once

#include <hwy/targets.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/string.h>

#include <cstdint>

namespace mllm_kernel::cpu {

namespace detail {
// The mask last given to SetSimdTargets (0: no restriction); Highway does not expose its mock.
inline int64_t simd_restriction = 0;
}  // namespace detail

/*! \brief Bit mask of the Highway targets compiled into this module and supported by this CPU,
 *         whatever restriction is in force. */
inline int64_t SimdTargets() {
  if (detail::simd_restriction != 0) hwy::SetSupportedTargetsForTest(0);
  int64_t mask = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) mask |= target;
  if (detail::simd_restriction != 0) hwy::SetSupportedTargetsForTest(detail::simd_restriction);
  return mask;
}

/*! \brief Restrict dynamic dispatch to the targets in mask (0 undoes it). Only targets of
 *         SimdTargets() are allowed: dispatching to one this CPU lacks would crash. Not safe to
 *         call while another thread runs this module's kernels. */
inline void SetSimdTargets(int64_t mask) {
  const int64_t available = SimdTargets();
  if (mask != 0 && (mask & ~available) != 0) {
    TVM_FFI_THROW(ValueError) << "mllm_set_simd_targets: mask " << mask << " has targets outside this "
                              << "module's available ones (" << available << ")";
  }
  detail::simd_restriction = mask;
  hwy::SetSupportedTargetsForTest(mask);
}

/*! \brief Highway's name of one target bit, e.g. "AVX2". */
inline tvm::ffi::String SimdTargetName(int64_t target) { return tvm::ffi::String(hwy::TargetName(target)); }

}  // namespace mllm_kernel::cpu
