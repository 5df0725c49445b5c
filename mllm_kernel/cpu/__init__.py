"""CPU kernels (Google Highway SIMD)."""
