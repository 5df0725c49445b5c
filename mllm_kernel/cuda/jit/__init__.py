"""JIT-compiled CUDA kernels."""

from .add_constant import add_constant

__all__ = ["add_constant"]
