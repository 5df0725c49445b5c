"""softmax / log_softmax over the last dim (kernels/softmax/softmax.cpp, softmax.cuh).

x: [..., vocab] float32 / float16 / bfloat16 on CPU or CUDA; the output has x's shape and
dtype (contiguous). Accumulation is float32. The last dim must be contiguous; leading dims
must collapse into one row dim without a copy (a row stride is fine).

Temperature: any positive finite float (0, negative, NaN and inf raise ValueError). Both devices
compute exp((x - max) / T) with the subtraction first, as (x/2 - max/2) * (2/T) in float32, so
the row max's exponent is exactly 0 and every other one <= 0: finite logits never give NaN,
small temperatures reach the limit T -> 0, the one-hot of the row max with ties split evenly
(e.g. T = 1e-9, 1e-39, 5e-324), and huge ones the uniform row. 1/T saturates at 2^125, so
temperatures below 2^-125 (~2.4e-38) act as 2^-125: only logits within ~1e-36 of the row max
(an issue for denormal-sized logits alone) then keep a share of the max's weight. Rows with
+inf or only -inf logits give NaN, as in torch.
"""

from __future__ import annotations

import math

import torch

from mllm_kernel.kernels.op_modules import DeviceModules, custom_op, op_specs, rows_view

EXPORTS = ("softmax", "log_softmax")
SPECS = op_specs(__file__, EXPORTS)
_modules = DeviceModules(SPECS)


# The CPU module takes a thread count last; the CUDA one does not. (Inline in each body: a
# helper would be one Python frame more per call.)
@custom_op("softmax")
def _softmax(x: torch.Tensor, temperature: float, num_threads: int) -> torch.Tensor:
    if not (temperature > 0.0 and math.isfinite(temperature)):
        raise ValueError(f"softmax: temperature must be a positive finite number, got {temperature}")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    threads = (num_threads,) if x.device.type == "cpu" else ()
    if x.dim() == 2:
        _modules[x.device.type].softmax(out, x, temperature, *threads)
    else:
        x2 = rows_view("softmax", "x", x)
        _modules[x.device.type].softmax(rows_view("softmax", "out", out), x2, temperature, *threads)
    return out


@_softmax.register_fake
def _(x: torch.Tensor, temperature: float, num_threads: int) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@custom_op("log_softmax")
def _log_softmax(x: torch.Tensor, num_threads: int) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    threads = (num_threads,) if x.device.type == "cpu" else ()
    if x.dim() == 2:
        _modules[x.device.type].log_softmax(out, x, *threads)
    else:
        x2 = rows_view("log_softmax", "x", x)
        _modules[x.device.type].log_softmax(rows_view("log_softmax", "out", out), x2, *threads)
    return out


@_log_softmax.register_fake
def _(x: torch.Tensor, num_threads: int) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _check_threads(op: str, num_threads) -> None:
    """Raises the error for a num_threads that is not an int >= 1, on every device (CUDA ignores
    the value, but a bad one is still refused)."""
    if type(num_threads) is not int:
        raise TypeError(f"{op}: num_threads must be an int >= 1, got {type(num_threads).__name__} {num_threads!r}")
    raise ValueError(f"{op}: num_threads must be >= 1, got {num_threads}")


def softmax(x: torch.Tensor, temperature: float = 1.0, *, num_threads: int = 1) -> torch.Tensor:
    """softmax(x / temperature) over the last dim (numerically stable: the row max is
    subtracted first). temperature must be > 0. num_threads (CPU; CUDA ignores it): rows over
    that many threads (a pool kept between calls); results do not depend on it."""
    if type(num_threads) is not int or num_threads < 1:
        _check_threads("softmax", num_threads)
    return _softmax(x, temperature, num_threads)


def log_softmax(x: torch.Tensor, *, num_threads: int = 1) -> torch.Tensor:
    """log(softmax(x)) over the last dim, computed as (x - max) - log(sum(exp(x - max)));
    num_threads as for softmax."""
    if type(num_threads) is not int or num_threads < 1:
        _check_threads("log_softmax", num_threads)
    return _log_softmax(x, num_threads)
