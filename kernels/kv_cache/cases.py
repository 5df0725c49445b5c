"""store_kv_cache: reference, report checks and benchmark cases."""

from __future__ import annotations

import torch

from mllm_kernel.kernels.checks import FLOATS, Checks, bench_case, dtype_name
from mllm_kernel.kernels.kv_cache import store_kv_cache


def ref_store(src: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache (CPU) after storing src[t] at flat slot slots[t]; slot -1 skips the token."""
    out = cache.clone().view(-1, *cache.shape[2:])
    keep = slots >= 0
    out[slots[keep]] = src[keep]
    return out.view(cache.shape)


def check(c: Checks) -> None:
    for dtype in FLOATS:
        n = dtype_name(dtype)

        def kv():
            tokens, blocks, block, heads, dim = 9, 4, 8, 2, 32
            k, v = c.randn(tokens, heads, dim, dtype=dtype), c.randn(tokens, heads, dim, dtype=dtype)
            slots = torch.randperm(blocks * block, generator=c.gen)[:tokens]
            slots[3] = -1  # padding token: skipped
            k_cache = torch.zeros(blocks, block, heads, dim, dtype=dtype, device=c.device)
            v_cache = torch.zeros_like(k_cache)
            want = [ref_store(t.cpu(), cache.cpu(), slots) for t, cache in ((k, k_cache), (v, v_cache))]
            store_kv_cache(k, v, k_cache, v_cache, slots.to(c.device))
            c.equal(f"store_kv_cache k {n}", k_cache, want[0])
            c.equal(f"store_kv_cache v {n}", v_cache, want[1])

        c.run(f"store_kv_cache {n}", kv)


# ----------------------------------------------------------------------------- benchmarks


def _case(device, tokens, kv_heads, head_dim, block_size, dtype, fused):
    num_blocks = (tokens + block_size - 1) // block_size * 2  # half the cache gets written
    if fused:  # k, v as token-strided slices of a fused qkv tensor (heads = 4 * kv_heads)
        row = kv_heads * head_dim
        qkv = torch.randn(tokens, 6 * row, device=device, dtype=dtype)
        k = qkv[:, 4 * row : 5 * row].view(tokens, kv_heads, head_dim)
        v = qkv[:, 5 * row :].view(tokens, kv_heads, head_dim)
    else:
        k = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=dtype)
        v = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=dtype)
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim, device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(num_blocks * block_size, device=device)[:tokens]

    def ours():
        store_kv_cache(k, v, k_cache, v_cache, slots)

    def eager():
        k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slots, k)
        v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slots, v)

    row_bytes = kv_heads * head_dim * k.element_size()
    return bench_case("store_kv_cache" + ("[fused_qkv]" if fused else ""),
                      f"T={tokens} KH={kv_heads} D={head_dim} block={block_size}", dtype, ours, eager,
                      4 * tokens * row_bytes + tokens * 8)  # read k, v; write 2 cache rows; slots


def benchmark_cases(device: str) -> list[dict]:
    token_counts = (1, 256, 4096, 32768) if device == "cuda" else (1, 64, 1024)
    cases = []
    for tokens in token_counts:
        cases.append(_case(device, tokens, 8, 128, 16, torch.bfloat16, False))
    large = token_counts[-1]
    cases.append(_case(device, large, 8, 128, 16, torch.float32, False))
    cases.append(_case(device, large, 8, 128, 16, torch.bfloat16, True))
    cases.append(_case(device, large, 2, 64, 32, torch.float16, False))  # small rows
    return cases
