"""Gated activations for CPU (Highway) and CUDA: x [..., 2d] -> act(x[..., :d]) * x[..., d:].

silu_and_mul: act = x * sigmoid(x). gelu_and_mul: act = exact (erf) gelu, or its tanh
approximation with approximate="tanh" (as torch.nn.functional.gelu). Math in float32 for every
dtype; each output is rounded once to x's dtype. x needs a unit stride along the last dim;
leading dims are flattened with views only (a row stride is passed to the kernel, no copy).
"""

import torch

from mllm_kernel.kernels.op_modules import DeviceModules, custom_op, op_specs, rows_view

EXPORTS = ("silu_and_mul", "gelu_and_mul")
SPECS = op_specs(__file__, ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"))
_modules = DeviceModules(SPECS)

_GELU_EXPORTS = {"none": "gelu_and_mul", "tanh": "gelu_tanh_and_mul"}


def _out_shape(op: str, x: torch.Tensor) -> list[int]:
    if x.dim() == 0 or x.shape[-1] % 2 != 0:
        raise ValueError(f"{op}: x must be [..., 2*d] with an even last dim, got shape {tuple(x.shape)}")
    return [*x.shape[:-1], x.shape[-1] // 2]


def _run(module_fn, op: str, x: torch.Tensor) -> torch.Tensor:
    # The shape check of _out_shape, inlined: this is the hot path (one Python frame less).
    if x.dim() == 0 or x.shape[-1] % 2 != 0:
        raise ValueError(f"{op}: x must be [..., 2*d] with an even last dim, got shape {tuple(x.shape)}")
    out = x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
    if x.dim() == 2:
        module_fn(out, x)
    else:
        x2 = rows_view(op, "x", x)
        module_fn(rows_view(op, "out", out), x2)
    return out


@custom_op("silu_and_mul")
def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _run(_modules[x.device.type].silu_and_mul, "silu_and_mul", x)


@_silu_and_mul.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(_out_shape("silu_and_mul", x))


@custom_op("gelu_and_mul")
def _gelu_and_mul(x: torch.Tensor, approximate: str) -> torch.Tensor:
    export = _GELU_EXPORTS.get(approximate)
    if export is None:
        if not isinstance(approximate, str):
            raise TypeError(f"gelu_and_mul: approximate must be a str ('none' or 'tanh'), got {type(approximate).__name__}")
        raise ValueError(f"gelu_and_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _run(getattr(_modules[x.device.type], export), "gelu_and_mul", x)


@_gelu_and_mul.register_fake
def _(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return x.new_empty(_out_shape("gelu_and_mul", x))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2d] -> silu(x[..., :d]) * x[..., d:]."""
    return _silu_and_mul(x)


def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """x [..., 2d] -> gelu(x[..., :d], approximate) * x[..., d:]; approximate: "none" | "tanh"."""
    return _gelu_and_mul(x, approximate)
