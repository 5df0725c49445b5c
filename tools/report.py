"""bazel run //tools:report: the main-job report. Runs every op on the best available device
(CUDA if torch sees a GPU, else CPU) on small fixed random inputs, checks each against a
float64 torch reference (PASS/FAIL with the max error), then prints a quick benchmark table
(benchmarks/bench_ops.py --quick). Exit code 1 if any check fails. Works on CPU-only machines.

    python3 tools/report.py [--device cpu|cuda] [--no-bench]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from mllm_kernel import env_info, kernels  # noqa: E402
from mllm_kernel.kernels.checks import Checks  # noqa: E402


def check_all(c: Checks) -> None:
    """Every op package's report checks (kernels/<op>/cases.py: check), in registry order."""
    for name in kernels.names():
        check = getattr(kernels.cases(name), "check", None)
        if check is not None:
            check(c)


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

    from mllm_kernel.engine import demo  # the library doing its real job: a model served by it

    print("\n".join(demo.report(device)) + "\n", flush=True)

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
