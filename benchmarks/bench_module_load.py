"""Time to load an already-compiled module in a NEW process (JitSpec.load(): source key, cache
key, integrity check, dlopen), cold and warm:

  cold: the module is in the JIT cache but the file memo (<cache>/.memo) is empty, so every
        source and header is read and hashed and `c++ --version` runs;
  warm: a previous process filled the memo: nothing is re-read or run.

Each sample is one fresh interpreter that imports the runtime and tvm_ffi first (not timed) and
then times spec.load() of one module; the table shows the median (and min-max) of --runs samples.

Usage: python3 benchmarks/bench_module_load.py [--runs 9] [--op rms_norm ...] [--cache-dir DIR]
(PYTHONPATH must reach torch's and tvm-ffi's site-packages, as for the other benchmarks.)
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mllm_kernel.jit_utils import JitSpec, filememo, make_spec  # noqa: E402

CHILD = """\
import ast, sys, time
from mllm_kernel.jit_utils import JitSpec
import tvm_ffi
spec = JitSpec(**ast.literal_eval(sys.argv[1]))
start = time.perf_counter()
spec.load()
print((time.perf_counter() - start) * 1e3)
"""


def add_constant_specs() -> list[JitSpec]:
    # The package's own copy: the checkout's kernels/ or an installed wheel's mllm_kernel/kernels/.
    source = Path(importlib.import_module("mllm_kernel.kernels.add_constant").__file__).parent / "add_constant.cpp"
    return [
        make_spec("add_constant", "cpu", (16,), cpp_files=[source],
                  cpp_wrappers=[("add_constant", "mllm_kernel::cpu::add_constant<16>")]),
        make_spec("add_constant_runtime", "cpu", cpp_files=[source],
                  cpp_wrappers=[("add_constant_runtime", "mllm_kernel::cpu::add_constant_runtime")]),
    ]  # fmt: skip


def op_spec(op: str) -> JitSpec:
    """The CPU spec of kernels/<op> (its package's SPECS["cpu"])."""
    return importlib.import_module(f"mllm_kernel.kernels.{op}").SPECS["cpu"]


def time_load(spec: JitSpec, env: dict[str, str]) -> float:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, repr(dataclasses.asdict(spec))], env=env, capture_output=True, text=True
    )
    if result.returncode != 0 or "compiling" in result.stderr:
        raise SystemExit(f"loading {spec.display_name} failed or compiled:\n{result.stderr}")
    return float(result.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--op", action="append", default=[], help="also a kernel folder's CPU module")
    parser.add_argument("--cache-dir", type=Path, help="JIT cache to use (default: a fresh temp dir)")
    args = parser.parse_args()

    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="bench_module_load_")) / "cache"
    os.environ["MLLM_KERNEL_CACHE_DIR"] = str(cache)
    for name in ("MLLM_KERNEL_PREBUILT", "MLLM_KERNEL_DISABLE_JIT"):
        os.environ.pop(name, None)  # time the JIT cache, not a prebuilt tree
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *sys.path[1:]]))
    specs = add_constant_specs() + [op_spec(op) for op in args.op]
    for spec in specs:
        spec.build()  # compiles once if the cache lacks it
    memo = cache / filememo.MEMO_DIR

    rows = []
    for spec in specs:
        cold = []
        for _ in range(args.runs):
            shutil.rmtree(memo, ignore_errors=True)
            cold.append(time_load(spec, env))
        warm = [time_load(spec, env) for _ in range(args.runs)]  # the last cold run filled the memo
        rows.append((spec.display_name, cold, warm))

    print(f"spec.load() in a new process, ms (median, min-max of {args.runs}; cache {cache})")
    print(f"{'module':<32} {'cold (empty memo)':>22} {'warm':>20}")
    for name, cold, warm in rows:
        cell = lambda t: f"{statistics.median(t):7.1f} ({min(t):.1f}-{max(t):.1f})"  # noqa: E731
        print(f"{name:<32} {cell(cold):>22} {cell(warm):>20}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
