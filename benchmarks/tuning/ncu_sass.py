"""Summarize ncu's per-instruction (SASS) page of one kernel: where its warps stall.

    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > report.csv
    python3 benchmarks/tuning/ncu_sass.py report.csv [--top 30] [--kernel SUBSTRING]

The CSV needs the source counters of `--set full` (warp-stall sampling). It may hold several
kernels; the one with the most samples is taken unless --kernel picks another. Printed:
- the sampled stall reasons over the whole kernel, and by opcode (share of samples, executions);
- instructions grouped by their execution count: in a persistent kernel one count marks the
  tile loop (consumer warps x tiles), another the per-unit code, another the producer's loop,
  which tells how much of the time each level of the loop nest takes;
- the most sampled instructions with their three main stall reasons (% of that row's samples).
"""

from __future__ import annotations

import argparse
import collections
import csv
import io


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_kernels(path: str) -> dict[str, list[dict]]:
    """{kernel name: rows}: the CSV repeats a `"Kernel Name","..."` line before each kernel's table."""
    kernels: dict[str, list[str]] = {}
    name = None
    for line in open(path):
        if line.startswith('"Kernel Name"'):
            name = line.split('","', 1)[1].rstrip().rstrip(",").rstrip('"')
            kernels[name] = []
        elif name is not None:
            kernels[name].append(line)
    return {n: list(csv.DictReader(io.StringIO("".join(lines)))) for n, lines in kernels.items()}


def opcode(source: str) -> str:
    words = source.split()
    if words and words[0].startswith("@"):  # predicate
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--kernel", help="a substring of the kernel's name (default: the most sampled)")
    args = parser.parse_args()
    kernels = read_kernels(args.csv)
    if args.kernel:
        kernels = {n: r for n, r in kernels.items() if args.kernel in n}
    name, rows = max(kernels.items(), key=lambda item: sum(number(r.get("# Samples", "0")) for r in item[1]))
    stalls = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    samples = sum(number(r["# Samples"]) for r in rows) or 1.0
    executed = sum(number(r["Instructions Executed"]) for r in rows)
    print(f"{name[:160]}\n{len(rows)} instructions, {samples:.0f} samples, {executed / 1e6:.1f} M warp instructions executed")

    by_reason = collections.Counter()
    for r in rows:
        for c in stalls:
            by_reason[c[6:]] += number(r[c])
    print("stalls: " + ", ".join(f"{k} {v / samples:.1%}" for k, v in by_reason.most_common(12)))

    by_op, runs_op = collections.Counter(), collections.Counter()
    for r in rows:
        by_op[opcode(r["Source"])] += number(r["# Samples"])
        runs_op[opcode(r["Source"])] += number(r["Instructions Executed"])
    print("by opcode (samples, executed): " + ", ".join(
        f"{k} {v / samples:.1%} {runs_op[k] / 1e6:.1f}M" for k, v in by_op.most_common(16)))

    groups: dict[float, list[dict]] = collections.defaultdict(list)
    for r in rows:
        runs = number(r["Instructions Executed"])
        if runs:
            groups[float(f"{runs:.2g}")].append(r)  # two significant digits: one level of the loop nest
    print("by execution count (each instruction of a group ran about that many times):")
    for runs, members in sorted(groups.items(), key=lambda g: -sum(number(r["# Samples"]) for r in g[1]))[:8]:
        share = sum(number(r["# Samples"]) for r in members) / samples
        print(f"  {runs:>12,.0f}: {len(members):5d} instructions, {share:.1%} of samples")

    print(f"top {args.top} instructions:")
    for r in sorted(rows, key=lambda r: -number(r["# Samples"]))[: args.top]:
        own = number(r["# Samples"]) or 1.0
        reasons = sorted(((number(r[c]), c[6:]) for c in stalls), reverse=True)[:3]
        print(f"  {number(r['# Samples']) / samples:6.2%} x{number(r['Instructions Executed']) / 1e6:7.2f}M  "
              f"{r['Source'][:72]:72s} " + " ".join(f"{n} {v / own:.0%}" for v, n in reasons if v))


if __name__ == "__main__":
    main()
