"""bazel run //tools:report: the main-job report. Runs every op on the best available device
(CUDA if torch sees a GPU, else CPU) on small fixed random inputs, checks each against a
float64 torch reference (PASS/FAIL with the max error), then prints a quick benchmark table
(benchmarks/bench_ops.py --quick). Exit code 1 if any check fails. Works on CPU-only machines.

    python3 tools/report.py [--device cpu|cuda] [--no-bench]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from mllm_kernel import env_info  # noqa: E402
from mllm_kernel.kernels.activation.activation import gelu_and_mul, silu_and_mul  # noqa: E402
from mllm_kernel.kernels.embedding.embedding import embedding  # noqa: E402
from mllm_kernel.kernels.kv_cache.kv_cache import store_kv_cache  # noqa: E402
from mllm_kernel.kernels.rms_norm.rms_norm import fused_add_rms_norm, rms_norm  # noqa: E402
from mllm_kernel.kernels.rope.rope import apply_rope  # noqa: E402
from mllm_kernel.kernels.sampling.sampling import (  # noqa: E402
    greedy_sample,
    min_p_sample_from_uniforms,
    top_k_top_p_sample_from_uniforms,
)
from mllm_kernel.kernels.softmax.softmax import log_softmax, softmax  # noqa: E402

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# (atol, rtol) of a dtype's output against the float64 reference of the same (rounded) inputs:
# a few ulps of the output dtype plus float32 accumulation.
TOL = {torch.float32: (1e-5, 1e-4), torch.float16: (1e-3, 4e-3), torch.bfloat16: (8e-3, 1.6e-2)}
EPS = 1e-6


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class Checks:
    def __init__(self, device: str):
        self.device = device
        self.gen = torch.Generator().manual_seed(1234)
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
            mismatched = int((got.double() != want.double()).sum())
            err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
            detail = f"max err {err:.2e} (exact expected)"
        else:
            mismatched = int((got != want).sum())
            detail = f"{mismatched}/{want.numel()} ids differ"
        self.results.append((label, got.shape == want.shape and mismatched == 0, detail))

    def run(self, label: str, fn) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a raising op is a FAIL, the others still run
            self.results.append((label, False, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"))


# ----------------------------------------------------------------------------- references (float64)


def ref_rms_norm(x, w):
    x = x.double()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * w.double()


def ref_rope(x, positions, cache, rot, is_neox):
    x = x.double().clone()
    cos = cache[positions, : rot // 2].double().unsqueeze(1)
    sin = cache[positions, rot // 2 :].double().unsqueeze(1)
    idx1 = torch.arange(rot // 2) if is_neox else torch.arange(0, rot, 2)
    idx2 = idx1 + rot // 2 if is_neox else idx1 + 1
    x1, x2 = x[..., idx1].clone(), x[..., idx2].clone()
    x[..., idx1] = x1 * cos - x2 * sin
    x[..., idx2] = x2 * cos + x1 * sin
    return x


def ref_pick(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """First index, in index order, whose running kept weight exceeds u * total (the kernels' rule)."""
    cdf = weights.cumsum(-1)
    target = (u.double() * cdf[:, -1]).unsqueeze(-1)
    return (cdf <= target).sum(-1).clamp_max(weights.shape[-1] - 1)


def away_from_boundaries(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Move each uniform off CDF boundaries (float32 vs float64 sums may round either way
    there), so the sampled ids must match exactly."""
    cdf = weights.cumsum(-1) / weights.sum(-1, keepdim=True)
    u = u.double().clone()
    for row in range(u.shape[0]):
        for _ in range(100):
            if (cdf[row] - u[row]).abs().min() > 1e-4:
                break
            u[row] = (u[row] + 3.7e-3) % 1.0
    return u.float()


def ref_top_k_top_p_weights(logits, top_k: int, top_p: float) -> torch.Tensor:
    x = logits.double()
    probs = torch.softmax(x, -1)
    kth = x.topk(top_k, -1).values[:, -1:]
    probs = probs.masked_fill(x < kth, 0.0)  # ties at the k-th value stay
    total = probs.sum(-1, keepdim=True)
    # A token stays when the mass of strictly more probable tokens is < top_p of the top-k mass.
    before = torch.stack([(probs[r].unsqueeze(0) * (probs[r].unsqueeze(0) > probs[r].unsqueeze(1))).sum(-1)
                          for r in range(probs.shape[0])])
    return probs.masked_fill(before >= top_p * total, 0.0)


# ----------------------------------------------------------------------------- checks


def check_all(c: Checks) -> None:
    for dtype in FLOATS:
        n = _name(dtype)

        def rms():
            x, w = c.randn(5, 1000, dtype=dtype), c.randn(1000, dtype=dtype)
            c.close(f"rms_norm {n}", [rms_norm(x, w, EPS)], [ref_rms_norm(x, w)])
        c.run(f"rms_norm {n}", rms)

        def fused():
            x, r, w = c.randn(5, 1000, dtype=dtype), c.randn(5, 1000, dtype=dtype), c.randn(1000, dtype=dtype)
            new_r = (x.double() + r.double()).to(dtype)  # the kernel rounds the residual to the dtype
            want = [ref_rms_norm(new_r, w), new_r.double()]
            fused_add_rms_norm(x, r, w, EPS)
            c.close(f"fused_add_rms_norm {n}", [x, r], want)
        c.run(f"fused_add_rms_norm {n}", fused)

        def act():
            x = c.randn(3, 2 * 700, dtype=dtype, scale=2.0)
            a, b = x.double()[:, :700], x.double()[:, 700:]
            c.close(f"silu_and_mul {n}", [silu_and_mul(x)], [a * torch.sigmoid(a) * b])
            c.close(f"gelu_and_mul {n}", [gelu_and_mul(x)], [0.5 * a * (1 + torch.erf(a / math.sqrt(2))) * b])
            tanh = 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))
            c.close(f"gelu_and_mul[tanh] {n}", [gelu_and_mul(x, approximate="tanh")], [tanh * b])
        c.run(f"activation {n}", act)

        def soft():
            x = c.randn(4, 3000, dtype=dtype, scale=3.0)
            c.close(f"softmax {n}", [softmax(x, 0.7)], [torch.softmax(x.double() / 0.7, -1)])
            c.close(f"log_softmax {n}", [log_softmax(x)], [torch.log_softmax(x.double(), -1)])
        c.run(f"softmax {n}", soft)

        def sampling():
            logits = c.randn(6, 2000, dtype=dtype, scale=3.0)
            c.equal(f"greedy_sample {n}", greedy_sample(logits), logits.double().argmax(-1))
            u = torch.rand(6, generator=c.gen)
            weights = ref_top_k_top_p_weights(logits.cpu(), 50, 0.9)
            uk = away_from_boundaries(weights, u)
            got = top_k_top_p_sample_from_uniforms(logits, uk.to(c.device), 50, 0.9)
            c.equal(f"top_k_top_p_sample {n}", got, ref_pick(weights, uk))
            probs = torch.softmax(logits.double(), -1).to(dtype)
            p = probs.cpu().double()
            kept = p.masked_fill(p < 0.05 * p.amax(-1, keepdim=True), 0.0)
            um = away_from_boundaries(kept, u)
            c.equal(f"min_p_sample {n}", min_p_sample_from_uniforms(probs, um.to(c.device), 0.05), ref_pick(kept, um))
        c.run(f"sampling {n}", sampling)

        def rope():
            max_pos, head_dim = 512, 64
            for rot, is_neox in ((64, True), (64, False), (32, True)):
                inv = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
                freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
                cache = torch.cat([freqs.cos(), freqs.sin()], -1).float().to(c.device)
                q, k = c.randn(7, 4, head_dim, dtype=dtype), c.randn(7, 2, head_dim, dtype=dtype)
                pos = torch.randint(0, max_pos, (7,), generator=c.gen).to(c.device)
                want = [ref_rope(t.cpu(), pos.cpu(), cache.cpu(), rot, is_neox) for t in (q, k)]
                apply_rope(q, k, pos, cache, is_neox)
                c.close(f"apply_rope[{'neox' if is_neox else 'gptj'} rot={rot}] {n}", [q, k], want)
        c.run(f"apply_rope {n}", rope)

        def kv():
            tokens, blocks, block, heads, dim = 9, 4, 8, 2, 32
            k, v = c.randn(tokens, heads, dim, dtype=dtype), c.randn(tokens, heads, dim, dtype=dtype)
            slots = torch.randperm(blocks * block, generator=c.gen)[:tokens]
            slots[3] = -1  # padding token: skipped
            k_cache = torch.zeros(blocks, block, heads, dim, dtype=dtype, device=c.device)
            v_cache = torch.zeros_like(k_cache)
            store_kv_cache(k, v, k_cache, v_cache, slots.to(c.device))
            keep = slots >= 0
            for name, src, cache in (("k", k, k_cache), ("v", v, v_cache)):
                want = torch.zeros(blocks * block, heads, dim, dtype=dtype)
                want[slots[keep]] = src.cpu()[keep]
                c.equal(f"store_kv_cache {name} {n}", cache.view(-1, heads, dim), want)
        c.run(f"store_kv_cache {n}", kv)

        def emb():
            table = c.randn(300, 96, dtype=dtype)
            for ids_dtype in (torch.int64, torch.int32):
                ids = torch.randint(0, 300, (3, 5), generator=c.gen, dtype=ids_dtype).to(c.device)
                c.equal(f"embedding[{_name(ids_dtype)} ids] {n}", embedding(ids, table), table.cpu()[ids.cpu().long()])
        c.run(f"embedding {n}", emb)


# ----------------------------------------------------------------------------- main


def header_lines() -> list[str]:
    wanted = ("CPU", "torch", "torch CUDA build", "GPUs")
    rows = [(k, v) for k, v in env_info.collect() if k in wanted or k.startswith("GPU ")]
    return env_info.format_rows(rows).splitlines()


def load_bench_ops():
    """benchmarks/bench_ops.py from this checkout (or, under `bazel run`, the workspace)."""
    candidates = [REPO / "benchmarks" / "bench_ops.py"]
    if os.environ.get("BUILD_WORKSPACE_DIRECTORY"):
        candidates.append(Path(os.environ["BUILD_WORKSPACE_DIRECTORY"]) / "benchmarks" / "bench_ops.py")
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("bench_ops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="mllm-kernel main-job report")
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available, else cpu")
    p.add_argument("--no-bench", action="store_true", help="checks only")
    args = p.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")

    print("\n".join(header_lines()))
    print(f"device: {device}\n")
    t0 = time.time()
    checks = Checks(device)
    check_all(checks)
    width = max(len(label) for label, _, _ in checks.results)
    for label, ok, detail in checks.results:
        print(f"{'PASS' if ok else 'FAIL'}  {label:<{width}}  {detail}")
    failed = sum(not ok for _, ok, _ in checks.results)
    print(f"\n{len(checks.results) - failed}/{len(checks.results)} checks passed ({time.time() - t0:.0f}s)\n")

    if not args.no_bench:
        bench = load_bench_ops()
        if bench is None:
            print("benchmark: benchmarks/bench_ops.py not found, skipped")
        else:
            print("quick benchmark (benchmarks/bench_ops.py --quick; the full run is in benchmarks/RESULTS.md):",
                  flush=True)
            # The table goes to stdout inside run(); its own exit code does not gate the report:
            # its ours-vs-eager agreement column is informational, the float64 checks above are the gate.
            bench.run(["--quick", "--device", device])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
