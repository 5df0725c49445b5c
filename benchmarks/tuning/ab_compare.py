"""Per-row comparison of runs of several variants (ab_prefill.sh).

    python3 benchmarks/tuning/ab_compare.py OUTDIR

Reads OUTDIR/p_<variant><n>.json (bench_prefill_attention.py --json) and OUTDIR/k_<variant><n>.log
(prefill_kernels.cu's lines); variant: one capital letter, A the baseline. For every row
(head_dim, mask, batch x seq, page size) it prints each variant's TFLOP/s of every run, and the
ratio of its median to A's median; then per variant the geometric mean of those ratios over all
rows and over head_dim <= 128.
"""

from __future__ import annotations

import glob
import json
import re
import statistics
import sys


def main(out: str) -> int:
    runs: dict[tuple, dict[str, list[float]]] = {}

    def add(variant: str, head_dim: int, causal: bool, batch: int, seq: int, page: int, tflops: float) -> None:
        runs.setdefault((head_dim, causal, batch, seq, page), {}).setdefault(variant, []).append(tflops)

    for path in sorted(glob.glob(f"{out}/p_*.json")):
        variant = re.match(r"p_([A-Z])\d*\.json$", path.split("/")[-1])
        if variant is None:
            continue
        for row in json.load(open(path))["rows"]:
            add(variant.group(1), row["head_dim"], row["causal"], row["batch"], row["seq"], row.get("page_size", 0),
                row["ours_tflops"])
    for path in sorted(glob.glob(f"{out}/k_*.log")):
        variant = re.match(r"k_([A-Z])\d*\.log$", path.split("/")[-1])
        if variant is None:
            continue
        for line in open(path):
            m = re.match(r"D=(\d+) (causal|full) (\d+)x(\d+) \w+ bs=(\d+): [\d.]+ ms ([\d.]+) TFLOP/s", line)
            if m:
                add(variant.group(1), int(m[1]), m[2] == "causal", int(m[3]), int(m[4]), int(m[5]), float(m[6]))
    if not runs:
        print(f"no p_<variant><n>.json or k_<variant><n>.log in {out}")
        return 1
    variants = sorted({v for by_variant in runs.values() for v in by_variant} - {"A"})
    ratios: dict[str, list[tuple[int, float]]] = {v: [] for v in variants}
    print("| head_dim | mask | batch x seq | page | A | " + " | ".join(f"{v} | {v} / A" for v in variants) + " |")
    print("|---:|---|---|---:|---:|" + "---:|---:|" * len(variants))
    for key in sorted(runs, key=lambda k: (k[0], not k[1], -k[2], k[4])):
        by_variant = runs[key]
        if "A" not in by_variant:  # a row that only other variants ran: nothing to compare with
            continue
        base = statistics.median(by_variant["A"])
        cells = [", ".join(f"{x:.0f}" for x in by_variant["A"])]
        for v in variants:
            if v not in by_variant:
                cells += ["-", "-"]
                continue
            ratio = statistics.median(by_variant[v]) / base
            ratios[v].append((key[0], ratio))
            cells += [", ".join(f"{x:.0f}" for x in by_variant[v]), f"{ratio:.3f}x"]
        page = key[4] or "-"
        print(f"| {key[0]} | {'causal' if key[1] else 'full'} | {key[2]} x {key[3]} | {page} | " + " | ".join(cells) + " |")
    for v in variants:
        if not ratios[v]:
            continue
        small = [r for head_dim, r in ratios[v] if head_dim <= 128]
        print(f"{v} / A geomean: all rows {statistics.geometric_mean(r for _, r in ratios[v]):.4f}"
              + (f", head_dim <= 128 {statistics.geometric_mean(small):.4f}" if small else ""))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
