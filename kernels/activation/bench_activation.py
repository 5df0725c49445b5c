"""Benchmark cases for silu_and_mul and gelu_and_mul (timed by the lead's driver)."""

import torch
import torch.nn.functional as F

from mllm_kernel.kernels.activation.activation import gelu_and_mul, silu_and_mul

# (tokens, 2 * d): x's shape.
CUDA_SHAPES = ((1, 2 * 4096), (128, 2 * 11008), (4096, 2 * 14336), (16384, 8192))
CPU_SHAPES = ((1, 2 * 4096), (32, 2 * 4096), (256, 4096))
CUDA_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CPU_DTYPES = (torch.float32, torch.bfloat16)


def _eager_silu(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def _eager_gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate=approximate) * x[..., d:]


def benchmark_cases(device: str) -> list[dict]:
    shapes = CUDA_SHAPES if device == "cuda" else CPU_SHAPES
    dtypes = CUDA_DTYPES if device == "cuda" else CPU_DTYPES
    gen = torch.Generator(device=device).manual_seed(0)
    cases = []
    for dtype in dtypes:
        size = torch.finfo(dtype).bits // 8
        for rows, cols in shapes:
            x = torch.randn(rows, cols, generator=gen, device=device, dtype=dtype)
            common = {
                "shape": f"{rows}x{cols}",
                "dtype": str(dtype).removeprefix("torch."),
                "bytes": (rows * cols + rows * (cols // 2)) * size,  # read x, write out
            }
            cases.append({**common, "op": "silu_and_mul",
                          "ours": lambda x=x: silu_and_mul(x), "eager": lambda x=x: _eager_silu(x)})
            cases.append({**common, "op": "gelu_and_mul",
                          "ours": lambda x=x: gelu_and_mul(x), "eager": lambda x=x: _eager_gelu(x, "none")})
            cases.append({**common, "op": "gelu_tanh_and_mul",
                          "ours": lambda x=x: gelu_and_mul(x, approximate="tanh"),
                          "eager": lambda x=x: _eager_gelu(x, "tanh")})
    return cases
