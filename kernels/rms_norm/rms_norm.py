"""RMSNorm and fused residual-add + RMSNorm for CPU (Highway) and CUDA.

    out = x / sqrt(mean(x^2, -1) + eps) * weight

Math in float32 for every dtype; each output is rounded once to x's dtype.
fused_add_rms_norm updates in place: residual = x + residual (rounded to the dtype), then
x = rms_norm(residual, weight, eps), computed from the rounded residual.
Inputs need a unit stride along hidden; leading dims are flattened with views only (any row
stride that a view can express is passed to the kernel, nothing is copied).
"""


import torch

from mllm_kernel.kernels.op_modules import DeviceModules, custom_op, op_specs, rows_view

SPECS = op_specs("rms_norm", ("rms_norm", "fused_add_rms_norm"))


_module = DeviceModules(SPECS)


@custom_op("rms_norm")
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    op = "rms_norm"
    _module.for_tensor(op, x).rms_norm(rows_view(op, "out", out), rows_view(op, "x", x), weight, eps)
    return out


@_rms_norm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape)


@custom_op("fused_add_rms_norm", mutates_args=("x", "residual"))
def _fused_add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    op = "fused_add_rms_norm"
    if x.shape != residual.shape:
        raise ValueError(f"{op}: x shape {tuple(x.shape)} != residual shape {tuple(residual.shape)}")
    module = _module.for_tensor(op, x)
    module.fused_add_rms_norm(rows_view(op, "x", x), rows_view(op, "residual", residual), weight, eps)


@_fused_add_rms_norm_op.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x [..., hidden], weight [hidden] (x's dtype) -> x / sqrt(mean(x^2) + eps) * weight."""
    _module.device_type("rms_norm", x)
    return _rms_norm_op(x, weight, float(eps))


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
    """In place: residual += x (rounded to the dtype), then x = rms_norm(residual, weight, eps)."""
    _module.device_type("fused_add_rms_norm", x)
    _fused_add_rms_norm_op(x, residual, weight, float(eps))
