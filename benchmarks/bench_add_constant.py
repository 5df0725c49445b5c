"""Benchmark add_constant: per-call host overhead, JIT compile/load time, and throughput.

Run from the repository root:
    MLLM_KERNEL_HIGHWAY_ROOT=/path/to/highway python3 benchmarks/bench_add_constant.py [--json out.json]
A measurement script, not a test: it prints numbers and asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout's mllm_kernel, not an installed one

import torch  # noqa: E402
import tvm_ffi  # noqa: E402

import mllm_kernel.cpu.jit as cpu_jit  # noqa: E402
import mllm_kernel.cuda.jit as cuda_jit  # noqa: E402
from mllm_kernel.jit_utils import registered_specs  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
CALLS = 5000  # calls per repetition in part 1
ITERS = 20  # individually timed iterations per case and repetition in part 3


def header() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor() or "unknown")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items())
                   if k.startswith("MLLM_KERNEL_") or k in ("CUDA_VISIBLE_DEVICES", "CXX"))
    argv = getattr(sys, "orig_argv", [sys.executable, *sys.argv])
    return {
        "command": (env + " " if env else "") + shlex.join(argv),
        "cpu": f"{cpu}, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), "
               f"torch threads {torch.get_num_threads()}",
        "gpu": torch.cuda.get_device_name() if HAS_CUDA else "none (CUDA rows skipped)",
        "versions": f"python {platform.python_version()}, torch {torch.__version__}, tvm-ffi {tvm_ffi.__version__}",
    }


def loaded(display_name: str):
    """The tvm-ffi module of a spec the wrappers have loaded already (raw calls, no Python wrapper)."""
    return next(s for s in registered_specs() if s.display_name == display_name).load()


def sync() -> None:
    if HAS_CUDA:
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- 1. per-call overhead


def per_call_us(fn, repeats: int) -> float:
    """Median over repetitions of (host time of CALLS calls + one final sync) / CALLS."""
    for _ in range(CALLS // 10):  # warm-up
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(CALLS):
            fn()
        sync()
        samples.append((time.perf_counter_ns() - start) / CALLS / 1e3)
    return statistics.median(samples)


def bench_overhead(repeats: int) -> list[dict]:
    x, out = torch.randn(16), torch.empty(16)
    mod16, modrt = loaded("cpu_add_constant_16"), loaded("cpu_add_constant_runtime")
    kernels = getattr(sys.modules[cpu_jit.add_constant.__module__], "_KERNELS", {})  # internal; optional row
    cases = [
        ("cpu", "mllm_kernel add_constant(x, 16)", lambda: cpu_jit.add_constant(x, 16)),
        ("cpu", "mllm_kernel add_constant_runtime(x, 16)", lambda: cpu_jit.add_constant_runtime(x, 16)),
        ("cpu", "raw tvm-ffi add_constant<16>(out, x)", lambda: mod16.add_constant(out, x)),
        ("cpu", "raw tvm-ffi add_constant_runtime(out, x, 16.0)", lambda: modrt.add_constant_runtime(out, x, 16.0)),
        *([("cpu", "  part: module memo lookup (@jit load_module)", kernels[16].load_module)] if 16 in kernels else []),
        ("cpu", "  part: torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("cpu", "torch.add(x, 16)", lambda: torch.add(x, 16)),
        ("cpu", "torch.add(x, 16, out=out)", lambda: torch.add(x, 16, out=out)),
    ]
    if HAS_CUDA:
        xi = torch.randint(-1000, 1000, (16,), dtype=torch.int32, device="cuda")
        oi, modc = torch.empty_like(xi), loaded("cuda_add_constant_8")
        cases += [
            ("cuda", "mllm_kernel add_constant(x, 8)", lambda: cuda_jit.add_constant(xi, 8)),
            ("cuda", "raw tvm-ffi add_constant<8>(out, x)", lambda: modc.add_constant(oi, xi)),
            ("cuda", "torch.add(x, 8)", lambda: torch.add(xi, 8)),
            ("cuda", "torch.add(x, 8, out=out)", lambda: torch.add(xi, 8, out=oi)),
        ]
    return [{"device": dev, "case": name.strip(), "us_per_call": per_call_us(fn, repeats), "label": name}
            for dev, name, fn in cases]


# ----------------------------------------------------------------------------- 2. cold compile / warm load

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])
import torch
which = sys.argv[1]
x = torch.zeros(16, dtype=torch.int32, device="cuda") if which.startswith("cuda") else torch.zeros(16)
t0 = time.perf_counter()
import mllm_kernel.cpu.jit as cpu_jit, mllm_kernel.cuda.jit as cuda_jit
from mllm_kernel.jit_utils import registered_specs
t1 = time.perf_counter()
{"cpu_add_constant_16": lambda: cpu_jit.add_constant(x, 16), "cuda_add_constant_8": lambda: cuda_jit.add_constant(x, 8),
 "cpu_add_constant_runtime": lambda: cpu_jit.add_constant_runtime(x, 16)}[which]()  # first call: build/load
t2 = time.perf_counter()
next(s for s in registered_specs() if s.display_name == which).key()  # compiler identity now memoized
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "rehash_s": t3 - t2}))
"""


def run_child(which: str, cache: str) -> dict:
    """One fresh interpreter (CUDA initialised before its clock starts). 'compiled' comes from the
    runtime's own 'compiling ...' line on stderr."""
    env = dict(os.environ, MLLM_KERNEL_CACHE_DIR=cache)
    env.pop("MLLM_KERNEL_DISABLE_JIT", None)
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", CHILD, which, str(REPO)], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"child {which} failed:\n{res.stderr}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return {**out, "compiled": "mllm_kernel: compiling" in res.stderr, "process_wall_s": wall}


def bench_compile() -> list[dict]:
    rows = []
    for which in ["cpu_add_constant_16", "cpu_add_constant_runtime"] + (["cuda_add_constant_8"] if HAS_CUDA else []):
        with tempfile.TemporaryDirectory(prefix="mllm_bench_cache_") as cache:
            cold, warm = run_child(which, cache), run_child(which, cache)
        if not cold["compiled"] or warm["compiled"]:
            print(f"  warning: {which}: cold compiled={cold['compiled']} (prebuilt module used?), "
                  f"warm compiled={warm['compiled']} (sources edited in between?)")
        rows.append({"module": which, "cold": cold, "warm": warm})
    return rows


# ----------------------------------------------------------------------------- 3. throughput


def host_times(fn) -> list[float]:
    times = []
    for _ in range(ITERS):
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1e9)
    return times


def event_times(fn) -> list[float]:
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(ITERS)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in events]


def compare(cases: dict, timer, repeats: int, nbytes: int) -> dict:
    """All cases in interleaved blocks of ITERS (same run, same conditions): median time, GB/s."""
    for fn in cases.values():
        for _ in range(10):  # warm-up
            fn()
    sync()
    samples = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            samples[name] += timer(fn)
    medians = {name: statistics.median(times) for name, times in samples.items()}
    return {name: {"median_us": t * 1e6, "gb_s": nbytes / t / 1e9, "samples": len(samples[name])}
            for name, t in medians.items()}


def bench_throughput(repeats: int) -> dict:
    n, threads = 1 << 20, torch.get_num_threads()
    x, out = torch.randn(n), torch.empty(n)
    mod16 = loaded("cpu_add_constant_16")
    if not torch.equal(cpu_jit.add_constant(x, 16), x + 16):
        raise SystemExit("CPU add_constant result differs from torch: not benchmarking a wrong kernel")
    torch.set_num_threads(1)
    try:
        cpu = compare({"ours add_constant(x, 16)": lambda: cpu_jit.add_constant(x, 16),
                       "torch x + 16 (1 thread)": lambda: x + 16,
                       "ours raw, out preallocated": lambda: mod16.add_constant(out, x),
                       "torch add(out=) (1 thread)": lambda: torch.add(x, 16, out=out)}, host_times, repeats, 8 * n)
        torch.set_num_threads(threads)
        cpu.update(compare({"ours add_constant(x, 16) (2nd run)": lambda: cpu_jit.add_constant(x, 16),
                            f"torch x + 16 ({threads} threads)": lambda: x + 16}, host_times, repeats, 8 * n))
    finally:
        torch.set_num_threads(threads)
    t = {k: v["median_us"] for k, v in cpu.items()}
    res = {"cpu": {"n": n, "dtype": "float32", "results": cpu, "summary": {
        "torch 1 thread / ours (>1: ours faster)": t["torch x + 16 (1 thread)"] / t["ours add_constant(x, 16)"],
        "same, both out preallocated": t["torch add(out=) (1 thread)"] / t["ours raw, out preallocated"],
        f"torch {threads} threads / ours (info)": t[f"torch x + 16 ({threads} threads)"]
        / t["ours add_constant(x, 16) (2nd run)"]}}}
    if HAS_CUDA:
        n = 1 << 26
        xi = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, device="cuda")
        yi = torch.empty_like(xi)
        if not torch.equal(cuda_jit.add_constant(xi, 8), xi + 8):
            raise SystemExit("CUDA add_constant result differs from torch: not benchmarking a wrong kernel")
        gpu = compare({"ours add_constant(x, 8)": lambda: cuda_jit.add_constant(xi, 8),
                       "torch x + 8": lambda: xi + 8,
                       "torch copy_ (D2D bandwidth reference)": lambda: yi.copy_(xi)}, event_times, repeats, 8 * n)
        res["cuda"] = {"n": n, "dtype": "int32", "results": gpu, "summary": {
            "torch / ours (>1: ours faster)": gpu["torch x + 8"]["median_us"] / gpu["ours add_constant(x, 8)"]["median_us"],
            "ours % of copy_ GB/s": 100 * gpu["ours add_constant(x, 8)"]["gb_s"]
            / gpu["torch copy_ (D2D bandwidth reference)"]["gb_s"]}}
    return res


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10, help="repetitions per measurement (default 10)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--skip-compile", action="store_true", help="skip part 2 (cold compile / warm load)")
    args = parser.parse_args()

    info = header()
    for key, value in info.items():
        print(f"{key:<9} {value}")
    print(f"{'repeats':<9} {args.repeats} (part 1: {CALLS} calls each; part 3: {ITERS} timed iterations each)")
    cpu_jit.add_constant(torch.zeros(1), 16)  # build or load outside the timings (the usual cache)
    cpu_jit.add_constant_runtime(torch.zeros(1), 16)
    if HAS_CUDA:
        cuda_jit.add_constant(torch.zeros(1, dtype=torch.int32, device="cuda"), 8)

    print("\n1. Per-call host time, 16-element tensors (median over repetitions; CUDA: one sync per repetition)")
    overhead = bench_overhead(args.repeats)
    for row in overhead:
        print(f"  {row['device']:<5} {row.pop('label'):<50} {row['us_per_call']:8.2f} us/call")

    compile_rows = None
    if not args.skip_compile:
        print("\n2. Cold compile vs warm load: fresh cache dir, each load in a fresh subprocess")
        compile_rows = bench_compile()
        print(f"  {'module':<26} {'cold load':>10} {'warm load':>10} {'rehash':>9} {'import':>9} {'process cold/warm':>18}")
        for r in compile_rows:
            c, w = r["cold"], r["warm"]
            print(f"  {r['module']:<26} {c['load_s']:9.2f}s {w['load_s'] * 1e3:8.1f}ms {w['rehash_s'] * 1e3:7.1f}ms "
                  f"{w['import_s'] * 1e3:7.1f}ms {c['process_wall_s']:8.2f}s /{w['process_wall_s']:6.2f}s")
        print("  load: first wrapper call (key incl. `c++ --version`, then build or dlopen); rehash: key() again\n"
              "  with the compiler identity memoized; import: mllm_kernel packages; process: subprocess wall time")

    print("\n3. Throughput (median over timed iterations; GB/s counts bytes read + written)")
    tput = bench_throughput(args.repeats)
    for dev, section in tput.items():
        print(f"  {dev}: n={section['n']} {section['dtype']}, host perf_counter" if dev == "cpu"
              else f"  {dev}: n={section['n']} {section['dtype']}, cuda events")
        for name, r in section["results"].items():
            print(f"    {name:<40} {r['median_us']:10.1f} us {r['gb_s']:9.2f} GB/s")
        for name, value in section["summary"].items():
            print(f"    {name:<40} {value:10.2f}")

    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "repeats": args.repeats, "overhead": overhead,
                                               "compile": compile_rows, "throughput": tput}, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
