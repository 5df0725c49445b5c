"""decode_attention on the GPU against FlashInfer's paged decode and torch SDPA, per KV byte.

    python3 benchmarks/bench_decode_attention.py [--batches 1,8,64,256] [--contexts 512,4096,32768,131072]
                                                 [--iters 50] [--json PATH] [--no-flashinfer] [--no-sdpa] [--fp8]

From the repository root it measures the checkout's mllm_kernel (as bench_ops.py does); copy it out
of the checkout to measure an installed wheel. FlashInfer is optional (its columns stay empty if
`import flashinfer` fails; device_carry/flashinfer/install.sh installs a slim copy on the GPU machine).

Shapes: bf16, head_dim 128, 32 query / 8 KV heads, block (page) size 16, every request of a row
`context` tokens long, block ids shuffled over the cache. Rows whose KV exceeds --max-kv-gb are
skipped; batch 64 x 2048 is added to compare with batch 1 x 131072 (the same KV bytes).

Timing: CUDA events around replays of a CUDA graph that calls the op once per input set, median
of --iters replays after >= 50 ms of warm-up replays (the GPU's clock drops while the host
prepares a row). Small rows rotate several input sets (disjoint blocks of one
cache, own q and block table each) so that one replay reads >= 4x the L2 cache. GB/s = K + V bytes
of the attended keys / time; "% copy" against a device-to-device `copy_` of a large tensor in the
same run (bytes = read + write, launched eagerly, median). FlashInfer: BatchDecodeWithPagedKVCache
Wrapper (NHD layout = our [num_blocks, block_size, kv_heads, head_dim]; one wrapper per input set,
plan() once per set, its host time reported separately, run() timed). SDPA:
F.scaled_dot_product_attention(enable_gqa=True) on K/V gathered in advance (only the call is timed;
skipped where the gathered copy does not fit). --fp8: the caches are float8_e4m3fn (the bf16 values
converted; k_scale 0.5, v_scale 0.25), FlashInfer gets the same caches and scales, GB/s counts the
fp8 bytes, SDPA runs on the dequantized bf16 K/V. Every implementation is checked before timing: max
|err| against a float64 reference on the first requests, and max |diff| against ours on all.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if (REPO / "mllm_kernel").is_dir() and str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the checkout's mllm_kernel, as bench_ops.py (copy the script out to use a wheel)
from mllm_kernel.kernels.decode_attention import decode_attention  # noqa: E402
from mllm_kernel.kernels.decode_attention.cases import ref_decode_attention  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import copy_gbps, time_graph  # noqa: E402

try:
    import flashinfer
    from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper
except Exception as error:  # noqa: BLE001 - any import failure: no FlashInfer column
    flashinfer, FLASHINFER_ERROR = None, f"{type(error).__name__}: {error}"

H, KH, D, BS, DTYPE = 32, 8, 128, 16, torch.bfloat16
REF_ROWS = 4  # requests checked against the float64 reference


FP8, K_SCALE, V_SCALE = torch.float8_e4m3fn, 0.5, 0.25


def make_sets(batch: int, context: int, l2_bytes: int, fp8: bool = False):
    """A shared cache and the input sets (q, block_table, seq_lens) that rotate over it."""
    pages = -(-context // BS)
    set_bytes = 2 * batch * context * KH * D * (1 if fp8 else DTYPE.itemsize)
    num_sets = max(1, min(128, math.ceil(4 * l2_bytes / set_bytes)))
    gen = torch.Generator(device="cuda").manual_seed(0)
    num_blocks = num_sets * batch * pages
    k_cache = torch.randn(num_blocks, BS, KH, D, device="cuda", dtype=DTYPE, generator=gen)
    v_cache = torch.randn(num_blocks, BS, KH, D, device="cuda", dtype=DTYPE, generator=gen)
    if fp8:
        k_cache, v_cache = k_cache.to(FP8), v_cache.to(FP8)
    ids = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32).view(num_sets, batch, pages)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    sets = [(torch.randn(batch, H, D, device="cuda", dtype=DTYPE, generator=gen), ids[i].contiguous(), lens)
            for i in range(num_sets)]
    return k_cache, v_cache, sets, set_bytes


def flashinfer_runs(k_cache, v_cache, sets, context, args):
    """One planned wrapper per set; returns (run callables, outs, median plan µs, backend)."""
    pages = -(-context // BS)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")  # shared: runs are sequential
    calls, outs, plan_us, backend = [], [], [], None
    for q, table, lens in sets:
        batch = q.shape[0]
        wrapper = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=args.fi_tensor_cores,
                                                     backend=args.fi_backend)
        indptr = torch.arange(0, (batch + 1) * pages, pages, dtype=torch.int32, device="cuda")
        indices = table.reshape(-1)
        last = (lens - (pages - 1) * BS).to(torch.int32)
        t0 = time.perf_counter()
        wrapper.plan(indptr, indices, last, H, KH, D, BS, pos_encoding_mode="NONE", q_data_type=DTYPE,
                     kv_data_type=k_cache.dtype)
        plan_us.append((time.perf_counter() - t0) * 1e6)
        backend = getattr(wrapper, "resolved_backend", None) or getattr(wrapper, "_backend", None)
        out = torch.empty_like(q)
        outs.append(out)
        scales = dict(k_scale=K_SCALE, v_scale=V_SCALE) if k_cache.dtype == FP8 else {}
        calls.append(lambda w=wrapper, q=q, out=out, s=scales: w.run(q, (k_cache, v_cache), out=out, **s))
    # The first plan may JIT-load the module: report the median of the rest.
    return calls, outs, statistics.median(plan_us[1:] if len(plan_us) > 1 else plan_us), backend


def gathered(k_cache, v_cache, table, context):
    """K, V [B, KH, context, D] of a block table, contiguous."""
    b, pages = table.shape

    def rows(cache, scale):
        if cache.dtype == FP8:  # gathered as bytes (float8 has few index kernels), then dequantized
            return (cache.view(torch.uint8)[table.long()].view(FP8).to(DTYPE) * scale).view(b, pages * BS, KH, D)
        return cache[table.long()].view(b, pages * BS, KH, D)

    k = rows(k_cache, K_SCALE)[:, :context].transpose(1, 2).contiguous()
    v = rows(v_cache, V_SCALE)[:, :context].transpose(1, 2).contiguous()
    return k, v


def bench_row(batch: int, context: int, args, l2_bytes: int, copy: float) -> dict:
    k_cache, v_cache, sets, set_bytes = make_sets(batch, context, l2_bytes, args.fp8)
    row = {"batch": batch, "context": context, "kv_mb": set_bytes / 1e6, "sets": len(sets)}
    outs = [torch.empty_like(q) for q, _, _ in sets]
    scales = dict(k_scale=K_SCALE, v_scale=V_SCALE) if args.fp8 else {}
    ours = [lambda q=q, t=t, n=n, o=o, kc=k_cache, vc=v_cache: decode_attention(q, kc, vc, t, n, out=o, **scales)
            for (q, t, n), o in zip(sets, outs)]
    q0, t0, n0 = sets[0]
    r = min(batch, REF_ROWS)
    if args.fp8:  # the first requests' blocks, dequantized (gathered as bytes: float8 has few index kernels)
        def blocks64(cache, scale):
            return cache.view(torch.uint8)[t0[:r].long()].view(FP8).double().flatten(0, 1) * scale

        table = torch.arange(r * t0.shape[1], dtype=torch.int32, device="cuda").view(r, -1)
        want, _ = ref_decode_attention(q0[:r], blocks64(k_cache, K_SCALE), blocks64(v_cache, V_SCALE), table, n0[:r])
    else:
        want, _ = ref_decode_attention(q0[:r], k_cache, v_cache, t0[:r], n0[:r])

    def err(out):
        return (out[:r].double().cpu() - want).abs().max().item()

    ours[0]()
    row["err_ours"] = err(outs[0])
    row["ours_us"], row["ours_how"] = time_graph(ours, args.iters)
    row["gbps"] = set_bytes / row["ours_us"] / 1e3
    row["pct_copy"] = 100 * row["gbps"] / copy
    if flashinfer is not None and not args.no_flashinfer:
        try:
            fi_calls, fi_outs, row["fi_plan_us"], row["fi_backend"] = flashinfer_runs(k_cache, v_cache, sets, context,
                                                                                      args)
            fi_calls[0]()
            row["err_fi"], row["diff_fi"] = err(fi_outs[0]), (fi_outs[0] - outs[0]).abs().max().item()
            row["fi_us"], row["fi_how"] = time_graph(fi_calls, args.iters)
            row["vs_fi"] = row["fi_us"] / row["ours_us"]
            del fi_calls, fi_outs
        except Exception as error:  # noqa: BLE001 - report and go on
            row["fi_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
    torch.cuda.empty_cache()
    if not args.no_sdpa and 2.2 * set_bytes * len(sets) < torch.cuda.mem_get_info()[0]:
        kv = [gathered(k_cache, v_cache, t, context) for _, t, _ in sets]
        sdpa_out = [None]

        def sdpa(q, k, v):
            sdpa_out[0] = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True).squeeze(2)

        sdpa_calls = [lambda q=q, k=k, v=v: sdpa(q, k, v) for (q, _, _), (k, v) in zip(sets, kv)]
        sdpa_calls[0]()
        row["err_sdpa"], row["diff_sdpa"] = err(sdpa_out[0]), (sdpa_out[0] - outs[0]).abs().max().item()
        row["sdpa_us"], row["sdpa_how"] = time_graph(sdpa_calls, args.iters)
        row["vs_sdpa"] = row["sdpa_us"] / row["ours_us"]
        del kv, sdpa_calls, sdpa_out
    del k_cache, v_cache, sets, outs, ours
    torch.cuda.empty_cache()
    return row


def fmt(row: dict, key: str, spec: str, suffix: str = "") -> str:
    value = row.get(key)
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown(rows: list[dict]) -> str:
    lines = ["| batch | context | KV MB | sets | ours µs | GB/s | % copy | FlashInfer µs | FI plan µs | FI / ours "
             "| SDPA µs | SDPA / ours | err ours | err FI | err SDPA |",
             "|" + " ---: |" * 15]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['context']} | {r['kv_mb']:.0f} | {r['sets']} "
            f"| {fmt(r, 'ours_us', '.1f')}{'' if r.get('ours_how') == 'graph' else ' †'} | {fmt(r, 'gbps', '.0f')} "
            f"| {fmt(r, 'pct_copy', '.0f', '%')} | {fmt(r, 'fi_us', '.1f')} | {fmt(r, 'fi_plan_us', '.0f')} "
            f"| {fmt(r, 'vs_fi', '.2f', 'x')} | {fmt(r, 'sdpa_us', '.1f')} | {fmt(r, 'vs_sdpa', '.2f', 'x')} "
            f"| {fmt(r, 'err_ours', '.1e')} | {fmt(r, 'err_fi', '.1e')} | {fmt(r, 'err_sdpa', '.1e')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,8,64,256")
    p.add_argument("--contexts", default="512,4096,32768,131072")
    p.add_argument("--max-kv-gb", type=float, default=30.0, help="skip rows whose K + V exceed this")
    p.add_argument("--iters", type=int, default=50, help="timed graph replays per implementation")
    p.add_argument("--no-flashinfer", action="store_true")
    p.add_argument("--no-sdpa", action="store_true")
    p.add_argument("--fi-backend", default="auto", help="FlashInfer decode backend (auto, fa2, ...)")
    p.add_argument("--fi-tensor-cores", action="store_true", help="FlashInfer's tensor-core decode")
    p.add_argument("--fp8", action="store_true", help="float8_e4m3fn caches (k_scale 0.5, v_scale 0.25)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 50 << 20) or (50 << 20)
    copy = copy_gbps(20)
    header = [f"GPU: {props.name}, L2 {l2_bytes / 2**20:.0f} MiB; torch {torch.__version__}",
              f"FlashInfer: {flashinfer.__version__ if flashinfer else 'not available (' + FLASHINFER_ERROR + ')'}",
              f"copy roof: {copy:.0f} GB/s (1 GiB float32 copy_, launched, read + write)",
              f"bf16 q, {'float8_e4m3fn' if args.fp8 else 'bf16'} KV cache, head_dim {D}, {H} q / {KH} kv heads, block {BS}; median of {args.iters} graph replays; "
              "† = launched, not graph-captured"]
    print("\n".join(header), file=sys.stderr)
    shapes = [(b, c) for b in map(int, args.batches.split(",")) for c in map(int, args.contexts.split(","))]
    if (64, 2048) not in shapes:
        shapes.append((64, 2048))
    rows = []
    with torch.inference_mode():
        for batch, context in shapes:
            kv_gb = 2 * batch * context * KH * D * DTYPE.itemsize / 1e9
            if kv_gb > args.max_kv_gb:
                print(f"skip B={batch} ctx={context}: KV {kv_gb:.1f} GB", file=sys.stderr)
                continue
            rows.append(bench_row(batch, context, args, l2_bytes, copy))
            r = rows[-1]
            print(f"B={batch} ctx={context}: ours {fmt(r, 'ours_us', '.1f')} us ({fmt(r, 'gbps', '.0f')} GB/s), "
                  f"FlashInfer {fmt(r, 'fi_us', '.1f')} us {r.get('fi_error', '')}, SDPA {fmt(r, 'sdpa_us', '.1f')} us",
                  file=sys.stderr, flush=True)
    print("\n".join(f"- {line}" for line in header) + "\n\n" + markdown(rows))
    by_shape = {(r["batch"], r["context"]): r for r in rows}
    long, wide = by_shape.get((1, 131072)), by_shape.get((64, 2048))
    if long and wide:
        print(f"\nPer KV byte: batch 1 x 131072 {long['gbps']:.0f} GB/s ({long['ours_us']:.1f} µs) vs batch 64 x 2048 "
              f"{wide['gbps']:.0f} GB/s ({wide['ours_us']:.1f} µs): {long['gbps'] / wide['gbps']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"header": header, "copy_gbps": copy, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
