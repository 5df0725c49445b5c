"""JIT-compiled CPU kernels (the seed API; the ops live in mllm_kernel.kernels)."""

from mllm_kernel.kernels.add_constant import add_constant, add_constant_runtime

__all__ = ["add_constant", "add_constant_runtime"]
