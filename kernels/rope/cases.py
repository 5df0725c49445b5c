"""apply_rope: float64 reference, report checks and benchmark cases."""

from __future__ import annotations

import torch

from mllm_kernel.kernels.checks import FLOATS, Checks, bench_case, dtype_name
from mllm_kernel.kernels.rope import apply_rope


def ref_rope(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor, rot: int, is_neox: bool) -> torch.Tensor:
    """x [tokens, heads, head_dim] rotated in float64 (CPU tensors); the first rot dims rotate."""
    x = x.double().clone()
    cos = cache[positions, : rot // 2].double().unsqueeze(1)
    sin = cache[positions, rot // 2 :].double().unsqueeze(1)
    idx1 = torch.arange(rot // 2) if is_neox else torch.arange(0, rot, 2)
    idx2 = idx1 + rot // 2 if is_neox else idx1 + 1
    x1, x2 = x[..., idx1].clone(), x[..., idx2].clone()
    x[..., idx1] = x1 * cos - x2 * sin
    x[..., idx2] = x2 * cos + x1 * sin
    return x


def check(c: Checks) -> None:
    for dtype in FLOATS:
        n = dtype_name(dtype)

        def rope():
            max_pos, head_dim = 512, 64
            for rot, is_neox in ((64, True), (64, False), (32, True)):
                inv = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
                freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
                cache = torch.cat([freqs.cos(), freqs.sin()], -1).float().to(c.device)
                q, k = c.randn(7, 4, head_dim, dtype=dtype), c.randn(7, 2, head_dim, dtype=dtype)
                pos = torch.randint(0, max_pos, (7,), generator=c.gen).to(c.device)
                want = [ref_rope(t.cpu(), pos.cpu(), cache.cpu(), rot, is_neox) for t in (q, k)]
                apply_rope(q, k, pos, cache, is_neox)
                c.close(f"apply_rope[{'neox' if is_neox else 'gptj'} rot={rot}] {n}", [q, k], want)

        c.run(f"apply_rope {n}", rope)


# ----------------------------------------------------------------------------- benchmarks


def _cache(max_pos: int, rot_dim: int, device: str) -> torch.Tensor:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device) / rot_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32, device=device), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _eager_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int, is_neox: bool) -> torch.Tensor:
    """Out-of-place torch RoPE in float32 (compile-friendly); cos/sin: [tokens, 1, rot/2]."""
    xf = x.float()
    if is_neox:
        x1, x2 = xf[..., : rot // 2], xf[..., rot // 2 : rot]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = xf[..., 0:rot:2], xf[..., 1:rot:2]
        rotated = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    return torch.cat([rotated, xf[..., rot:]], dim=-1).to(x.dtype)


def _case(device, tokens, heads, kv_heads, head_dim, rot_dim, dtype, is_neox):
    q = torch.randn(tokens, heads, head_dim, device=device, dtype=dtype)
    k = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=dtype)
    max_pos = max(tokens, 4096)
    cache = _cache(max_pos, rot_dim, device)
    positions = torch.randperm(max_pos, device=device)[:tokens]  # distinct: every cache row read once

    def ours():
        apply_rope(q, k, positions, cache, is_neox)  # in place; repeated rotation is fine for timing

    def eager():
        cos = cache[positions, : rot_dim // 2].unsqueeze(1)
        sin = cache[positions, rot_dim // 2 :].unsqueeze(1)
        return _eager_rope(q, cos, sin, rot_dim, is_neox), _eager_rope(k, cos, sin, rot_dim, is_neox)

    elem = q.element_size()
    rotated = tokens * (heads + kv_heads) * rot_dim * elem  # only the rotated dims move
    return bench_case("apply_rope" + ("" if is_neox else "[gptj]"),
                      f"T={tokens} H={heads} KH={kv_heads} D={head_dim} rot={rot_dim}", dtype, ours, eager,
                      2 * rotated + tokens * 8 + tokens * rot_dim * 4)


def benchmark_cases(device: str) -> list[dict]:
    if device == "cuda":
        token_counts = (1, 256, 4096, 32768)
    else:
        token_counts = (1, 64, 256)
    cases = []
    for tokens in token_counts:
        for dtype in (torch.bfloat16, torch.float32):
            cases.append(_case(device, tokens, 32, 8, 128, 128, dtype, True))
    large = token_counts[-1]
    cases.append(_case(device, large, 32, 8, 128, 128, torch.bfloat16, False))  # GPT-J layout
    cases.append(_case(device, large, 32, 8, 128, 64, torch.bfloat16, True))  # partial rotary
    cases.append(_case(device, large, 28, 4, 128, 128, torch.float16, True))
    return cases
