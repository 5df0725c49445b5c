"""A/B timing of the top-p kernels for whichever mllm_kernel is first on sys.path (a checkout or a
copy with another sampling.cuh; PYTHONPATH picks it), FlashInfer columns with --flashinfer:

    PYTHONPATH=/tmp/before python3 benchmarks/tuning/ab_sampling.py before
    PYTHONPATH=. python3 benchmarks/tuning/ab_sampling.py after --flashinfer

One line per dtype x batch at vocab 128256: median µs of CUDA-graph replays (gpu_timing), over
enough input sets that a replay reads >= 4x L2. bench_sampling.py measures the same calls with
correctness checks and more peers; this is the quick loop for comparing kernel variants."""
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpu_timing import time_graph  # noqa: E402
import mllm_kernel as mk  # noqa: E402
label, fi = sys.argv[1], "--flashinfer" in sys.argv
if fi:
    import flashinfer.sampling as fis
l2 = torch.cuda.get_device_properties(0).L2_cache_size
for dtype in (torch.float32, torch.bfloat16):
    for batch in (1, 8, 64, 256):
        V = 128256
        nsets = max(1, min(32, math.ceil(4 * l2 / (batch * V * dtype.itemsize))))
        g = torch.Generator(device="cuda").manual_seed(batch)
        X = [(torch.randn(batch, V, device="cuda", generator=g) * 3).to(dtype) for _ in range(nsets)]
        P = [torch.softmax(x.float(), -1).to(dtype) for x in X]
        u = torch.rand(batch, device="cuda", generator=g)
        k0 = torch.zeros(batch, dtype=torch.int64, device="cuda"); k50 = torch.full((batch,), 50, dtype=torch.int64, device="cuda")
        p = torch.full((batch,), 0.9, device="cuda")
        row = {}
        row["top_p"] = time_graph([lambda x=x: mk.top_k_top_p_sample_from_uniforms(x, u, k0, p) for x in X], 15)[0]
        row["top_k_top_p"] = time_graph([lambda x=x: mk.top_k_top_p_sample_from_uniforms(x, u, k50, p) for x in X], 15)[0]
        row["top_p_renorm"] = time_graph([lambda q=q: mk.top_p_renorm_probs(q, p) for q in P], 15)[0]
        if fi:
            row["fi softmax+top_p"] = time_graph([lambda x=x: fis.top_p_sampling_from_probs(fis.softmax(x, temperature=0.7), 0.9) for x in X], 15)[0]
            row["fi top_p_renorm"] = time_graph([lambda q=q: fis.top_p_renorm_probs(q, 0.9) for q in P], 15)[0]
        print(label, str(dtype)[6:], f"{batch}x{V}", "  ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
