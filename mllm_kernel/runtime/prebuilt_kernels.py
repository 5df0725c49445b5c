"""Kernels the wheel ships as precompiled cubins: prebuilt_kernels.cu, compiled by the Bazel rule
cuda_cubin into prebuilt_kernels.fatbin beside this file, launched with load_cubin (no compiler).
In a source checkout without that build output, the .cu is compiled instead (compile_kernel).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

_FOLDER = Path(os.path.abspath(__file__)).parent  # not resolve(): under Bazel, stay in runfiles
FATBIN = _FOLDER / "prebuilt_kernels.fatbin"
SOURCE = _FOLDER / "prebuilt_kernels.cu"
BLOCK = 256
MAX_BLOCKS = 4096  # grid-stride loops cover the rest


def origin() -> str:
    """"fatbin" when the shipped cubins are used, "compiled" when the source is compiled here."""
    return "fatbin" if FATBIN.is_file() else "compiled"


@functools.cache
def kernel(name: str):
    from . import compile_kernel, load_cubin

    if origin() == "fatbin":
        return load_cubin(FATBIN, name, block=BLOCK)  # the signature: SOURCE, beside it
    return compile_kernel(SOURCE, name, block=BLOCK)


def axpby(alpha: float, x, beta: float, y):
    """y = alpha * x + beta * y, in place, for float32 CUDA tensors of one shape; returns y."""
    import torch

    for what, tensor in (("x", x), ("y", y)):
        if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda or tensor.dtype != torch.float32 or not tensor.is_contiguous():
            got = f"a {tensor.dtype} tensor on {tensor.device}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"axpby: {what} must be a contiguous float32 CUDA tensor, got {got}")
    if x.shape != y.shape or x.device != y.device:
        raise ValueError(f"axpby: x {tuple(x.shape)} on {x.device} and y {tuple(y.shape)} on {y.device} must match")
    n = y.numel()
    if n:
        blocks = min(MAX_BLOCKS, (n + BLOCK - 1) // BLOCK)
        kernel("mllm_axpby_f32")(x, y, float(alpha), float(beta), n, grid=blocks)
    return y
