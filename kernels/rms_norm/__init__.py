"""RMSNorm and fused residual-add + RMSNorm for CPU (Highway) and CUDA.

    out = x / sqrt(mean(x^2, -1) + eps) * weight

Math in float32 for every dtype; each output is rounded once to x's dtype.
fused_add_rms_norm updates in place: residual = x + residual (rounded to the dtype), then
x = rms_norm(residual, weight, eps), computed from the rounded residual.
Inputs need a unit stride along hidden; leading dims are flattened with views only (any row
stride that a view can express is passed to the kernel, nothing is copied).
eps must be finite and >= 0 (else ValueError). A row whose float32 mean(x^2) + eps is 0 (an
all-zero row with eps = 0, or with eps = 0 a row so small that its squares underflow) comes
out as zeros, never 0 * inf = NaN; a row whose mean square overflows float32 (|x| > ~1e19)
comes out as zeros too. Written tensors (fused: x and residual) must not overlap each other,
themselves or weight (ValueError naming both).
"""

import torch

from mllm_kernel.kernels.op_modules import DeviceModules, custom_op, op_specs, rows_view

EXPORTS = ("rms_norm", "fused_add_rms_norm")
SPECS = op_specs(__file__, EXPORTS)
_modules = DeviceModules(SPECS)


@custom_op("rms_norm")
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.dim() == 2:
        _modules[x.device.type].rms_norm(out, x, weight, eps)
    else:
        x2 = rows_view("rms_norm", "x", x)
        _modules[x.device.type].rms_norm(rows_view("rms_norm", "out", out), x2, weight, eps)
    return out


@_rms_norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape)


@custom_op("fused_add_rms_norm", mutates_args=("x", "residual"))
def _fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    if x.shape != residual.shape:
        raise ValueError(f"fused_add_rms_norm: x shape {tuple(x.shape)} != residual shape {tuple(residual.shape)}")
    if x.dim() != 2:
        x, residual = rows_view("fused_add_rms_norm", "x", x), rows_view("fused_add_rms_norm", "residual", residual)
    _modules[x.device.type].fused_add_rms_norm(x, residual, weight, eps)


@_fused_add_rms_norm.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x [..., hidden], weight [hidden] (x's dtype) -> x / sqrt(mean(x^2) + eps) * weight."""
    return _rms_norm(x, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
    """In place: residual += x (rounded to the dtype), then x = rms_norm(residual, weight, eps)."""
    _fused_add_rms_norm(x, residual, weight, eps)
