"""out = x + c for float32 CPU tensors (kernels/add_constant/add_constant.cpp)."""

from __future__ import annotations

import torch

from mllm_kernel.jit_utils import jit

ALLOWED_CONSTANTS = (1, 2, 4, 8, 16)
_SOURCES = ["add_constant/add_constant.cpp"]


def _compile_time_kernel(c: int):
    # One module per constant: c is a template argument, folded into the SIMD code.
    @jit(args=c, device="cpu", cpp_files=_SOURCES, func_name="mllm_kernel::cpu::add_constant")
    def _kernel(compiled_module, dst: torch.Tensor, src: torch.Tensor) -> None:
        compiled_module.add_constant(dst, src)

    return _kernel


_KERNELS = {c: _compile_time_kernel(c) for c in ALLOWED_CONSTANTS}


@jit(device="cpu", cpp_files=_SOURCES, func_name="mllm_kernel::cpu::add_constant_runtime")
def _runtime_kernel(compiled_module, dst: torch.Tensor, src: torch.Tensor, c: float) -> None:
    compiled_module.add_constant_runtime(dst, src, c)


def add_constant(x: torch.Tensor, c: int) -> torch.Tensor:
    """x + c with c known at compile time; c must be one of ALLOWED_CONSTANTS."""
    kernel = _KERNELS.get(c)
    if kernel is None:
        raise ValueError(f"add_constant: c must be one of {ALLOWED_CONSTANTS}, got {c!r}")
    out = torch.empty_like(x)
    kernel(out, x)
    return out


def add_constant_runtime(x: torch.Tensor, c: float) -> torch.Tensor:
    """x + c with c passed at run time."""
    out = torch.empty_like(x)
    _runtime_kernel(out, x, float(c))
    return out
