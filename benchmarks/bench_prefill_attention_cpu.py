"""prefill_attention on the CPU against torch SDPA, both on one thread (one request, 32 / 8
heads, head_dim 128; median of 3 calls after one warm-up call).

    python3 benchmarks/bench_prefill_attention_cpu.py
"""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if (REPO / "mllm_kernel").is_dir() and str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the checkout's mllm_kernel
import time, statistics, torch
import torch.nn.functional as F
from mllm_kernel.kernels.prefill_attention import prefill_attention
torch.set_num_threads(1)
H, KH, D = 32, 8, 128
for dtype in (torch.float32, torch.bfloat16):
    for S, causal in ((1024, True), (1024, False), (2048, True)):
        q = torch.randn(S, H, D, dtype=dtype); k = torch.randn(S, KH, D, dtype=dtype); v = torch.randn_like(k)
        cu = torch.tensor([0, S], dtype=torch.int32)
        q4, k4, v4 = (x.unsqueeze(0).transpose(1, 2) for x in (q, k, v))
        def ours(): return prefill_attention(q, k, v, cu, cu, causal=causal)
        def sdpa(): return F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, enable_gqa=True)
        diff = (ours().float() - sdpa().transpose(1, 2)[0].float()).abs().max().item()
        res = {}
        for name, fn in (("ours", ours), ("sdpa", sdpa)):
            fn(); ts = []
            for _ in range(3):
                t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
            res[name] = statistics.median(ts) * 1e3
        fl = 4 * S * S * D * H / (2 if causal else 1)
        print(f"{str(dtype)[6:]} S={S} {'causal' if causal else 'full'}: ours {res['ours']:.0f} ms ({fl / res['ours'] / 1e6:.1f} GFLOP/s), SDPA {res['sdpa']:.0f} ms, SDPA/ours {res['sdpa'] / res['ours']:.2f}x, max diff {diff:.1e}", flush=True)
