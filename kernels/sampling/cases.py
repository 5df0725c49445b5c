"""Token sampling: float64 references, report checks and benchmark cases."""

from __future__ import annotations

import math

import torch

from mllm_kernel.kernels.checks import FLOATS, Checks, dtype_name
from mllm_kernel.kernels.sampling import (
    greedy_sample,
    min_p_sample_from_uniforms,
    top_k_mask_logits,
    top_k_renorm_probs,
    top_k_top_p_sample_from_uniforms,
    top_p_renorm_probs,
)


def ref_pick(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """First index, in index order, whose running kept weight exceeds u * total (the kernels' rule)."""
    cdf = weights.cumsum(-1)
    target = (u.double() * cdf[:, -1]).unsqueeze(-1)
    return (cdf <= target).sum(-1).clamp_max(weights.shape[-1] - 1)


def away_from_boundaries(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Move each uniform off CDF boundaries (float32 vs float64 sums may round either way
    there), so the sampled ids must match exactly."""
    cdf = weights.cumsum(-1) / weights.sum(-1, keepdim=True)
    u = u.double().clone()
    for row in range(u.shape[0]):
        for _ in range(100):
            if (cdf[row] - u[row]).abs().min() > 1e-4:
                break
            u[row] = (u[row] + 3.7e-3) % 1.0
    return u.float()


def ref_top_k_top_p_weights(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The kept, unnormalized float64 probabilities of top-k then top-p (ties kept)."""
    x = logits.double()
    probs = torch.softmax(x, -1)
    kth = x.topk(top_k, -1).values[:, -1:]
    probs = probs.masked_fill(x < kth, 0.0)  # ties at the k-th value stay
    total = probs.sum(-1, keepdim=True)
    # A token stays when the mass of strictly more probable tokens is < top_p of the top-k mass.
    before = torch.stack([(probs[r].unsqueeze(0) * (probs[r].unsqueeze(0) > probs[r].unsqueeze(1))).sum(-1)
                          for r in range(probs.shape[0])])
    return probs.masked_fill(before >= top_p * total, 0.0)


def ref_min_p_weights(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    p = probs.double()
    return p.masked_fill(p < min_p * p.amax(-1, keepdim=True), 0.0)


def ref_filter(op: str, x: torch.Tensor, params) -> torch.Tensor:
    """float64 reference of top_k_mask_logits / top_k_renorm_probs / top_p_renorm_probs over the
    rows of x (params: one top_k or top_p per row); ties at a threshold are kept."""
    rows = []
    for r, param in enumerate(params):
        v = x[r].double().cpu()
        thr = -float("inf")
        if op != "top_p_renorm_probs":
            if 0 < param < v.numel():
                thr = v.topk(int(param)).values[-1].item()
        elif param < 1.0:
            vals = v.sort(descending=True).values
            cum = vals.clamp_min(0).cumsum(0)
            thr = vals[int((cum >= param * cum[-1]).nonzero()[0])].item()
        if op == "top_k_mask_logits":
            rows.append(torch.where(v >= thr, v, torch.full_like(v, -float("inf"))))
        else:
            kept = torch.where(v >= thr, v, torch.zeros_like(v))
            total = kept.clamp_min(0).sum()
            rows.append(kept / total if total > 0 else torch.zeros_like(v))
    return torch.stack(rows) if rows else x.double().cpu()


def check(c: Checks) -> None:
    for dtype in FLOATS:
        n = dtype_name(dtype)

        def sampling():
            logits = c.randn(6, 2000, dtype=dtype, scale=3.0)
            c.equal(f"greedy_sample {n}", greedy_sample(logits), logits.double().argmax(-1))
            u = torch.rand(6, generator=c.gen)
            weights = ref_top_k_top_p_weights(logits.cpu(), 50, 0.9)
            uk = away_from_boundaries(weights, u)
            got = top_k_top_p_sample_from_uniforms(logits, uk.to(c.device), 50, 0.9)
            c.equal(f"top_k_top_p_sample {n}", got, ref_pick(weights, uk))
            probs = torch.softmax(logits.double(), -1).to(dtype)
            kept = ref_min_p_weights(probs.cpu(), 0.05)
            um = away_from_boundaries(kept, u)
            c.equal(f"min_p_sample {n}", min_p_sample_from_uniforms(probs, um.to(c.device), 0.05), ref_pick(kept, um))

        c.run(f"sampling {n}", sampling)

        def filters():
            logits = c.randn(6, 2000, dtype=dtype, scale=3.0)
            c.equal(f"top_k_mask_logits {n}", top_k_mask_logits(logits, 50),
                    ref_filter("top_k_mask_logits", logits, [50] * 6).to(dtype))
            probs = torch.softmax(logits.double(), -1).to(dtype)
            c.close(f"top_k_renorm_probs {n}", [top_k_renorm_probs(probs, 50)],
                    [ref_filter("top_k_renorm_probs", probs, [50] * 6)])
            c.close(f"top_p_renorm_probs {n}", [top_p_renorm_probs(probs, 0.9)],
                    [ref_filter("top_p_renorm_probs", probs, [0.9] * 6)])

        c.run(f"filters {n}", filters)


# ----------------------------------------------------------------------------- benchmarks

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


def eager_top_k_mask(logits, k: int):
    """torch: the k-th largest by topk, then masked_fill."""
    kth = logits.topk(k, -1).values[:, -1:]
    return logits.masked_fill(logits < kth, -math.inf)


def eager_top_p_renorm(probs, p: float):
    """torch: sort, mask past the top-p prefix, renormalize, scatter back."""
    vals, idx = probs.sort(-1, descending=True)
    before = vals.cumsum(-1) - vals
    vals = vals.masked_fill(before >= p * vals.sum(-1, keepdim=True), 0.0)
    return torch.zeros_like(probs).scatter_(-1, idx, vals / vals.sum(-1, keepdim=True))


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
            out_bytes = batch * vocab * logits.element_size()
            cases.append({
                "op": "top_k_mask_logits", "shape": shape, "dtype": name, "bytes": 2 * out_bytes,
                "ours": lambda x=logits: top_k_mask_logits(x, TOP_K),
                "eager": lambda x=logits: eager_top_k_mask(x, TOP_K),
            })
            cases.append({
                "op": "top_p_renorm_probs", "shape": shape, "dtype": name, "bytes": 2 * out_bytes,
                "ours": lambda p=probs: top_p_renorm_probs(p, TOP_P),
                "eager": lambda p=probs: eager_top_p_renorm(p, TOP_P),
                # Ties at the threshold: ours keeps them all, the sort keeps an arbitrary prefix.
                "check": False,
            })
    return cases
