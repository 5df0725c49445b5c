"""The report's checks (tools/report.py): each op package's `cases.check(checks)` runs its ops on
small fixed random inputs and compares them with its float64 references through these helpers."""

from __future__ import annotations

import math

import torch

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# (atol, rtol) of a dtype's output against the float64 reference of the same (rounded) inputs:
# a few ulps of the output dtype plus float32 accumulation.
TOL = {torch.float32: (1e-5, 1e-4), torch.float16: (1e-3, 4e-3), torch.bfloat16: (8e-3, 1.6e-2)}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def bench_case(op: str, shape: str, dtype: torch.dtype, ours, eager, nbytes: int, **options) -> dict:
    """One row of benchmarks/bench_ops.py: zero-argument callables `ours` and `eager` (checked
    against each other, then timed) moving at least `nbytes`; options: check=False, graph=False."""
    return {"op": op, "shape": shape, "dtype": dtype_name(dtype), "ours": ours, "eager": eager,
            "bytes": nbytes, **options}


def bench_grid(device: str, cuda: tuple, cpu: tuple):
    """(dtype, element size, shape, generator) over the (dtypes, shapes) of the device."""
    dtypes, shapes = cuda if device == "cuda" else cpu
    gen = torch.Generator(device=device).manual_seed(0)
    for dtype in dtypes:
        for shape in shapes:
            yield dtype, torch.finfo(dtype).bits // 8, shape, gen


class Checks:
    def __init__(self, device: str, seed: int = 1234):
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)
        self.results: list[tuple[str, bool, str]] = []

    def randn(self, *shape, dtype=torch.float32, scale=1.0) -> torch.Tensor:
        # Drawn on CPU from one seeded generator: the same inputs on every device.
        return (torch.randn(*shape, generator=self.gen, dtype=torch.float64) * scale).to(dtype).to(self.device)

    def close(self, label: str, got_list, want_list) -> None:
        """Float outputs vs float64 references: max |err| and the worst err / (atol + rtol |ref|)."""
        worst_err, worst_ratio = 0.0, 0.0
        for got, want in zip(got_list, want_list):
            atol, rtol = TOL[got.dtype]
            err = (got.double().cpu() - want.cpu()).abs()
            worst_err = max(worst_err, err.max().item())
            worst_ratio = max(worst_ratio, (err / (atol + rtol * want.cpu().abs())).max().item())
        ok = worst_ratio <= 1.0 and math.isfinite(worst_ratio)
        self.results.append((label, ok, f"max err {worst_err:.2e} ({worst_ratio:.2f} of tol)"))

    def equal(self, label: str, got, want) -> None:
        got, want = got.cpu(), want.cpu()
        if got.dtype.is_floating_point:
            differs = got.double() != want.double()  # -inf == -inf: masked outputs compare equal
            mismatched = int(differs.sum())
            err = (got.double() - want.double())[differs].abs().max().item() if mismatched else 0.0
            detail = f"max err {err:.2e} (exact expected)"
        else:
            mismatched = int((got != want).sum())
            detail = f"{mismatched}/{want.numel()} ids differ"
        self.results.append((label, got.shape == want.shape and mismatched == 0, detail))

    def run(self, label: str, fn) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a raising op is a FAIL, the others still run
            first = str(e).splitlines()[0][:160] if str(e) else ""
            self.results.append((label, False, f"{type(e).__name__}: {first}"))
