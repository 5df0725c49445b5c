/*!
 * \file mllm_kernel/cpu/float8.hpp
 * \brief The CPU's float8 e4m3fn element (torch.float8_e4m3fn: sign, 4 exponent bits of bias 7,
 * 3 mantissa bits, no inf, NaN = S.1111.111, largest finite 448) and its scalar conversions.
 * simd_io-inl.h loads it as float32 vectors.
 */
#ifndef MLLM_KERNEL_CPU_FLOAT8_HPP_
#define MLLM_KERNEL_CPU_FLOAT8_HPP_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace mllm_kernel::cpu {

/*! \brief One float8 e4m3fn value, as its bits. */
struct float8_e4m3fn_t {
  uint8_t bits;
};

/*! \brief x as e4m3fn: round to nearest even; beyond +-448 (inf included) saturates to +-448, as
 * CUDA's __NV_SATFINITE conversion; NaN becomes the NaN 0x7F. */
inline float8_e4m3fn_t FloatToE4M3(float x) {
  if (std::isnan(x)) return {0x7F};
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= 448.0f) return {static_cast<uint8_t>(sign | 0x7E)};
  if (a < 0.015625f) {  // below 2^-6: subnormal steps of 2^-9 (8 steps is the smallest normal, 0x08)
    return {static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f)))};
  }
  uint32_t bits;
  std::memcpy(&bits, &a, sizeof(bits));
  int exponent = static_cast<int>(bits >> 23) - 127;  // -6 .. 8
  uint32_t mantissa = (bits & 0x7FFFFFu) >> 20;
  const uint32_t rest = bits & 0xFFFFFu, half = 0x80000u;
  if (rest > half || (rest == half && (mantissa & 1u))) ++mantissa;
  if (mantissa == 8) {  // rounded up into the next binade (a < 448 keeps it finite)
    mantissa = 0;
    ++exponent;
  }
  return {static_cast<uint8_t>(sign | static_cast<uint8_t>((exponent + 7) << 3) | mantissa)};
}

/*! \brief The float value of an e4m3fn (exact). */
inline float E4M3ToFloat(float8_e4m3fn_t v) {
  const uint32_t em = v.bits & 0x7Fu;
  float a;
  if (em == 0x7F) {
    a = NAN;
  } else if (em < 8) {
    a = static_cast<float>(em) * 0.001953125f;  // 2^-9
  } else {
    const uint32_t bits = (em << 20) + (120u << 23);
    std::memcpy(&a, &bits, sizeof(a));
  }
  return (v.bits & 0x80u) ? -a : a;
}

}  // namespace mllm_kernel::cpu

#endif  // MLLM_KERNEL_CPU_FLOAT8_HPP_
