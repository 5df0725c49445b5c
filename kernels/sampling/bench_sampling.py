"""Benchmark cases for token sampling (driven by the lead's benchmark runner)."""

from __future__ import annotations

import torch

from mllm_kernel.kernels.sampling.sampling import (
    greedy_sample,
    min_p_sample_from_uniforms,
    top_k_top_p_sample_from_uniforms,
)

_SHAPES = {
    "cpu": ((1, 32000), (8, 128256)),
    "cuda": ((1, 128256), (64, 128256), (256, 32000), (1024, 151936)),
}
_DTYPES = (torch.float32, torch.bfloat16)
TOP_K, TOP_P, MIN_P = 50, 0.9, 0.05


def _eager_top_k_top_p(logits, uniforms, k: int, p: float):
    # The usual sort-based formulation: sort, mask past k and past the top-p prefix, inverse CDF.
    probs = torch.softmax(logits.float(), dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(sorted_p.shape[-1], device=logits.device)
    sorted_p = sorted_p.masked_fill(ranks >= k, 0.0)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token
    sorted_p = sorted_p.masked_fill(before >= p * sorted_p.sum(-1, keepdim=True), 0.0)
    cdf = sorted_p.cumsum(-1)
    pos = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1), right=True)
    pos = pos.clamp_max(cdf.shape[-1] - 1)
    return order.gather(-1, pos).squeeze(-1)


def _eager_min_p(probs, uniforms, min_p: float):
    p = probs.float()
    kept = p.masked_fill(p < min_p * p.amax(-1, keepdim=True), 0.0)
    cdf = kept.cumsum(-1)
    pos = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1), right=True)
    return pos.clamp_max(cdf.shape[-1] - 1).squeeze(-1)


def benchmark_cases(device: str) -> list[dict]:
    cases = []
    for batch, vocab in _SHAPES[device]:
        for dtype in _DTYPES:
            g = torch.Generator().manual_seed(0)
            logits = (torch.randn(batch, vocab, generator=g) * 3).to(dtype=dtype, device=device)
            probs = torch.softmax(logits.float(), -1).to(dtype)
            u = torch.rand(batch, generator=g).to(device)
            nbytes = batch * vocab * logits.element_size() + batch * 8
            shape, name = f"{batch}x{vocab}", str(dtype).removeprefix("torch.")
            cases.append({
                "op": "greedy_sample", "shape": shape, "dtype": name, "bytes": nbytes,
                "ours": lambda x=logits: greedy_sample(x),
                "eager": lambda x=logits: torch.argmax(x, dim=-1),
            })
            cases.append({
                "op": "top_k_top_p_sample", "shape": shape, "dtype": name, "bytes": nbytes + batch * 4,
                "ours": lambda x=logits, u=u: top_k_top_p_sample_from_uniforms(x, u, TOP_K, TOP_P),
                "eager": lambda x=logits, u=u: _eager_top_k_top_p(x, u, TOP_K, TOP_P),
                # Same distribution, different token for the same uniform (sorted vs index order).
                "check": False,
            })
            cases.append({
                "op": "min_p_sample", "shape": shape, "dtype": name, "bytes": nbytes + batch * 4,
                "ours": lambda p=probs, u=u: min_p_sample_from_uniforms(p, u, MIN_P),
                "eager": lambda p=probs, u=u: _eager_min_p(p, u, MIN_P),
            })
    return cases
