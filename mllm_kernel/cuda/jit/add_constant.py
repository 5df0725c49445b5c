"""out = x + c for int32 CUDA tensors (kernels/add_constant/add_constant.cuh)."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils import cache_once, load_cuda_jit, make_cpp_args

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@cache_once
def _module(c: int):
    # c is a template argument, so every distinct constant is its own module.
    return load_cuda_jit(
        "add_constant",
        c,
        cuda_files=["add_constant/add_constant.cuh"],
        cuda_wrappers=[("add_constant", f"mllm_kernel::gpu::add_constant<{make_cpp_args(c)}>")],
    )


def add_constant(x: torch.Tensor, c: int) -> torch.Tensor:
    """x + c, with c any int32 value (each value compiles once)."""
    # Python decides which module to build, so it must check what a template int can hold.
    if isinstance(c, bool) or not isinstance(c, int):
        raise TypeError(f"add_constant: c must be an int, got {type(c).__name__}")
    if not INT32_MIN <= c <= INT32_MAX:
        raise ValueError(f"add_constant: c={c} is outside the int32 range")
    out = torch.empty_like(x)
    _module(c).add_constant(out, x)
    return out
