"""Per-row comparison of bench_prefill_attention.py runs of several variants (ab_prefill.sh).

    python3 benchmarks/tuning/ab_compare.py OUTDIR

Reads OUTDIR/p_<variant><n>.json (variant: one capital letter, A the baseline). For every row
(head_dim, mask, batch x seq) it prints each variant's TFLOP/s of every run, and the ratio of
its median to A's median; then per variant the geometric mean of those ratios over all rows and
over head_dim <= 128.
"""

from __future__ import annotations

import glob
import json
import re
import statistics
import sys


def main(out: str) -> int:
    runs: dict[tuple, dict[str, list[float]]] = {}
    for path in sorted(glob.glob(f"{out}/p_*.json")):
        variant = re.match(r"p_([A-Z])\d*\.json$", path.split("/")[-1])
        if variant is None:
            continue
        for row in json.load(open(path))["rows"]:
            key = (row["head_dim"], row["causal"], row["batch"], row["seq"])
            runs.setdefault(key, {}).setdefault(variant.group(1), []).append(row["ours_tflops"])
    if not runs:
        print(f"no p_<variant><n>.json in {out}")
        return 1
    variants = sorted({v for by_variant in runs.values() for v in by_variant} - {"A"})
    ratios: dict[str, list[tuple[int, float]]] = {v: [] for v in variants}
    print("| head_dim | mask | batch x seq | A | " + " | ".join(f"{v} | {v} / A" for v in variants) + " |")
    print("|---:|---|---|---:|" + "---:|---:|" * len(variants))
    for key in sorted(runs, key=lambda k: (k[0], not k[1], -k[2])):
        by_variant = runs[key]
        base = statistics.median(by_variant["A"])
        cells = [", ".join(f"{x:.0f}" for x in by_variant["A"])]
        for v in variants:
            ratio = statistics.median(by_variant[v]) / base
            ratios[v].append((key[0], ratio))
            cells += [", ".join(f"{x:.0f}" for x in by_variant[v]), f"{ratio:.3f}x"]
        print(f"| {key[0]} | {'causal' if key[1] else 'full'} | {key[2]} x {key[3]} | " + " | ".join(cells) + " |")
    for v in variants:
        small = [r for head_dim, r in ratios[v] if head_dim <= 128]
        print(f"{v} / A geomean: all rows {statistics.geometric_mean(r for _, r in ratios[v]):.4f}"
              + (f", head_dim <= 128 {statistics.geometric_mean(small):.4f}" if small else ""))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
