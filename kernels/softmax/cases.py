"""softmax and log_softmax: float64 references, report checks and benchmark cases."""

from __future__ import annotations

import torch

from mllm_kernel.kernels.checks import FLOATS, Checks, dtype_name
from mllm_kernel.kernels.softmax import log_softmax, softmax


def ref_softmax(x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    return torch.softmax(x.double() / temperature, -1)


def ref_log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x.double(), -1)


def check(c: Checks) -> None:
    for dtype in FLOATS:
        n = dtype_name(dtype)

        def soft():
            x = c.randn(4, 3000, dtype=dtype, scale=3.0)
            c.close(f"softmax {n}", [softmax(x, 0.7)], [ref_softmax(x, 0.7)])
            c.close(f"log_softmax {n}", [log_softmax(x)], [ref_log_softmax(x)])

        c.run(f"softmax {n}", soft)


# ----------------------------------------------------------------------------- benchmarks

_SHAPES = {
    "cpu": ((1, 32000), (16, 32000), (256, 4096), (4, 128256)),
    "cuda": ((1, 128256), (64, 128256), (256, 32000), (16384, 8192), (4096, 151936)),
}
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def benchmark_cases(device: str) -> list[dict]:
    cases = []
    for rows, vocab in _SHAPES[device]:
        for dtype in _DTYPES:
            if device == "cpu" and dtype == torch.float16:
                continue  # torch's CPU fp16 softmax is not a meaningful baseline
            g = torch.Generator().manual_seed(0)
            x = (torch.randn(rows, vocab, generator=g) * 3).to(dtype=dtype, device=device)
            nbytes = 2 * rows * vocab * x.element_size()
            shape, name = f"{rows}x{vocab}", str(dtype).removeprefix("torch.")
            cases.append({
                "op": "softmax", "shape": shape, "dtype": name, "bytes": nbytes,
                "ours": lambda x=x: softmax(x, 0.7),
                "eager": lambda x=x: torch.softmax(x.float() / 0.7, dim=-1).to(x.dtype),
            })
            cases.append({
                "op": "log_softmax", "shape": shape, "dtype": name, "bytes": nbytes,
                "ours": lambda x=x: log_softmax(x),
                "eager": lambda x=x: torch.log_softmax(x.float(), dim=-1).to(x.dtype),
            })
    return cases
