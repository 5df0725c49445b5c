"""Gated activations for CPU (Highway) and CUDA: x [..., 2d] -> act(x[..., :d]) * x[..., d:].

silu_and_mul: act = x * sigmoid(x). gelu_and_mul: act = exact (erf) gelu, or its tanh
approximation with approximate="tanh" (as torch.nn.functional.gelu). Math in float32 for every
dtype; each output is rounded once to x's dtype. x needs a unit stride along the last dim;
leading dims are flattened with views only (a row stride is passed to the kernel, no copy).
"""


import torch

from mllm_kernel.kernels.op_modules import DeviceModules, custom_op, op_specs, rows_view

SPECS = op_specs("activation", ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"))

_GELU_APPROXIMATE = ("none", "tanh")


_module = DeviceModules(SPECS)


def _out_shape(op: str, x: torch.Tensor) -> list[int]:
    if x.dim() == 0 or x.shape[-1] % 2 != 0:
        raise ValueError(f"{op}: x must be [..., 2*d] with an even last dim, got shape {tuple(x.shape)}")
    return [*x.shape[:-1], x.shape[-1] // 2]


def _run(op: str, export: str, x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty(_out_shape(op, x))
    getattr(_module.for_tensor(op, x), export)(rows_view(op, "out", out), rows_view(op, "x", x))
    return out


@custom_op("silu_and_mul")
def _silu_and_mul_op(x: torch.Tensor) -> torch.Tensor:
    return _run("silu_and_mul", "silu_and_mul", x)


@_silu_and_mul_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(_out_shape("silu_and_mul", x))


@custom_op("gelu_and_mul")
def _gelu_and_mul_op(x: torch.Tensor, approximate: str) -> torch.Tensor:
    if approximate not in _GELU_APPROXIMATE:
        raise ValueError(f"gelu_and_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
    export = "gelu_tanh_and_mul" if approximate == "tanh" else "gelu_and_mul"
    return _run("gelu_and_mul", export, x)


@_gelu_and_mul_op.register_fake
def _(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return x.new_empty(_out_shape("gelu_and_mul", x))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2d] -> silu(x[..., :d]) * x[..., d:]."""
    _module.device_type("silu_and_mul", x)
    return _silu_and_mul_op(x)


def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """x [..., 2d] -> gelu(x[..., :d], approximate) * x[..., d:]; approximate: "none" | "tanh"."""
    if approximate not in _GELU_APPROXIMATE:
        raise ValueError(f"gelu_and_mul: approximate must be 'none' or 'tanh', got {approximate!r}")
    _module.device_type("gelu_and_mul", x)
    return _gelu_and_mul_op(x, approximate)
