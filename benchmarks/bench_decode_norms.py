"""rms_norm, fused_add_rms_norm and apply_rope at decode shapes against FlashInfer, Liger, inductor
and torch eager, on one CUDA GPU.

    python3 benchmarks/bench_decode_norms.py [--rows 1,8,32,128,512] [--hidden 4096,8192]
                                             [--ops rms_norm,fused_add_rms_norm,apply_rope]
                                             [--peers flashinfer,liger,inductor,eager] [--json PATH]
                                             [--dtypes bfloat16,float32]

Times are the median µs per call over CUDA-graph replays (benchmarks/gpu_timing.py), on 8 input sets
per row (decode-step inputs are small and sit in L2, as they do in an engine). Every
implementation is first checked against a float64 reference written here. Peers that are not
installed, or fail, leave their column empty with the reason in the JSON. bfloat16 unless --dtypes
says otherwise; RoPE is NeoX style over 32 query and 8 KV heads of head_dim 128 (Llama-3 8B),
positions below 4096 of an 8192-row float32 cos/sin cache. Inductor compiles each shape
statically (dynamic=False). Liger has no decode-layout RoPE (its kernel takes [batch, heads, seq,
dim] with cos/sin per token), so its RoPE column stays empty.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if (REPO / "mllm_kernel").is_dir() and str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the checkout's mllm_kernel (copy the script out to use a wheel)
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("FLASHINFER_USE_CUDA_NORM", "1")  # its CUDA norm kernels, not the CuTe DSL ones

import torch  # noqa: E402

import mllm_kernel as mk  # noqa: E402
from gpu_timing import time_graph  # noqa: E402

EPS = 1e-6
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SETS = 8
HEADS, KV_HEADS, HEAD_DIM, MAX_POS = 32, 8, 128, 8192


def load_peers(names: list[str]) -> tuple[dict, dict]:
    mods, errors = {}, {}
    if "flashinfer" in names:
        try:
            import flashinfer.norm
            import flashinfer.rope

            mods["flashinfer"] = flashinfer
        except Exception as error:  # noqa: BLE001 - reported, the column stays empty
            errors["flashinfer"] = f"{type(error).__name__}: {error}"
    if "liger" in names:
        try:
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            mods["liger"] = (LigerRMSNormFunction, LigerFusedAddRMSNormFunction)
        except Exception as error:  # noqa: BLE001
            errors["liger"] = f"{type(error).__name__}: {error}"
    return mods, errors


# ----------------------------------------------------------------------------- references (float64)


def ref_rms_norm(x, w):
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * w.double()


def ref_rope(x, positions, cache):
    half = cache.shape[1] // 2
    cos, sin = cache[positions, :half].double()[:, None, :], cache[positions, half:].double()[:, None, :]
    x1, x2 = x[..., :half].double(), x[..., half:].double()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


# ----------------------------------------------------------------------------- eager forms (also compiled)


def eager_rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def eager_fused_add_rms_norm(x, r, w):
    r.add_(x)
    x.copy_(eager_rms_norm(r, w))


def eager_rope(q, k, positions, cache):
    half = cache.shape[1] // 2
    cos, sin = cache[positions, :half][:, None, :], cache[positions, half:][:, None, :]
    for t in (q, k):
        x1, x2 = t[..., :half].float(), t[..., half:].float()
        t.copy_(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(t.dtype))


# ----------------------------------------------------------------------------- cases


def check(name: str, got, want, errors: dict) -> bool:
    err = (got.double() - want).abs().max().item()
    tol = 2e-2 * max(1.0, want.abs().max().item())
    if not err <= tol:
        errors[name] = f"max error {err:.3g} > {tol:.3g}"
        return False
    return True


def keep_correct(impls: dict, errors: dict, verify) -> None:
    """Drops the implementations whose verify(name, f) is False or raises (reason in errors)."""
    for name, f in list(impls.items()):
        try:
            ok = verify(name, f)
        except Exception as error:  # noqa: BLE001 - reported, the column stays empty
            errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
            ok = False
        if not ok:
            del impls[name]


def bench_case(op: str, rows: int, hidden: int, dtype: torch.dtype, peers: list[str], mods: dict,
               iters: int, reuse_outputs: bool = False) -> dict:
    g = torch.Generator(device="cuda").manual_seed(rows * 7919 + hidden)
    row = {"op": op, "rows": rows, "hidden": hidden if op != "apply_rope" else None, "dtype": str(dtype)[6:]}
    size = dtype.itemsize
    errors: dict = {}
    impls: dict = {}
    if op == "rms_norm":
        sets = [(torch.randn(rows, hidden, device="cuda", generator=g).to(dtype),
                 (1 + 0.1 * torch.randn(hidden, device="cuda", generator=g)).to(dtype)) for _ in range(SETS)]
        impls["ours"] = lambda x, w: mk.rms_norm(x, w, EPS)
        if "flashinfer" in mods:
            impls["flashinfer"] = lambda x, w: mods["flashinfer"].norm.rmsnorm(x, w, EPS)
        if "liger" in mods:
            impls["liger"] = lambda x, w: mods["liger"][0].apply(x, w, EPS, 0.0, "llama", False)
        if "inductor" in peers:
            impls["inductor"] = torch.compile(eager_rms_norm, dynamic=False)
        if "eager" in peers:
            impls["eager"] = eager_rms_norm
        x0, w0 = sets[0]
        want = ref_rms_norm(x0, w0)
        keep_correct(impls, errors, lambda name, f: check(name, f(x0, w0), want, errors))
        row["bytes"] = (2 * rows * hidden + hidden) * size
    elif op == "fused_add_rms_norm":
        sets = [(torch.randn(rows, hidden, device="cuda", generator=g).to(dtype),
                 torch.randn(rows, hidden, device="cuda", generator=g).to(dtype),
                 (1 + 0.1 * torch.randn(hidden, device="cuda", generator=g)).to(dtype)) for _ in range(SETS)]
        impls["ours"] = lambda x, r, w: mk.fused_add_rms_norm(x, r, w, EPS)  # in place, as FlashInfer
        if "flashinfer" in mods:
            impls["flashinfer"] = lambda x, r, w: mods["flashinfer"].norm.fused_add_rmsnorm(x, r, w, EPS)
        if "liger" in mods:
            impls["liger"] = lambda x, r, w: mods["liger"][1].apply(x, r, w, EPS, 0.0, "llama", True)
        if "inductor" in peers:
            impls["inductor"] = torch.compile(eager_fused_add_rms_norm, dynamic=False)
        if "eager" in peers:
            impls["eager"] = eager_fused_add_rms_norm
        x0, r0, w0 = sets[0]
        summed = (x0 + r0)  # rounded to bfloat16, as every implementation stores the residual
        want = ref_rms_norm(summed, w0)
        def verify(name, f):
            x, r = x0.clone(), r0.clone()
            out = f(x, r, w0)
            if name == "liger":  # out of place: returns (y, x + residual)
                x, r = out
            return check(name, x, want, errors) and check(name + " residual", r, summed.double(), errors)

        keep_correct(impls, errors, verify)
        row["bytes"] = (4 * rows * hidden + hidden) * size
    else:  # apply_rope: rows = tokens
        cache_pos = torch.arange(MAX_POS, device="cuda", dtype=torch.float32)[:, None]
        inv_freq = 500000.0 ** (-torch.arange(0, HEAD_DIM, 2, device="cuda", dtype=torch.float32) / HEAD_DIM)
        angles = cache_pos * inv_freq
        cache = torch.cat([angles.cos(), angles.sin()], -1).contiguous()
        sets = [(torch.randn(rows, HEADS, HEAD_DIM, device="cuda", generator=g).to(dtype),
                 torch.randn(rows, KV_HEADS, HEAD_DIM, device="cuda", generator=g).to(dtype),
                 torch.randint(0, 4096, (rows,), device="cuda", generator=g)) for _ in range(SETS)]
        impls["ours"] = lambda q, k, p: mk.apply_rope(q, k, p, cache, True)
        if "flashinfer" in mods:
            impls["flashinfer"] = lambda q, k, p: mods["flashinfer"].rope.apply_rope_with_cos_sin_cache_inplace(
                p, q.view(q.shape[0], -1), k.view(k.shape[0], -1), HEAD_DIM, cache, True)
        if "inductor" in peers:
            compiled = torch.compile(eager_rope, dynamic=False)
            impls["inductor"] = lambda q, k, p: compiled(q, k, p, cache)
        if "eager" in peers:
            impls["eager"] = lambda q, k, p: eager_rope(q, k, p, cache)
        q0, k0, p0 = sets[0]
        want_q, want_k = ref_rope(q0, p0, cache), ref_rope(k0, p0, cache)
        def verify(name, f):
            q, k = q0.clone(), k0.clone()
            f(q, k, p0)
            return check(name, q, want_q, errors) and check(name + " k", k, want_k, errors)

        keep_correct(impls, errors, verify)
        row["bytes"] = 2 * rows * (HEADS + KV_HEADS) * HEAD_DIM * size + rows * (8 + HEAD_DIM * 4)
    for name, f in impls.items():
        # Each input set keeps its call's outputs until its next call, so an out-of-place op
        # (Liger's fused_add_rms_norm, every rms_norm) writes a buffer per set, as an in-place op
        # does. Dropped at once (--reuse-outputs), every call would write the same buffer, which
        # stays in L2 across calls.
        kept = [None] * len(sets)

        def call(f=f, a=None, i=0):
            out = f(*a)
            if not reuse_outputs:
                kept[i] = out

        row[f"{name}_us"], how = time_graph([lambda a=a, i=i: call(a=a, i=i) for i, a in enumerate(sets)], iters)
        if how != "graph":
            row[f"{name}_how"] = how
    if errors:
        row["errors"] = errors
    best = [row[f"{p}_us"] for p in ("flashinfer", "liger", "inductor", "eager") if f"{p}_us" in row]
    if best and "ours_us" in row:
        row["best_peer_us"] = min(best)
        row["vs_best_peer"] = min(best) / row["ours_us"]
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| op | dtype | rows x hidden | ours µs | FlashInfer µs | Liger µs | inductor µs | eager µs | best peer / ours |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        shape = f"{r['rows']}x{r['hidden']}" if r["hidden"] else f"{r['rows']} tokens"
        cells = [f"{r[k]:.2f}" if k in r else "-" for k in ("ours_us", "flashinfer_us", "liger_us", "inductor_us", "eager_us")]
        vs = f"{r['vs_best_peer']:.2f}x" if "vs_best_peer" in r else "-"
        lines.append(f"| {r['op']} | {r['dtype']} | {shape} | " + " | ".join(cells) + f" | {vs} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,8,32,128,512")
    ap.add_argument("--hidden", default="4096,8192")
    ap.add_argument("--ops", default="rms_norm,fused_add_rms_norm,apply_rope")
    ap.add_argument("--dtypes", default="bfloat16", help=f"comma-separated, of {','.join(DTYPES)}")
    ap.add_argument("--peers", default="flashinfer,liger,inductor,eager", help="comma-separated; '' for ours alone")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--reuse-outputs", action="store_true",
                    help="drop each call's outputs at once (out-of-place ops then write one buffer)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    peers = [p for p in args.peers.split(",") if p]
    mods, peer_errors = load_peers(peers)
    torch._dynamo.config.cache_size_limit = 256  # one static compile per shape
    header = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "peers": peers,
              "reuse_outputs": args.reuse_outputs,
              "peer_errors": peer_errors,
              "flashinfer": getattr(mods.get("flashinfer"), "__version__", None)}
    print(json.dumps(header), flush=True)
    results = []
    for dtype in (DTYPES[d] for d in args.dtypes.split(",")):
        for op in args.ops.split(","):
            for hidden in ([int(h) for h in args.hidden.split(",")] if op != "apply_rope" else [0]):
                for rows in (int(r) for r in args.rows.split(",")):
                    row = bench_case(op, rows, hidden, dtype, peers, mods, args.iters, args.reuse_outputs)
                    print(json.dumps(row), flush=True)
                    results.append(row)
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps({"header": header, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
