"""softmax / log_softmax over the last dim (kernels/softmax/softmax.cpp, softmax.cuh).

x: [..., vocab] float32 / float16 / bfloat16 on CPU or CUDA; the output has x's shape and
dtype (contiguous). Accumulation is float32. The last dim must be contiguous; leading dims
must collapse into one row dim without a copy (a row stride is fine).
"""

from __future__ import annotations

import math

import torch

from mllm_kernel.jit_utils import JitSpec, cache_once

SPECS = {
    "cpu": JitSpec(
        name="softmax",
        device="cpu",
        cpp_files=("softmax/softmax.cpp",),
        cpp_wrappers=(
            ("softmax", "mllm_kernel::cpu::softmax"),
            ("log_softmax", "mllm_kernel::cpu::log_softmax"),
        ),
    ),
    "cuda": JitSpec(
        name="softmax",
        device="cuda",
        cuda_files=("softmax/softmax.cuh",),
        cuda_wrappers=(
            ("softmax", "mllm_kernel::gpu::softmax"),
            ("log_softmax", "mllm_kernel::gpu::log_softmax"),
        ),
    ),
}


@cache_once
def _module(device_type: str):
    return SPECS[device_type].load()


def _device_type(x: torch.Tensor, op: str) -> str:
    if x.device.type not in SPECS:
        raise ValueError(f"{op}: unsupported device {x.device}; expected cpu or cuda")
    return x.device.type


def _rows(x: torch.Tensor, op: str) -> torch.Tensor:
    """x as a 2-D [rows, vocab] view (never a copy); the C++ matcher checks the strides."""
    if x.dim() == 0:
        raise ValueError(f"{op}: expected a tensor with at least 1 dim, got a scalar")
    if x.dim() == 2:
        return x
    if x.dim() == 1:
        return x.unsqueeze(0)
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError as error:
        raise ValueError(
            f"{op}: the leading dims of x (shape {tuple(x.shape)}, strides {x.stride()}) cannot be "
            "flattened into one row dim without a copy; pass a contiguous tensor"
        ) from error


@torch.library.custom_op("mllm_kernel::softmax", mutates_args=())
def _softmax_op(x: torch.Tensor, temperature: float) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _module(_device_type(x, "softmax")).softmax(_rows(out, "softmax"), _rows(x, "softmax"), temperature)
    return out


@_softmax_op.register_fake
def _(x: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("mllm_kernel::log_softmax", mutates_args=())
def _log_softmax_op(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _module(_device_type(x, "log_softmax")).log_softmax(_rows(out, "log_softmax"), _rows(x, "log_softmax"))
    return out


@_log_softmax_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def softmax(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """softmax(x / temperature) over the last dim (numerically stable: the row max is
    subtracted first). temperature must be > 0."""
    temperature = float(temperature)
    if not (temperature > 0.0 and math.isfinite(temperature)):
        raise ValueError(f"softmax: temperature must be a positive finite number, got {temperature}")
    _device_type(x, "softmax")
    return _softmax_op(x, temperature)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    """log(softmax(x)) over the last dim, computed as (x - max) - log(sum(exp(x - max)))."""
    _device_type(x, "log_softmax")
    return _log_softmax_op(x)
