"""RMSNorm and fused residual-add + RMSNorm for CPU (Highway) and CUDA.

    out = x / sqrt(mean(x^2, -1) + eps) * weight

Math in float32 for every dtype; each output is rounded once to x's dtype.
fused_add_rms_norm updates in place: residual = x + residual (rounded to the dtype), then
x = rms_norm(residual, weight, eps), computed from the rounded residual.
Inputs need a unit stride along hidden; leading dims are flattened with views only (any row
stride that a view can express is passed to the kernel, nothing is copied).
"""

import math

import torch

from mllm_kernel.jit_utils import JitSpec, cache_once

SPECS = {
    "cpu": JitSpec(
        name="rms_norm",
        device="cpu",
        cpp_files=("rms_norm/rms_norm.cpp",),
        cpp_wrappers=(
            ("rms_norm", "mllm_kernel::cpu::rms_norm"),
            ("fused_add_rms_norm", "mllm_kernel::cpu::fused_add_rms_norm"),
        ),
    ),
    "cuda": JitSpec(
        name="rms_norm",
        device="cuda",
        cuda_files=("rms_norm/rms_norm.cuh",),
        cuda_wrappers=(
            ("rms_norm", "mllm_kernel::gpu::rms_norm"),
            ("fused_add_rms_norm", "mllm_kernel::gpu::fused_add_rms_norm"),
        ),
    ),
}


@cache_once
def _module(device_type: str):
    return SPECS[device_type].load()


def _device_type(op: str, t: torch.Tensor) -> str:
    if t.device.type not in SPECS:
        raise ValueError(f"{op}: unsupported device {t.device}; expected a cpu or cuda tensor")
    return t.device.type


def _rows(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """[..., hidden] as a [rows, hidden] view (never a copy)."""
    if t.dim() == 0:
        raise ValueError(f"{op}: {name} must have at least 1 dim [..., hidden], got a scalar")
    if t.dim() == 2:
        return t
    try:
        return t.view(math.prod(t.shape[:-1]), t.shape[-1])
    except RuntimeError as error:
        raise ValueError(
            f"{op}: {name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be "
            "viewed as [rows, hidden] without a copy; pass a contiguous tensor"
        ) from error


@torch.library.custom_op("mllm_kernel::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    x2 = _rows("rms_norm", "x", x)
    _module(_device_type("rms_norm", x)).rms_norm(_rows("rms_norm", "out", out), x2, weight, eps)
    return out


@_rms_norm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape)


@torch.library.custom_op("mllm_kernel::fused_add_rms_norm", mutates_args=("x", "residual"))
def _fused_add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    op = "fused_add_rms_norm"
    if x.shape != residual.shape:
        raise ValueError(f"{op}: x shape {tuple(x.shape)} != residual shape {tuple(residual.shape)}")
    _module(_device_type(op, x)).fused_add_rms_norm(_rows(op, "x", x), _rows(op, "residual", residual), weight, eps)


@_fused_add_rms_norm_op.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x [..., hidden], weight [hidden] (x's dtype) -> x / sqrt(mean(x^2) + eps) * weight."""
    _device_type("rms_norm", x)
    return _rms_norm_op(x, weight, float(eps))


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> None:
    """In place: residual += x (rounded to the dtype), then x = rms_norm(residual, weight, eps)."""
    _device_type("fused_add_rms_norm", x)
    _fused_add_rms_norm_op(x, residual, weight, float(eps))
