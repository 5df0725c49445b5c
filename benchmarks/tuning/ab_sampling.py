"""A/B timing of the sampling kernels for whichever mllm_kernel is first on sys.path (a checkout or
a copy with another sampling.cuh; PYTHONPATH picks it), FlashInfer columns with --flashinfer:

    PYTHONPATH=/tmp/before python3 benchmarks/tuning/ab_sampling.py A
    PYTHONPATH=. python3 benchmarks/tuning/ab_sampling.py N [--batches 256,512] [--ops top_k_top_p]
    python3 benchmarks/tuning/ab_sampling.py --compare LOG   # the lines of both, A / N per case

One line per op x dtype x shape: `LABEL OP DTYPE BxV MEDIAN_US TOKEN_SUM` (median µs of CUDA-graph
replays, gpu_timing, over enough input sets that a replay reads >= 4x L2; the sum of the sampled
tokens of the first set, which must be the same for every variant: the token does not depend on
the plan). Ops: top_k_top_p (k 50, p 0.9), top_p (k 0), top_p_renorm (p 0.9, probs); with
--flashinfer also FlashInfer's softmax + top-p sampler and top_p_renorm_probs (token sum -1).
bench_sampling.py measures the same calls with correctness checks and more peers; this is the
quick loop for comparing kernel variants (run them alternately: A N N A)."""
import argparse
import collections
import math
import statistics
import sys
from pathlib import Path


def compare(path: str) -> None:
    times, sums = collections.defaultdict(lambda: collections.defaultdict(list)), collections.defaultdict(set)
    for line in open(path):
        f = line.split()
        if len(f) == 6:
            times[tuple(f[1:4])][f[0]].append(float(f[4]))
            sums[tuple(f[1:4])].add(f[5])
    for case, by in times.items():
        if len(by) == 2:
            (a, ta), (b, tb) = sorted(by.items())
            ma, mb = statistics.median(ta), statistics.median(tb)
            same = "" if sums[case] == {"-1"} else "same tokens" if len(sums[case]) == 1 else "TOKENS DIFFER"
            print(f"{' '.join(case):<36} {a} {ma:8.2f}  {b} {mb:8.2f}  {a}/{b} {ma / mb:.3f}  {same}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("label", nargs="?")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--vocabs", default="128256")
    ap.add_argument("--ops", default="top_k_top_p,top_p,top_p_renorm")
    ap.add_argument("--flashinfer", action="store_true")
    ap.add_argument("--compare", metavar="LOG")
    args = ap.parse_args()
    if args.compare:
        return compare(args.compare)
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gpu_timing import time_graph
    import mllm_kernel as mk

    if args.flashinfer:
        import flashinfer.sampling as fis
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    ops = args.ops.split(",")
    for dtype in (torch.float32, torch.bfloat16):
        for vocab in map(int, args.vocabs.split(",")):
            for batch in map(int, args.batches.split(",")):
                nsets = max(1, min(32, math.ceil(4 * l2 / (batch * vocab * dtype.itemsize))))
                g = torch.Generator(device="cuda").manual_seed(batch + vocab)
                X = [(torch.randn(batch, vocab, device="cuda", generator=g) * 3).to(dtype) for _ in range(nsets)]
                P = [torch.softmax(x.float(), -1).to(dtype) for x in X] if "top_p_renorm" in ops else []
                u = torch.rand(batch, device="cuda", generator=g)
                k0 = torch.zeros(batch, dtype=torch.int64, device="cuda")
                k50 = torch.full((batch,), 50, dtype=torch.int64, device="cuda")
                p = torch.full((batch,), 0.9, device="cuda")
                calls = {
                    "top_k_top_p": (X, lambda x: mk.top_k_top_p_sample_from_uniforms(x, u, k50, p)),
                    "top_p": (X, lambda x: mk.top_k_top_p_sample_from_uniforms(x, u, k0, p)),
                    "top_p_renorm": (P, lambda q: mk.top_p_renorm_probs(q, p)),
                }
                if args.flashinfer:
                    calls["fi_top_p"] = (X, lambda x: fis.top_p_sampling_from_probs(fis.softmax(x), 0.9))
                    calls["fi_top_p_renorm"] = (P, lambda q: fis.top_p_renorm_probs(q, 0.9))
                for op, (inputs, call) in calls.items():
                    if op.removeprefix("fi_") not in ops:
                        continue
                    us = time_graph([lambda x=x: call(x) for x in inputs], 15)[0]
                    token_sum = int(call(inputs[0]).sum()) if op in ("top_k_top_p", "top_p") else -1
                    print(args.label, op, str(dtype).removeprefix("torch."), f"{batch}x{vocab}", f"{us:.2f}", token_sum,
                          flush=True)
                del X, P


if __name__ == "__main__":
    main()
