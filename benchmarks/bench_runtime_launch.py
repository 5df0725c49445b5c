"""mllm_kernel.runtime: host time per launch against CuPy's RawKernel (same kernel, same
arguments: three float32 tensors and one int), and the time a new process takes to get a
launchable kernel from a warm cache.

    python benchmarks/bench_runtime_launch.py [--launches 500] [--reps 40]

Per-launch time = host time of a burst of `--launches` back-to-back launches (no sync inside the
burst) / launches; median over `--reps` bursts, ours and CuPy's interleaved in each repetition.
The kernel is tiny (1 block of 128 threads), so the GPU keeps up and the host is what is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

SOURCE = r"""
extern "C" __global__ void vector_add(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
"""

NEW_PROCESS = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
torch.cuda.init()
t1 = time.perf_counter()
from mllm_kernel.runtime import compile_kernel
t2 = time.perf_counter()
kernel = compile_kernel(sys.stdin.read(), "vector_add", grid=1, block=128)
t3 = time.perf_counter()
a = torch.ones(128, device="cuda")
out = torch.empty(128, device="cuda")
torch.cuda.synchronize()
t4 = time.perf_counter()
kernel(a, a, out, 128)
torch.cuda.synchronize()
t5 = time.perf_counter()
assert out.eq(2).all()
print(json.dumps({"import torch + cuda init": t1 - t0, "import mllm_kernel.runtime": t2 - t1,
                  "compile_kernel (cache hit)": t3 - t2, "first launch (module load) + sync": t5 - t4}))
"""


def burst(launch, launches: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(launches):
        launch()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / launches * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=500)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from mllm_kernel.runtime import compile_kernel

    n = 128
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    ours = compile_kernel(SOURCE, "vector_add", grid=1, block=128)
    stream = torch.cuda.Stream()
    candidates = {
        "mllm_kernel.runtime": lambda: ours(a, b, out, n),
        "mllm_kernel.runtime, stream=": lambda: ours(a, b, out, n, stream=stream),
    }
    try:
        import cupy

        raw = cupy.RawKernel(SOURCE, "vector_add")
        ca, cb, cout = (cupy.from_dlpack(t) for t in (a, b, out))
        count = np.int32(n)
        candidates["cupy.RawKernel"] = lambda: raw((1,), (128,), (ca, cb, cout, count))
    except ImportError as error:
        print(f"(no CuPy: {error})", file=sys.stderr)

    for launch in candidates.values():  # warm-up: compiles, module loads, first launches
        for _ in range(50):
            launch()
    ours(a, b, out, n)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a + b)

    samples: dict[str, list[float]] = {name: [] for name in candidates}
    order = list(candidates)
    for rep in range(args.reps):
        for name in order[rep % len(order):] + order[: rep % len(order)]:  # rotate: no launcher always first
            samples[name].append(burst(candidates[name], args.launches))
    results = {name: statistics.median(values) for name, values in samples.items()}

    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("\n| launcher | µs per launch (median) | vs CuPy |")
    print("|---|---|---|")
    reference = results.get("cupy.RawKernel")
    for name, value in results.items():
        ratio = f"{value / reference:.2f}x" if reference else "-"
        print(f"| {name} | {value:.2f} | {ratio} |")

    # A new process, warm cache: how long until the kernel can be launched.
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, MLLM_KERNEL_CACHE_DIR=cache)
        subprocess.run([sys.executable, "-c", NEW_PROCESS], input=SOURCE, env=env, text=True, check=True,
                       capture_output=True)  # fmt: skip  (fills the cache)
        runs = [json.loads(subprocess.run([sys.executable, "-c", NEW_PROCESS], input=SOURCE, env=env, text=True,
                                          check=True, capture_output=True).stdout) for _ in range(5)]  # fmt: skip
    print("\n| new process, warm cache | ms (median of 5) |")
    print("|---|---|")
    timings = {key: statistics.median(run[key] for run in runs) * 1e3 for key in runs[0]}
    for key, value in timings.items():
        print(f"| {key} | {value:.1f} |")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"per_launch_us": results, "new_process_ms": timings}, file, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
