"""softmax / log_softmax over the last dim (kernels/softmax/softmax.cpp, softmax.cuh).

x: [..., vocab] float32 / float16 / bfloat16 on CPU or CUDA; the output has x's shape and
dtype (contiguous). Accumulation is float32. The last dim must be contiguous; leading dims
must collapse into one row dim without a copy (a row stride is fine).
"""

from __future__ import annotations

import math

import torch

from mllm_kernel.kernels.op_modules import DeviceModules, custom_op, op_specs, rows_view

EXPORTS = ("softmax", "log_softmax")
SPECS = op_specs(__file__, EXPORTS)
_modules = DeviceModules(SPECS)


@custom_op("softmax")
def _softmax(x: torch.Tensor, temperature: float) -> torch.Tensor:
    if not (temperature > 0.0 and math.isfinite(temperature)):
        raise ValueError(f"softmax: temperature must be a positive finite number, got {temperature}")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.dim() == 2:
        _modules[x.device.type].softmax(out, x, temperature)
    else:
        _modules[x.device.type].softmax(rows_view("softmax", "out", out), rows_view("softmax", "x", x), temperature)
    return out


@_softmax.register_fake
def _(x: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@custom_op("log_softmax")
def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.dim() == 2:
        _modules[x.device.type].log_softmax(out, x)
    else:
        _modules[x.device.type].log_softmax(rows_view("log_softmax", "out", out), rows_view("log_softmax", "x", x))
    return out


@_log_softmax.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def softmax(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """softmax(x / temperature) over the last dim (numerically stable: the row max is
    subtracted first). temperature must be > 0."""
    return _softmax(x, temperature)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    """log(softmax(x)) over the last dim, computed as (x - max) - log(sum(exp(x - max)))."""
    return _log_softmax(x)
