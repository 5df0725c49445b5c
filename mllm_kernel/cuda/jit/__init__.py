"""JIT-compiled CUDA kernels (the seed API; the ops live in mllm_kernel.kernels)."""

from mllm_kernel.kernels.add_constant import cuda_add_constant as add_constant

__all__ = ["add_constant"]
