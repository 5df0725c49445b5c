"""CPU sampling and softmax ops with a thread count against torch with as many threads.

    python benchmarks/bench_cpu_threads.py [--threads 1 2] [--shape 8x128256] [--iters 15] [--ops min_p_sample]

For each thread count N: ours with num_threads=N against torch eager (the baselines of
kernels/sampling/cases.py and kernels/softmax/cases.py) after torch.set_num_threads(N). Median
of --iters samples (warm-up excluded, each sample a loop of calls lasting >= 2 ms: bench_ops.py's
CpuTimer). Ratios > 1: ours is faster.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ops import CpuTimer  # noqa: E402

import mllm_kernel as mk  # noqa: E402
from mllm_kernel.kernels.sampling import cases  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shape", nargs="+", default=["8x32000", "8x128256"])
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--ops", nargs="+", help="only these ops (default: all)")
    args = parser.parse_args()
    timer = CpuTimer(args.iters, target_ns=2_000_000)
    k, p, min_p = cases.TOP_K, cases.TOP_P, cases.MIN_P
    print(f"CPU: {os.cpu_count()} cores, torch {torch.__version__}")
    print("| op | shape | dtype | threads | ours µs | torch µs | torch / ours |")
    print("|---|---|---|---:|---:|---:|---:|")
    for shape in args.shape:
        batch, vocab = (int(v) for v in shape.split("x"))
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(0)
            logits = (torch.randn(batch, vocab, generator=g) * 3).to(dtype)
            probs = torch.softmax(logits.float(), -1).to(dtype)
            u = torch.rand(batch, generator=g)
            for n in args.threads:
                torch.set_num_threads(n)
                rows = {
                    "greedy_sample": (lambda: mk.greedy_sample(logits, num_threads=n),
                                      lambda: torch.argmax(logits, dim=-1)),
                    "top_k_top_p_sample": (
                        lambda: mk.top_k_top_p_sample_from_uniforms(logits, u, k, p, num_threads=n),
                        lambda: cases._eager_top_k_top_p(logits, u, k, p)),
                    "min_p_sample": (lambda: mk.min_p_sample_from_uniforms(probs, u, min_p, num_threads=n),
                                     lambda: cases._eager_min_p(probs, u, min_p)),
                    "top_k_mask_logits": (lambda: mk.top_k_mask_logits(logits, k, num_threads=n),
                                          lambda: cases.eager_top_k_mask(logits, k)),
                    "top_p_renorm_probs": (lambda: mk.top_p_renorm_probs(probs, p, num_threads=n),
                                           lambda: cases.eager_top_p_renorm(probs, p)),
                    # softmax's baselines as in kernels/softmax/cases.py
                    "softmax": (lambda: mk.softmax(logits, 0.7, num_threads=n),
                                lambda: torch.softmax(logits.float() / 0.7, dim=-1).to(dtype)),
                    "log_softmax": (lambda: mk.log_softmax(logits, num_threads=n),
                                    lambda: torch.log_softmax(logits.float(), dim=-1).to(dtype)),
                }  # fmt: skip
                for op, (ours, eager) in rows.items():
                    if args.ops and op not in args.ops:
                        continue
                    t_ours, _ = timer(ours)
                    t_eager, _ = timer(eager)
                    name = str(dtype).removeprefix("torch.")
                    print(f"| {op} | {shape} | {name} | {n} | {t_ours:.1f} | {t_eager:.1f} | {t_eager / t_ours:.2f}x |",
                          flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
