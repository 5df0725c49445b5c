"""Benchmark every op against torch eager (and torch.compile) on the best device.

Run from the repository root:
    python3 benchmarks/bench_ops.py [--device cuda|cpu] [--ops rms_norm,softmax] [--quick]
                                    [--compile | --no-compile] [--markdown PATH] [--json PATH]

Cases come from the op registry, kernels/<op>/cases.py: benchmark_cases(device) -> list of dicts with "op",
"shape", "dtype", "ours", "eager" (zero-arg callables), "bytes" (minimum bytes moved) and an
optional "check": False (ours and eager legitimately differ, e.g. a different sampling order)
and "graph": False (CUDA: time launches, the callable cannot be captured in a CUDA graph).
Each case is first checked (ours vs eager), then timed; the median is reported.
A measurement script: a failed check marks the row and makes the exit code 1; timings assert nothing.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import shlex
import signal
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the checkout's mllm_kernel, not an installed one

import torch  # noqa: E402

from mllm_kernel import kernels  # noqa: E402


def bench_packages() -> list[str]:
    """The op packages with benchmark cases (kernels/<op>/cases.py: benchmark_cases)."""
    return [n for n in kernels.names() if hasattr(kernels.cases(n), "benchmark_cases")]


# (atol, rtol) by the eager output's dtype: loose, this catches wrong kernels, not ulp drift.
TOLERANCES = {
    torch.float64: (1e-6, 1e-5),
    torch.float32: (1e-4, 1e-3),
    torch.float16: (2e-3, 1e-2),
    torch.bfloat16: (1e-2, 2e-2),
}

COPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 27}  # per buffer; far past the last-level cache


# ----------------------------------------------------------------------------- timing


class CpuTimer:
    """perf_counter_ns around batches of calls, so one sample is >= target_ns (timer noise)."""

    def __init__(self, iters: int, target_ns: int):
        self.iters, self.target_ns = iters, target_ns

    def __call__(self, fn, graph: bool = True) -> tuple[float, str]:
        fn()  # warm-up: first-call costs (JIT load, allocator) stay out of the samples
        t0 = time.perf_counter_ns()
        fn()
        one = max(time.perf_counter_ns() - t0, 1)
        reps = max(1, min(10_000, math.ceil(self.target_ns / one)))
        samples = []
        for _ in range(self.iters):
            t0 = time.perf_counter_ns()
            for _ in range(reps):
                fn()
            samples.append((time.perf_counter_ns() - t0) / reps)
        return statistics.median(samples) / 1e3, f"loop x{reps}"


class CudaTimer:
    """CUDA events around a CUDA graph of `reps` calls (device time, no launch gaps); a callable
    that cannot be captured (host syncs, e.g. embedding[checked]) falls back to a plain loop of
    launches between the same events (then host overhead is part of the number)."""

    def __init__(self, iters: int, target_ms: float, use_graph: bool):
        self.iters, self.target_ms, self.use_graph = iters, target_ms, use_graph

    def _events(self, body) -> list[float]:
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(self.iters)]
        for start, end in pairs:
            start.record()
            body()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in pairs]  # ms

    def __call__(self, fn, graph: bool = True) -> tuple[float, str]:
        # Warm-up on a side stream, as torch recommends before graph capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        torch.cuda.synchronize()
        est_ms = max(start.elapsed_time(end) / 5, 1e-4)
        reps = max(1, min(1000, math.ceil(self.target_ms / est_ms)))

        def loop():
            for _ in range(reps):
                fn()

        if self.use_graph and graph:
            cuda_graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(cuda_graph):
                    loop()
            except Exception:  # noqa: BLE001 - any capture failure: time launches instead
                del cuda_graph
                torch.cuda.synchronize()
            else:
                cuda_graph.replay()  # first replay uploads the graph
                samples = self._events(cuda_graph.replay)
                del cuda_graph
                return statistics.median(samples) * 1e3 / reps, f"graph x{reps}"
        loop()
        return statistics.median(self._events(loop)) * 1e3 / reps, f"loop x{reps}"


def copy_bandwidth(device: str, timer) -> dict:
    """Device-to-device copy of one large buffer: the bandwidth roof the % column refers to."""
    nbytes = COPY_BYTES[device]
    if device == "cuda":
        nbytes = min(nbytes, torch.cuda.mem_get_info()[0] // 8)
    # float32 elements: torch's byte copy is slower than its wide copies on some GPUs, and the
    # roof should be the best copy torch does.
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1)
    nbytes = src.numel() * 4
    dst = torch.empty_like(src)
    # The roof is the best copy torch does. A captured copy_ becomes a graph memcpy node, which can
    # be slower than a launched copy (on an H200 the graph copy measured 2.77 TB/s while our own
    # kernels moved 4.1 TB/s), so time both and keep the faster.
    us, how = timer(lambda: dst.copy_(src))
    if device == "cuda":
        loop_us, loop_how = timer(lambda: dst.copy_(src), False)
        if loop_us < us:
            us, how = loop_us, loop_how
    del src, dst
    return {"bytes_per_buffer": nbytes, "us": us, "gbps": 2 * nbytes / us / 1e3, "how": how}


# ----------------------------------------------------------------------------- checking


def _as_list(result) -> list:
    if result is None:
        return []
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for t in result if isinstance(t, torch.Tensor)]
    return []


def _captured_tensors(fn) -> list[torch.Tensor]:
    """Tensors a zero-arg callable reaches through its default args and closure cells, in
    order (defaults first). In-place ops (rope, fused_add_rms_norm, kv_cache) return nothing,
    so their outputs are found here."""
    objs = list(getattr(fn, "__defaults__", None) or ())
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            objs.append(cell.cell_contents)
        except ValueError:  # empty cell
            pass
    out = []
    for obj in objs:
        out += _as_list(obj) if isinstance(obj, (tuple, list, torch.Tensor)) else []
    return out


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    if expected.is_floating_point():
        atol, rtol = TOLERANCES.get(expected.dtype, (1e-2, 2e-2))
    else:
        atol, rtol = 0, 0  # token ids, indices: exact
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, check_dtype=False,
                               check_device=False, equal_nan=True)


def check_case(case: dict) -> str:
    """ours vs eager on the case's current inputs; restores every captured tensor afterwards
    so that in-place cases start timing from their original values."""
    if case.get("check", True) is False:
        return "skip"
    ours, eager = case["ours"], case["eager"]
    seen, tensors = set(), []
    for t in _captured_tensors(ours) + _captured_tensors(eager):
        if id(t) not in seen:
            seen.add(id(t))
            tensors.append(t)
    snapshot = [t.clone() for t in tensors]

    def restore():
        for t, s in zip(tensors, snapshot):
            t.copy_(s)

    def mutated() -> list[int]:
        return [i for i, (t, s) in enumerate(zip(tensors, snapshot)) if not torch.equal(t, s)]

    try:
        got = _as_list(ours())
        ours_mutated = mutated()
        ours_state = {i: tensors[i].clone() for i in ours_mutated}
        restore()
        want = _as_list(eager())
        eager_mutated = mutated()
        eager_state = {i: tensors[i].clone() for i in eager_mutated}
        restore()
        if got:
            pairs = list(zip(got, want))
            if len(got) != len(want):
                return f"FAIL: ours returned {len(got)} tensors, eager {len(want)}"
        elif want:
            # In-place ours, out-of-place eager: pair each eager output with a tensor ours
            # reaches of the same shape and dtype (mutated ones first, then in capture order).
            ours_ids = {id(t) for t in _captured_tensors(ours)}
            order = ours_mutated + [i for i in range(len(tensors)) if i not in ours_mutated]
            free = [i for i in order if id(tensors[i]) in ours_ids]
            pairs = []
            for w in want:
                match = next((i for i in free if tensors[i].shape == w.shape and tensors[i].dtype == w.dtype), None)
                if match is None:
                    return f"FAIL: no in-place output of ours matches eager output {tuple(w.shape)}"
                free.remove(match)
                pairs.append((ours_state.get(match, snapshot[match]), w))
        else:
            # Both in place on shared tensors (kv_cache): compare what each left behind.
            changed = sorted(set(ours_mutated) | set(eager_mutated))
            if not changed:
                return "FAIL: neither ours nor eager returned or changed anything"
            pairs = [(ours_state.get(i, snapshot[i]), eager_state.get(i, snapshot[i])) for i in changed]
        for a, b in pairs:
            _assert_close(a, b)
    except AssertionError as e:
        restore()
        lines = [line for line in str(e).splitlines() if line.strip()]
        return "FAIL: " + "; ".join(lines[:3])
    return "ok"


# ----------------------------------------------------------------------------- cases


def parse_ops(spec: str | None) -> dict[str, set[str] | None]:
    """--ops tokens: op package names (all their cases) or public op names (only those cases)."""
    packages = bench_packages()
    if not spec:
        return {m: None for m in packages}
    exports = kernels.exports()
    chosen: dict[str, set[str] | None] = {}
    for token in (t.strip() for t in spec.split(",") if t.strip()):
        if token in packages:
            chosen[token] = None
            continue
        module = exports.get(token)
        if module not in packages:
            known = sorted(set(packages) | {n for n, m in exports.items() if m in packages})
            raise SystemExit(f"--ops: unknown op {token!r}; known: {', '.join(known)}")
        if chosen.get(module, set()) is not None:
            chosen.setdefault(module, set()).add(token)
    return {m: chosen[m] for m in packages if m in chosen}  # stable order


def load_cases(module: str, names: set[str] | None, device: str, quick: bool) -> list[dict]:
    cases = [c for c in kernels.cases(module).benchmark_cases(device) if names is None or c["op"].split("[")[0] in names]
    if quick:  # the first case of each op name (the bench files list small shapes first)
        firsts = {}
        for c in cases:
            firsts.setdefault(c["op"], c)
        cases = list(firsts.values())
    return cases


# ----------------------------------------------------------------------------- report


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown_table(rows: list[dict]) -> str:
    out = ["| op | shape | dtype | ours µs | GB/s | % of copy | vs eager | vs compile | check |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        if r.get("error"):
            out.append(f"| {r['op']} | {r['shape']} | {r['dtype']} | - | - | - | - | - | ERROR: {r['error']} |")
            continue
        check = r["check"].replace("|", "/")
        out.append(
            f"| {r['op']} | {r['shape']} | {r['dtype']} | {_fmt(r['ours_us'], '.2f')}"
            f"{'' if r['ours_how'].startswith('graph') or r['device'] == 'cpu' else ' †'} "
            f"| {_fmt(r['gbps'], '.1f')} | {_fmt(r['pct_copy'], '.0f', '%')} "
            f"| {_fmt(r['vs_eager'], '.2f', 'x')} | {_fmt(r['vs_compile'], '.2f', 'x')} | {check} |")
    return "\n".join(out)


def machine_header(device: str, args, copy: dict) -> list[str]:
    if device == "cuda":
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        dev = f"GPU: {p.name} ({p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs)"
    else:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   platform.processor() or "unknown")
        dev = f"CPU: {cpu}, {os.cpu_count()} cores; torch threads {torch.get_num_threads()}"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items())
                   if k.startswith("MLLM_KERNEL_") or k in ("CUDA_VISIBLE_DEVICES",))
    argv = getattr(sys, "orig_argv", [sys.executable, *sys.argv])
    return [
        f"- {dev}",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}), python {platform.python_version()}",
        f"- command: `{(env + ' ' if env else '') + shlex.join(argv)}`",
        f"- copy roof: `dst.copy_(src)` of {copy['bytes_per_buffer'] / 2**20:.0f} MiB: "
        f"{copy['gbps']:.1f} GB/s ({copy['how']}); timing: median of {args.iters} samples"
        + ("; † = plain launch loop (not graph-capturable), includes host overhead" if device == "cuda" else ""),
    ]


# ----------------------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available, else cpu")
    p.add_argument("--ops", help="comma-separated modules or op names, e.g. rms_norm,softmax")
    p.add_argument("--quick", action="store_true", help="first case per op only, few iterations")
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="also time torch.compile(eager) (default on CUDA; on CPU inductor needs a C++ toolchain)")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--no-graph", action="store_true", help="CUDA: time plain launch loops, not CUDA graphs")
    p.add_argument("--iters", type=int, help="timed samples per case (default 25, quick 5)")
    p.add_argument("--markdown", type=Path, help="write the table with a machine header here")
    p.add_argument("--json", type=Path, help="write raw numbers here")
    args = p.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no GPU")
    if args.compile is None:
        args.compile = args.device == "cuda"
    args.iters = args.iters or (5 if args.quick else 25)
    return args


def run(argv=None) -> tuple[int, list[dict], str]:
    """(exit code, rows, markdown table); tools/report.py calls this in-process."""
    args = parse_args(argv)
    device = args.device
    if device == "cpu":
        torch.set_num_threads(1)  # our CPU kernels are single-threaded: compare like with like
        timer = CpuTimer(args.iters, target_ns=(200_000 if args.quick else 1_000_000))
    else:
        timer = CudaTimer(args.iters, target_ms=(0.5 if args.quick else 2.0), use_graph=not args.no_graph)
    selection = parse_ops(args.ops)

    def on_term(signum, frame):  # an outer `timeout` still gets the rows measured so far
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    copy = copy_bandwidth(device, timer)
    print(f"copy roof: {copy['gbps']:.1f} GB/s", file=sys.stderr)
    rows, interrupted = [], False
    t_start = time.time()
    try:
        for module, names in selection.items():
            cases = load_cases(module, names, device, args.quick)
            while cases:
                case = cases.pop(0)  # dropped after use: its inputs are freed case by case
                rows.append(bench_case(case, device, timer, args.compile, copy["gbps"]))
                r = rows[-1]
                print(f"[{time.time() - t_start:6.0f}s] {r['op']} {r['shape']} {r['dtype']}: "
                      f"{r.get('error') or _fmt(r['ours_us'], '.2f', ' us') + ' ' + r['check']}",
                      file=sys.stderr, flush=True)
                del case
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: writing the rows measured so far", file=sys.stderr)

    table = markdown_table(rows)
    print(table)
    header = machine_header(device, args, copy)
    if args.markdown:
        args.markdown.write_text("\n".join(["# mllm-kernel op benchmarks", "", *header, "",
                                            table + ("\n\n(interrupted)" if interrupted else ""), ""]))
    if args.json:
        args.json.write_text(json.dumps({"header": header, "copy": copy, "interrupted": interrupted,
                                         "rows": rows}, indent=1))
    failed = [r for r in rows if r.get("error") or r["check"].startswith("FAIL")]
    code = 1 if failed or interrupted else 0
    return code, rows, table


def bench_case(case: dict, device: str, timer, do_compile: bool, copy_gbps: float) -> dict:
    row = {k: case[k] for k in ("op", "shape", "dtype", "bytes")}
    row.update(device=device, ours_us=None, eager_us=None, compile_us=None, gbps=None, pct_copy=None,
               vs_eager=None, vs_compile=None, ours_how="", check="")
    # Host-syncing callables cannot be captured; skip the doomed capture attempt for them.
    graph = case.get("graph", True) is not False and "[checked]" not in case["op"]
    try:
        row["check"] = check_case(case)
        row["ours_us"], row["ours_how"] = timer(case["ours"], graph)
        row["eager_us"], row["eager_how"] = timer(case["eager"], graph)
        if do_compile:
            torch._dynamo.reset()  # fresh, static-shape compile per case (no recompile limit, no dynamic shapes)
            try:
                compiled = torch.compile(case["eager"])
                row["compile_us"], row["compile_how"] = timer(compiled, graph)
            except Exception as e:  # noqa: BLE001 - report, keep benchmarking
                row["compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            finally:
                compiled = None
                torch._dynamo.reset()
    except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        return row
    us = row["ours_us"]
    row["gbps"] = case["bytes"] / us / 1e3
    row["pct_copy"] = 100 * row["gbps"] / copy_gbps
    row["vs_eager"] = row["eager_us"] / us
    row["vs_compile"] = row["compile_us"] / us if row["compile_us"] else None
    return row


def main(argv=None) -> int:
    return run(argv)[0]


if __name__ == "__main__":
    sys.exit(main())
