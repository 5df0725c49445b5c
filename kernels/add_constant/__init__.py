"""add_constant: out = x + c. CPU: float32, Highway (add_constant.cpp); CUDA: int32 (add_constant.cuh).

The first kernels of the library, kept small as the worked example of a kernel folder.
Public names: mllm_kernel.cpu.jit.add_constant / add_constant_runtime, mllm_kernel.cuda.jit.add_constant.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from mllm_kernel.jit_utils import JitSpec, cache_once, jit, make_cpp_args, register_spec

EXPORTS = ()  # the seed API exports these from mllm_kernel.cpu.jit and mllm_kernel.cuda.jit
ALLOWED_CONSTANTS = (1, 2, 4, 8, 16)
_FOLDER = Path(os.path.abspath(__file__)).parent  # not resolve(): under Bazel, stay in runfiles
_SOURCES = [str(_FOLDER / "add_constant.cpp")]


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

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def cuda_spec(c: int) -> JitSpec:
    # c is a template argument, so every distinct constant is its own module.
    return JitSpec(
        name="add_constant",
        device="cuda",
        cpp_args=make_cpp_args(c),
        cuda_files=(str(_FOLDER / "add_constant.cuh"),),
        cuda_wrappers=(("add_constant", f"mllm_kernel::gpu::add_constant<{make_cpp_args(c)}>"),),
    )


@cache_once
def _cuda_module(c: int):
    return register_spec(cuda_spec(c)).load()


def cuda_add_constant(x: torch.Tensor, c: int) -> torch.Tensor:
    """x + c for int32 CUDA tensors, with c any int32 value (each value compiles once)."""
    # Python decides which module to build, so it must check what a template int can hold.
    if isinstance(c, bool) or not isinstance(c, int):
        raise TypeError(f"add_constant: c must be an int, got {type(c).__name__}")
    if not INT32_MIN <= c <= INT32_MAX:
        raise ValueError(f"add_constant: c={c} is outside the int32 range")
    out = torch.empty_like(x)
    _cuda_module(c).add_constant(out, x)
    return out


# What the wheel ships prebuilt: every CPU module and the CUDA module for c = 1 (other constants
# compile on first use).
SPECS = [k.spec for k in _KERNELS.values()] + [_runtime_kernel.spec, cuda_spec(1)]
