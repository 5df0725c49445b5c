"""mllm-kernel: CPU (Highway) and CUDA kernels for PyTorch, JIT-compiled through tvm-ffi."""

__version__ = "0.1.0"
