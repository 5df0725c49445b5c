"""rms_norm and fused_add_rms_norm: float64 references, report checks and benchmark cases."""

import torch

from mllm_kernel.kernels.checks import FLOATS, Checks, bench_case, bench_grid, dtype_name
from mllm_kernel.kernels.rms_norm import fused_add_rms_norm, rms_norm

EPS = 1e-6


def ref_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps) * w.double()


def ref_fused(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = EPS):
    """(new x, new residual): the sum is rounded to the dtype (f32 add, one rounding) and the
    norm is computed from that rounded residual, like the kernels."""
    new_residual = (x.float() + residual.float()).to(x.dtype)
    return ref_rms_norm(new_residual, w, eps), new_residual


def check(c: Checks) -> None:
    for dtype in FLOATS:
        n = dtype_name(dtype)

        def rms():
            x, w = c.randn(5, 1000, dtype=dtype), c.randn(1000, dtype=dtype)
            c.close(f"rms_norm {n}", [rms_norm(x, w, EPS)], [ref_rms_norm(x, w)])

        def fused():
            x, r, w = c.randn(5, 1000, dtype=dtype), c.randn(5, 1000, dtype=dtype), c.randn(1000, dtype=dtype)
            want = ref_fused(x, r, w)
            fused_add_rms_norm(x, r, w, EPS)
            c.close(f"fused_add_rms_norm {n}", [x, r], [want[0], want[1].double()])

        c.run(f"rms_norm {n}", rms)
        c.run(f"fused_add_rms_norm {n}", fused)


# ----------------------------------------------------------------------------- benchmarks

CUDA_SHAPES = ((1, 4096), (128, 4096), (4096, 4096), (4096, 16384), (16384, 8192))
CPU_SHAPES = ((1, 4096), (32, 4096), (256, 4096))
CUDA_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CPU_DTYPES = (torch.float32, torch.bfloat16)


def _eager_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def _eager_fused(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor):
    # Out of place (compile friendly); same traffic: read x, r; write the new x and residual.
    new_r = x + r
    return _eager_rms_norm(new_r, w), new_r


def benchmark_cases(device: str) -> list[dict]:
    cases = []
    for dtype, size, (rows, hidden), gen in bench_grid(device, (CUDA_DTYPES, CUDA_SHAPES), (CPU_DTYPES, CPU_SHAPES)):
        x = torch.randn(rows, hidden, generator=gen, device=device, dtype=dtype)
        r = torch.randn(rows, hidden, generator=gen, device=device, dtype=dtype)
        w = torch.randn(hidden, generator=gen, device=device, dtype=dtype)
        shape = f"{rows}x{hidden}"
        cases.append(bench_case("rms_norm", shape, dtype, lambda x=x, w=w: rms_norm(x, w, EPS),
                                lambda x=x, w=w: _eager_rms_norm(x, w),
                                (2 * rows * hidden + hidden) * size))  # read x (+ weight), write out
        # In place on its own copies: repeated calls keep values finite (x is normalized each
        # call; the residual grows by O(1) per call).
        xf, rf = x.clone(), r.clone()
        cases.append(bench_case("fused_add_rms_norm", shape, dtype,
                                lambda x=xf, r=rf, w=w: fused_add_rms_norm(x, r, w, EPS),
                                lambda x=x, r=r, w=w: _eager_fused(x, r, w),
                                (4 * rows * hidden + hidden) * size))  # read x, r (+ weight), write x, r
    return cases
