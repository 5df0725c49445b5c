"""CUDA kernels."""
