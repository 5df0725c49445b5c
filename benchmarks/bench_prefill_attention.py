"""prefill_attention on the GPU against FlashInfer's ragged prefill (fa2, fa3) and torch SDPA, in TFLOP/s.

    python3 benchmarks/bench_prefill_attention.py [--head-dims 64,128,256] [--shapes 16x1024,8x4096,2x16384,1x65536]
                                                  [--causal both|yes|no] [--fi-head-dims 128] [--no-sdpa] [--no-mma]
                                                  [--page-size N] [--json PATH]

From the repository root it measures the checkout's mllm_kernel (copy it out of the checkout to
measure an installed wheel). FlashInfer is optional (device_carry/flashinfer/install.sh on the GPU
machine); its modules JIT-build on first use (fa3 ~85 s each), so --fi-head-dims limits them.

Shapes: bf16, 32 query / 8 KV heads, `batch` requests of `seq` tokens each (q and k lengths equal),
ragged layout [tokens, heads, head_dim]. FLOPs = 4 * seq^2 * head_dim * heads per request (QK^T
and PV), half of that when causal. Timing: CUDA events around `iters` back-to-back calls after a
warm-up call, median of 5 such groups; `iters` is picked so that a group takes about 50 ms.
"% matmul": against a bf16 8192^3 torch.matmul timed the same way in the same run. SDPA:
--page-size N: the same K/V in a paged cache [pages, N, kv_heads, head_dim] whose pages are
shuffled (every request's block table a random order of pages), ours through
paged_prefill_attention and FlashInfer through its paged prefill wrapper (no SDPA column).
F.scaled_dot_product_attention on [batch, heads, seq, head_dim] views with the flash backend
(K/V repeated to all query heads in advance if the backend refuses GQA). Every implementation is
checked first against ours (max |diff|) and ours against a float64 reference on a slice of the
first request's queries.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if (REPO / "mllm_kernel").is_dir() and str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from mllm_kernel.kernels.prefill_attention import paged_prefill_attention, prefill_attention  # noqa: E402
from mllm_kernel.kernels.prefill_attention.cases import allowed_keys, ref_attention  # noqa: E402

try:
    import flashinfer
    from flashinfer.prefill import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
except Exception as error:  # noqa: BLE001 - any import failure: no FlashInfer column
    flashinfer, FLASHINFER_ERROR = None, f"{type(error).__name__}: {error}"

H, KH, DTYPE = 32, 8, torch.bfloat16
REF_QUERIES = 64  # queries of the first request checked against float64


def time_calls(call, target_ms: float = 50.0, groups: int = 5) -> float:
    """Median ms per call."""
    call()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    call()
    b.record()
    b.synchronize()
    iters = max(1, min(200, int(target_ms / max(a.elapsed_time(b), 1e-3))))
    samples = []
    for _ in range(groups):
        a.record()
        for _ in range(iters):
            call()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) / iters)
    return statistics.median(samples)


def matmul_tflops() -> float:
    x = torch.randn(8192, 8192, dtype=DTYPE, device="cuda")
    y = torch.randn(8192, 8192, dtype=DTYPE, device="cuda")
    ms = time_calls(lambda: torch.matmul(x, y))
    return 2 * 8192**3 / ms / 1e9


def make_inputs(batch: int, seq: int, head_dim: int):
    """q, k, v (ragged, bf16, H / KH heads) and cu_seqlens of `batch` requests of `seq` tokens each."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    tokens = batch * seq
    q = torch.randn(tokens, H, head_dim, dtype=DTYPE, device="cuda", generator=gen)
    k = torch.randn(tokens, KH, head_dim, dtype=DTYPE, device="cuda", generator=gen)
    v = torch.randn(tokens, KH, head_dim, dtype=DTYPE, device="cuda", generator=gen)
    cu = torch.arange(0, tokens + 1, seq, dtype=torch.int32, device="cuda")
    return q, k, v, cu


def paged_cache(k, v, batch: int, seq: int, page: int):
    """k and v ([batch * seq, KH, head_dim]) in shuffled pages of `page` tokens, and the block table."""
    per = -(-seq // page)
    order = torch.randperm(batch * per, generator=torch.Generator().manual_seed(1))
    table = order.view(batch, per).to(device=k.device, dtype=torch.int32)
    tok = torch.arange(seq, device=k.device)
    pages = table[:, tok // page].flatten().long()  # [batch * seq]: each token's page
    rows = (tok % page).repeat(batch)
    caches = []
    for x in (k, v):
        cache = torch.zeros(batch * per, page, KH, x.shape[-1], dtype=x.dtype, device=x.device)
        cache[pages, rows] = x
        caches.append(cache)
    return caches[0], caches[1], table


def bench_row(batch, seq, head_dim, causal, args) -> dict:
    q, k, v, cu = make_inputs(batch, seq, head_dim)
    flops = 4 * batch * seq * seq * head_dim * H / (2 if causal else 1)
    row = {"batch": batch, "seq": seq, "head_dim": head_dim, "causal": causal}
    out = torch.empty_like(q)
    page = args.page_size
    if page:
        row["page_size"] = page
        k_cache, v_cache, table = paged_cache(k, v, batch, seq, page)
        seq_lens = torch.full((batch,), seq, dtype=torch.int32, device="cuda")

        def ours():
            paged_prefill_attention(q, k_cache, v_cache, table, cu, seq_lens, causal=causal, out=out)
    else:

        def ours():
            prefill_attention(q, k, v, cu, cu, causal=causal, out=out)

    ours()
    # float64 reference on the last REF_QUERIES queries of the first request (all its keys).
    n = min(REF_QUERIES, seq)
    keep = allowed_keys(seq, seq, causal)[seq - n:]
    want, _ = ref_attention(q[seq - n:seq], k[:seq], v[:seq], keep, head_dim ** -0.5)
    row["err_ours"] = (out[seq - n:seq].double().cpu() - want).abs().max().item()
    row["ours_ms"] = time_calls(ours)
    row["ours_tflops"] = flops / row["ours_ms"] / 1e9
    row["pct_matmul"] = 100 * row["ours_tflops"] / args.matmul
    # Ours again through the mma.sync kernel alone (on a Hopper GPU the automatic choice is the
    # wgmma kernel): what the Hopper path adds.
    chosen = os.environ.get("MLLM_KERNEL_PREFILL_BACKEND")
    os.environ["MLLM_KERNEL_PREFILL_BACKEND"] = "fa2"
    try:
        if not args.no_mma:
            row["ours_mma_ms"] = time_calls(ours)
    finally:  # the caller's choice back, if it made one
        if chosen is None:
            del os.environ["MLLM_KERNEL_PREFILL_BACKEND"]
        else:
            os.environ["MLLM_KERNEL_PREFILL_BACKEND"] = chosen

    if flashinfer is not None and head_dim in args.fi_head_dims:
        for backend in args.fi_backends:
            try:
                workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
                t0 = time.perf_counter()
                if page:
                    wrapper = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
                    per = table.shape[1]
                    indptr = torch.arange(0, (batch + 1) * per, per, dtype=torch.int32, device="cuda")
                    last = torch.full((batch,), seq - (per - 1) * page, dtype=torch.int32, device="cuda")
                    wrapper.plan(cu, indptr, table.flatten(), last, H, KH, head_dim, page, causal=causal,
                                 q_data_type=DTYPE)
                else:
                    wrapper = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=backend)
                    wrapper.plan(cu, cu, H, KH, head_dim, causal=causal, q_data_type=DTYPE)
                row[f"fi_{backend}_plan_us"] = (time.perf_counter() - t0) * 1e6
                fi_out = torch.empty_like(q)
                if page:
                    fi = lambda w=wrapper, o=fi_out: w.run(q, (k_cache, v_cache), out=o)  # noqa: E731
                else:
                    fi = lambda w=wrapper, o=fi_out: w.run(q, k, v, out=o)  # noqa: E731
                fi()
                row[f"fi_{backend}_diff"] = (fi_out - out).abs().max().item()
                row[f"fi_{backend}_ms"] = time_calls(fi)
                row[f"vs_fi_{backend}"] = row[f"fi_{backend}_ms"] / row["ours_ms"]
                del wrapper, workspace, fi_out
            except Exception as error:  # noqa: BLE001 - report and go on
                row[f"fi_{backend}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    if not args.no_sdpa and not page:
        q4, k4, v4 = (x.view(batch, seq, -1, head_dim).transpose(1, 2) for x in (q, k, v))
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa(kk, vv, gqa):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q4, kk, vv, is_causal=causal, enable_gqa=gqa)

        try:
            try:
                got = sdpa(k4, v4, True)
                call = lambda: sdpa(k4, v4, True)  # noqa: E731
            except RuntimeError:
                k_all, v_all = (x.repeat_interleave(H // KH, dim=1) for x in (k4, v4))
                got = sdpa(k_all, v_all, False)
                call = lambda: sdpa(k_all, v_all, False)  # noqa: E731
                row["sdpa_repeated_kv"] = True
            row["sdpa_diff"] = (got.transpose(1, 2).reshape(tokens, H, head_dim) - out).abs().max().item()
            row["sdpa_ms"] = time_calls(call)
            row["vs_sdpa"] = row["sdpa_ms"] / row["ours_ms"]
        except Exception as error:  # noqa: BLE001
            row["sdpa_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    for key in [k_ for k_ in row if k_.endswith("_ms") and k_ != "ours_ms"]:
        row[key.replace("_ms", "_tflops")] = flops / row[key] / 1e9
    del q, k, v, out
    torch.cuda.empty_cache()
    return row


def fmt(row: dict, key: str, spec: str, suffix: str = "") -> str:
    value = row.get(key)
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown(rows: list[dict]) -> str:
    lines = ["| head_dim | mask | batch x seq | ours ms | TFLOP/s | % matmul | ours mma.sync TFLOP/s "
             "| FI fa2 TFLOP/s | FI fa3 TFLOP/s | fa2 / ours | fa3 / ours | SDPA TFLOP/s | SDPA / ours | err ours |",
             "|" + " ---: |" * 14]
    for r in rows:
        lines.append(
            f"| {r['head_dim']} | {'causal' if r['causal'] else 'full'} | {r['batch']} x {r['seq']} "
            f"| {fmt(r, 'ours_ms', '.3f')} | {fmt(r, 'ours_tflops', '.0f')} | {fmt(r, 'pct_matmul', '.0f', '%')} "
            f"| {fmt(r, 'ours_mma_tflops', '.0f')} | {fmt(r, 'fi_fa2_tflops', '.0f')} | {fmt(r, 'fi_fa3_tflops', '.0f')} | {fmt(r, 'vs_fi_fa2', '.2f', 'x')} "
            f"| {fmt(r, 'vs_fi_fa3', '.2f', 'x')} | {fmt(r, 'sdpa_tflops', '.0f')} | {fmt(r, 'vs_sdpa', '.2f', 'x')} "
            f"| {fmt(r, 'err_ours', '.1e')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head-dims", default="64,128,256")
    p.add_argument("--shapes", default="16x1024,8x4096,2x16384,1x65536")
    p.add_argument("--causal", default="both", choices=("both", "yes", "no"))
    p.add_argument("--fi-head-dims", default="128", help="head dims to run FlashInfer at (its JIT builds are slow)")
    p.add_argument("--fi-backends", default="fa2,fa3", help="FlashInfer backends to run (each JIT-builds its own modules)")
    p.add_argument("--no-sdpa", action="store_true")
    p.add_argument("--no-mma", action="store_true", help="skip the mma.sync kernel's column")
    p.add_argument("--page-size", type=int, default=0, help="paged caches of this block size (0: ragged)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    args.fi_head_dims = [int(x) for x in args.fi_head_dims.split(",") if x]
    args.fi_backends = [x for x in args.fi_backends.split(",") if x]
    props = torch.cuda.get_device_properties(0)
    args.matmul = matmul_tflops()
    header = [f"GPU: {props.name}; torch {torch.__version__}",
              f"FlashInfer: {flashinfer.__version__ if flashinfer else 'not available (' + FLASHINFER_ERROR + ')'}",
              f"bf16 matmul 8192^3: {args.matmul:.0f} TFLOP/s",
              f"bf16, {H} q / {KH} kv heads, " +
              (f"paged (block size {args.page_size}, shuffled pages)" if args.page_size else "ragged layout") +
              "; median of 5 groups of back-to-back calls"]
    print("\n".join(header), file=sys.stderr)
    causals = {"both": (True, False), "yes": (True,), "no": (False,)}[args.causal]
    rows = []
    with torch.inference_mode():
        for head_dim in map(int, args.head_dims.split(",")):
            for causal in causals:
                for shape in args.shapes.split(","):
                    batch, seq = map(int, shape.split("x"))
                    rows.append(bench_row(batch, seq, head_dim, causal, args))
                    r = rows[-1]
                    print(f"D={head_dim} {'causal' if causal else 'full'} {batch}x{seq}: ours {fmt(r, 'ours_tflops', '.0f')} "
                          f"(mma.sync {fmt(r, 'ours_mma_tflops', '.0f')}) "
                          f"TFLOP/s, fa2 {fmt(r, 'fi_fa2_tflops', '.0f')} fa3 {fmt(r, 'fi_fa3_tflops', '.0f')} "
                          f"SDPA {fmt(r, 'sdpa_tflops', '.0f')} {r.get('fi_fa3_error', '')} {r.get('sdpa_error', '')}",
                          file=sys.stderr, flush=True)
    print("\n".join(f"- {line}" for line in header) + "\n\n" + markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({"header": header, "matmul_tflops": args.matmul, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
