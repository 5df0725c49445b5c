"""One prefill-attention call inside a CUDA profiler window, for ncu.

    ncu --set full --profile-from-start off -o ours_full \\
        python3 benchmarks/tuning/profile_prefill.py ours 128 full 2x16384
    ncu -i ours_full.ncu-rep --page source --csv --print-source sass > ours_full.csv
    python3 benchmarks/tuning/ncu_sass.py ours_full.csv

IMPL is `ours` (this checkout's prefill_attention) or a FlashInfer backend (`fa2`, `fa3`: its
BatchPrefillWithRaggedKVCacheWrapper, planned before the window). Shapes as in
bench_prefill_attention.py: bf16, 32 query / 8 KV heads, every request `seq` tokens. Three
warm-up calls run first (JIT builds included), so the window holds only the timed call.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_prefill_attention import DTYPE, H, KH, make_inputs  # noqa: E402 (also puts the checkout first)


def main(impl: str, head_dim: int, mask: str, shape: str) -> None:
    batch, seq = (int(x) for x in shape.split("x"))
    causal = {"causal": True, "full": False}[mask]
    q, k, v, cu = make_inputs(batch, seq, head_dim)
    out = torch.empty_like(q)
    if impl == "ours":
        from mllm_kernel.kernels.prefill_attention import prefill_attention

        def call():
            prefill_attention(q, k, v, cu, cu, causal=causal, out=out)
    else:
        from flashinfer.prefill import BatchPrefillWithRaggedKVCacheWrapper

        workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        wrapper = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=impl)
        wrapper.plan(cu, cu, H, KH, head_dim, causal=causal, q_data_type=DTYPE)

        def call():
            wrapper.run(q, k, v, out=out)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
