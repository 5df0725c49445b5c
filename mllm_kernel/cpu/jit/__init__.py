"""JIT-compiled CPU kernels."""

from .add_constant import add_constant, add_constant_runtime

__all__ = ["add_constant", "add_constant_runtime"]
