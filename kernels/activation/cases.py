"""silu_and_mul and gelu_and_mul: float64 references, report checks and benchmark cases."""

import math

import torch
import torch.nn.functional as F

from mllm_kernel.kernels.activation import gelu_and_mul, silu_and_mul
from mllm_kernel.kernels.checks import FLOATS, Checks, bench_case, bench_grid, dtype_name


def ref_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    a, b = x.double().chunk(2, -1)
    return a * torch.sigmoid(a) * b


def ref_gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    a, b = x.double().chunk(2, -1)
    if approximate == "tanh":
        return 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3))) * b
    # erfc, not 1 + erf(a / sqrt 2): that cancels for a < -5 (wrong by 2% at a = -8).
    return 0.5 * a * torch.special.erfc(-a * 0.5**0.5) * b


def check(c: Checks) -> None:
    for dtype in FLOATS:
        n = dtype_name(dtype)

        def act():
            x = c.randn(3, 2 * 700, dtype=dtype, scale=2.0)
            c.close(f"silu_and_mul {n}", [silu_and_mul(x)], [ref_silu_and_mul(x)])
            c.close(f"gelu_and_mul {n}", [gelu_and_mul(x)], [ref_gelu_and_mul(x)])
            c.close(f"gelu_and_mul[tanh] {n}", [gelu_and_mul(x, approximate="tanh")], [ref_gelu_and_mul(x, "tanh")])

        c.run(f"activation {n}", act)


# ----------------------------------------------------------------------------- benchmarks

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
    cases = []
    for dtype, size, (rows, cols), gen in bench_grid(device, (CUDA_DTYPES, CUDA_SHAPES), (CPU_DTYPES, CPU_SHAPES)):
        x = torch.randn(rows, cols, generator=gen, device=device, dtype=dtype)
        shape, nbytes = f"{rows}x{cols}", (rows * cols + rows * (cols // 2)) * size  # read x, write out
        cases += [
            bench_case("silu_and_mul", shape, dtype, lambda x=x: silu_and_mul(x), lambda x=x: _eager_silu(x), nbytes),
            bench_case("gelu_and_mul", shape, dtype, lambda x=x: gelu_and_mul(x),
                       lambda x=x: _eager_gelu(x, "none"), nbytes),
            bench_case("gelu_tanh_and_mul", shape, dtype, lambda x=x: gelu_and_mul(x, approximate="tanh"),
                       lambda x=x: _eager_gelu(x, "tanh"), nbytes),
        ]
    return cases
