"""Sampling and softmax at decode shapes on the GPU: ours against FlashInfer and torch.

    python3 benchmarks/bench_sampling.py [--batches 1,8,64,256] [--vocabs 32000,128256,151936]
                                         [--dtypes float32,bfloat16] [--iters 30] [--json PATH]

From the repository root it measures the checkout's mllm_kernel; copy it (with gpu_timing.py) out
of the checkout to measure an installed wheel. FlashInfer is optional (its column stays empty if
`import flashinfer` fails or a call raises).

Ops (per-row parameters as tensors for ours, as an engine passes them; FlashInfer gets scalars,
which select its fastest path: the radix top-k kernel for top_k_top_p_sampling_from_logits):
- top_k_top_p: k = 50, p = 0.9 from logits. FlashInfer top_k_top_p_sampling_from_logits.
- top_p: p = 0.9 from logits (ours: top_k 0). FlashInfer: softmax + top_p_sampling_from_probs
  (it has no top-p from logits), both timed.
- min_p: min_p = 0.1 from probs. FlashInfer min_p_sampling_from_probs.
- greedy: argmax; the peer is torch.argmax.
- softmax: FlashInfer softmax, torch.softmax (eager) and its torch.compile (inductor) build.
- top_k_mask (k = 50, logits) and top_p_renorm (p = 0.9, probs): FlashInfer top_k_mask_logits and
  top_p_renorm_probs; eager: topk + masked_fill, and sort + cumsum + scatter.
Eager: torch's sort-based sampler (sort, softmax, cumsum, mask, inverse CDF with the same
uniforms), torch.argmax for greedy, torch.softmax for softmax.

Timing: gpu_timing.time_graph (CUDA-graph replays, median), over enough input sets that one
replay reads >= 4x the L2 cache (at most 64 sets). GB/s counts the logits read once (and the
output written, for softmax and the filters); "% copy" is against a large device-to-device copy_ in the
same run. Every implementation's tokens are
checked before timing: greedy must equal torch.argmax, and sampled tokens must be in the kept
set of a float64 reference of the rule (top-k / top-p / min-p); softmax outputs must match
torch.softmax of the float64 logits within the dtype's tolerance; ours for the filters must match
the float64 reference (a peer that differs is still timed, the difference noted in the JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if (REPO / "mllm_kernel").is_dir() and str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the checkout's mllm_kernel (copy the script out to use a wheel)
from mllm_kernel.kernels.softmax import softmax  # noqa: E402
from mllm_kernel.kernels.sampling import (  # noqa: E402
    greedy_sample,
    min_p_sample_from_uniforms,
    top_k_mask_logits,
    top_k_top_p_sample_from_uniforms,
    top_p_renorm_probs,
)
from mllm_kernel.kernels.sampling.cases import eager_top_k_mask, eager_top_p_renorm, ref_filter  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import copy_gbps, time_graph  # noqa: E402

try:
    import flashinfer.sampling as fis
except Exception as error:  # noqa: BLE001 - any import failure: no FlashInfer column
    fis, FLASHINFER_ERROR = None, f"{type(error).__name__}: {error}"

TOP_K, TOP_P, MIN_P = 50, 0.9, 0.1
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}  # rtol of softmax


@torch.compile(dynamic=True)
def inductor_softmax(x):
    return torch.softmax(x, -1)


def eager_sample(logits, u, k: int, p: float):
    """torch's sort-based top-k/top-p sampler, inverse CDF with the uniforms u."""
    vals, idx = logits.float().sort(-1, descending=True)
    if k > 0:
        vals[:, k:] = -math.inf
    probs = vals.softmax(-1)
    cum = probs.cumsum(-1)
    probs = probs.masked_fill(cum - probs > p, 0.0)
    cum = probs.cumsum(-1)
    j = (cum <= u[:, None] * cum[:, -1:]).sum(-1, keepdim=True).clamp_(max=logits.shape[-1] - 1)
    return idx.gather(-1, j).squeeze(-1)


def eager_min_p(probs, u, min_p: float):
    p = probs.float()
    w = p.masked_fill(p < min_p * p.amax(-1, keepdim=True), 0.0)
    cum = w.cumsum(-1)
    return (cum <= u[:, None] * cum[:, -1:]).sum(-1).clamp_(max=probs.shape[-1] - 1)


def kept_sets(logits, k: int, p: float):
    """float64 reference of the kept set per row (ties kept), as a boolean [batch, vocab]."""
    x = logits.double()
    thr = torch.full((x.shape[0], 1), -math.inf, dtype=torch.float64, device=x.device)
    if 0 < k < x.shape[1]:
        thr = x.topk(k, -1).values[:, -1:]
    if p < 1.0:
        vals = x.sort(-1, descending=True).values
        w = torch.exp(vals - vals[:, :1]).masked_fill(vals < thr, 0.0)
        cum = w.cumsum(-1)
        j = (cum < p * cum[:, -1:]).sum(-1, keepdim=True)
        thr = torch.maximum(thr, vals.gather(-1, j))
    return x >= thr


def check_tokens(name: str, tokens, allowed) -> None:
    tokens = tokens.long()
    ok = allowed.gather(-1, tokens[:, None].clamp(0, allowed.shape[1] - 1)).all() and bool((tokens >= 0).all())
    if not ok:
        raise AssertionError(f"{name}: a sampled token is outside the kept set")


def make_sets(batch: int, vocab: int, dtype, l2_bytes: int):
    row_bytes = batch * vocab * torch.finfo(dtype).bits // 8
    num_sets = max(1, min(64, math.ceil(4 * l2_bytes / row_bytes)))
    g = torch.Generator(device="cuda").manual_seed(batch * vocab)
    sets = []
    for _ in range(num_sets):
        logits = (torch.randn(batch, vocab, device="cuda", generator=g) * 3).to(dtype)
        u = torch.rand(batch, device="cuda", generator=g)
        sets.append((logits, u, torch.softmax(logits.float(), -1).to(dtype)))
    return sets


def bench_op(op: str, batch: int, vocab: int, dtype, sets, args, copy: float) -> dict:
    row = {"op": op, "batch": batch, "vocab": vocab, "dtype": str(dtype).removeprefix("torch.")}
    k = torch.full((batch,), TOP_K if op in ("top_k_top_p", "top_k_mask") else 0, dtype=torch.int64, device="cuda")
    p = torch.full((batch,), TOP_P, dtype=torch.float32, device="cuda")
    mp = torch.full((batch,), MIN_P, dtype=torch.float32, device="cuda")
    kk = TOP_K if op == "top_k_top_p" else 0

    def impls(logits, u, probs):
        if op == "top_k_mask":
            out = {"ours": lambda: top_k_mask_logits(logits, k), "eager": lambda: eager_top_k_mask(logits, TOP_K)}
            if fis is not None:
                out["fi"] = lambda: fis.top_k_mask_logits(logits, TOP_K)
            return out
        if op == "top_p_renorm":
            out = {"ours": lambda: top_p_renorm_probs(probs, p), "eager": lambda: eager_top_p_renorm(probs, TOP_P)}
            if fis is not None:
                out["fi"] = lambda: fis.top_p_renorm_probs(probs, TOP_P)
            return out
        if op == "softmax":
            out = {"ours": lambda: softmax(logits), "eager": lambda: torch.softmax(logits, -1),
                   "inductor": lambda: inductor_softmax(logits)}
            if fis is not None:
                out["fi"] = lambda: fis.softmax(logits)
            return out
        if op == "greedy":
            return {"ours": lambda: greedy_sample(logits), "eager": lambda: torch.argmax(logits, -1)}
        if op == "min_p":
            out = {"ours": lambda: min_p_sample_from_uniforms(probs, u, mp), "eager": lambda: eager_min_p(probs, u, MIN_P)}
            if fis is not None:
                out["fi"] = lambda: fis.min_p_sampling_from_probs(probs, MIN_P)
            return out
        out = {"ours": lambda: top_k_top_p_sample_from_uniforms(logits, u, k, p), "eager": lambda: eager_sample(logits, u, kk, TOP_P)}
        if fis is not None and op == "top_k_top_p":
            out["fi"] = lambda: fis.top_k_top_p_sampling_from_logits(logits, TOP_K, TOP_P)
        elif fis is not None:
            out["fi"] = lambda: fis.top_p_sampling_from_probs(torch.softmax(logits, -1), TOP_P)
        return out

    per_set = [impls(*s) for s in sets]
    if op in args.no_flashinfer_for.split(","):
        for calls in per_set:
            calls.pop("fi", None)
    logits0, _, probs0 = sets[0]
    allowed = (logits0 == logits0.amax(-1, keepdim=True)) if op == "greedy" else (
        (probs0.double() >= MIN_P * probs0.double().amax(-1, keepdim=True)) if op == "min_p" else kept_sets(logits0, kk, TOP_P))
    for name in per_set[0]:
        try:
            tokens = per_set[0][name]()
            torch.cuda.synchronize()
            if op in ("top_k_mask", "top_p_renorm"):
                name_ = "top_k_mask_logits" if op == "top_k_mask" else "top_p_renorm_probs"
                x0 = logits0 if op == "top_k_mask" else probs0
                want = ref_filter(name_, x0[:4], [TOP_K if op == "top_k_mask" else TOP_P] * min(4, batch))
                try:
                    torch.testing.assert_close(tokens[:4].double().cpu(), want, rtol=TOLERANCES[dtype], atol=1e-6)
                except AssertionError as error:  # a peer's own rule (e.g. ties, rounding): timed, noted
                    if name == "ours":
                        raise
                    row[f"{name}_differs"] = str(error)[:160]
            elif op == "softmax":
                want = torch.softmax(logits0.double(), -1)
                torch.testing.assert_close(tokens.double(), want, rtol=TOLERANCES[dtype], atol=1e-6)
            elif op == "greedy":
                if not torch.equal(tokens.long(), torch.argmax(logits0, -1)):
                    raise AssertionError(f"{name}: greedy differs from torch.argmax")
            else:
                check_tokens(name, tokens, allowed)
            row[f"{name}_us"], row[f"{name}_how"] = time_graph([s[name] for s in per_set], args.iters)
        except Exception as error:  # noqa: BLE001 - a peer that cannot run this case: empty column
            if name == "ours":
                raise
            row[f"{name}_error"] = f"{type(error).__name__}: {str(error)[:120]}"
    writes = op in ("softmax", "top_k_mask", "top_p_renorm")
    nbytes = batch * vocab * torch.finfo(dtype).bits // 8 * (2 if writes else 1)
    row["ours_gbps"] = nbytes / (row["ours_us"] * 1e-6) / 1e9
    row["pct_copy"] = 100 * row["ours_gbps"] / copy
    return row


def fmt(row: dict, key: str, spec: str, suffix: str = "") -> str:
    return format(row[key], spec) + suffix if row.get(key) is not None else "-"


def markdown(rows: list[dict]) -> str:
    lines = ["| op | batch x vocab | dtype | ours µs | FlashInfer µs | eager µs | inductor µs | vs FlashInfer | vs eager "
             "| vs inductor | ours GB/s | % copy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        vs_fi = f"{r['fi_us'] / r['ours_us']:.2f}x" if r.get("fi_us") else "-"
        vs_eager = f"{r['eager_us'] / r['ours_us']:.2f}x" if r.get("eager_us") else "-"
        vs_ind = f"{r['inductor_us'] / r['ours_us']:.2f}x" if r.get("inductor_us") else "-"
        lines.append(f"| {r['op']} | {r['batch']}x{r['vocab']} | {r['dtype']} | {fmt(r, 'ours_us', '.1f')} | "
                     f"{fmt(r, 'fi_us', '.1f')} | {fmt(r, 'eager_us', '.1f')} | {fmt(r, 'inductor_us', '.1f')} | "
                     f"{vs_fi} | {vs_eager} | {vs_ind} | "
                     f"{fmt(r, 'ours_gbps', '.0f')} | {fmt(r, 'pct_copy', '.0f', '%')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--vocabs", default="32000,128256,151936")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--ops", default="top_k_top_p,top_p,min_p,greedy,softmax,top_k_mask,top_p_renorm")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--no-flashinfer-for", default="",
                    help="ops whose FlashInfer column stays empty (e.g. top_k_top_p: its top-k module takes ~15 min to JIT-build)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    props = torch.cuda.get_device_properties(0)
    copy = copy_gbps(20)
    header = {"gpu": props.name, "torch": torch.__version__, "copy_gbps": copy,
              "flashinfer": getattr(sys.modules.get("flashinfer"), "__version__", None) if fis else FLASHINFER_ERROR}
    print(json.dumps(header), flush=True)
    rows = []
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for vocab in map(int, args.vocabs.split(",")):
            for batch in map(int, args.batches.split(",")):
                sets = make_sets(batch, vocab, dtype, props.L2_cache_size)
                for op in args.ops.split(","):
                    rows.append(bench_op(op, batch, vocab, dtype, sets, args, copy))
                    print(json.dumps(rows[-1]), flush=True)
                del sets
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
