"""softmax / log_softmax over the last dim (kernels/softmax/softmax.cpp, softmax.cuh).

x: [..., vocab] float32 / float16 / bfloat16 on CPU or CUDA; the output has x's shape and
dtype (contiguous). Accumulation is float32. The last dim must be contiguous; leading dims
must collapse into one row dim without a copy (a row stride is fine).
"""

from __future__ import annotations

import math

import torch

from mllm_kernel.kernels.op_modules import DeviceModules, custom_op, op_specs, rows_view

SPECS = op_specs("softmax", ("softmax", "log_softmax"))


_module = DeviceModules(SPECS)


@custom_op("softmax")
def _softmax_op(x: torch.Tensor, temperature: float) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    op = "softmax"
    _module.for_tensor(op, x).softmax(rows_view(op, "out", out), rows_view(op, "x", x), temperature)
    return out


@_softmax_op.register_fake
def _(x: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@custom_op("log_softmax")
def _log_softmax_op(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    op = "log_softmax"
    _module.for_tensor(op, x).log_softmax(rows_view(op, "out", out), rows_view(op, "x", x))
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
    _module.device_type("softmax", x)
    return _softmax_op(x, temperature)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    """log(softmax(x)) over the last dim, computed as (x - max) - log(sum(exp(x - max)))."""
    _module.device_type("log_softmax", x)
    return _log_softmax_op(x)
