"""apply_penalties: float64 references, report checks and benchmark cases."""

from __future__ import annotations

import torch

from mllm_kernel.kernels.checks import FLOATS, Checks, dtype_name
from mllm_kernel.kernels.penalties import apply_penalties


def ref_counts_from_ids(token_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """int64 [batch, vocab]: occurrences of each token in its row of token_ids (ids < 0 ignored)."""
    counts = torch.zeros(token_ids.shape[0], vocab, dtype=torch.int64)
    for b, row in enumerate(token_ids.cpu().tolist()):
        for t in row:
            if t >= 0:
                counts[b, t] += 1
    return counts


def _per_row(value, batch: int) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.double().cpu().unsqueeze(-1)
    return torch.full((batch, 1), float(value), dtype=torch.float64)


def ref_penalties(logits: torch.Tensor, counts: torch.Tensor, repetition=1.0, frequency=0.0,
                  presence=0.0) -> torch.Tensor:
    """float64 logits after the penalties for counts [batch, vocab] (int or bool); rows keep their values
    where the count is 0."""
    x = logits.double().cpu()
    c = counts.cpu().to(torch.float64)
    batch = x.shape[0]
    rep, freq, pres = (_per_row(v, batch) for v in (repetition, frequency, presence))
    seen = c > 0
    penalized = torch.where(x > 0, x / rep, x * rep) - (freq * c + pres)
    return torch.where(seen, penalized, x)


def check(c: Checks) -> None:
    for dtype in FLOATS:
        n = dtype_name(dtype)

        def from_ids():
            logits = c.randn(3, 1000, dtype=dtype, scale=3.0)
            ids = (c.randn(3, 37).abs() * 300).long().clamp_max(999) - 5  # repeats, and a few < 0 (padding)
            want = ref_penalties(logits, ref_counts_from_ids(ids, 1000), 1.3, 0.2, 0.5)
            c.close(f"apply_penalties ids {n}", [apply_penalties(logits.clone(), ids, None, 1.3, 0.2, 0.5)], [want])

        def from_counts():
            logits = c.randn(3, 1000, dtype=dtype, scale=3.0)
            counts = (c.randn(3, 1000).abs() * 1.5).int()
            want = ref_penalties(logits, counts, 0.8, -0.1, 0.25)
            c.close(f"apply_penalties counts {n}", [apply_penalties(logits.clone(), None, counts, 0.8, -0.1, 0.25)],
                    [want])

        c.run(f"apply_penalties ids {n}", from_ids)
        c.run(f"apply_penalties counts {n}", from_counts)


# ----------------------------------------------------------------------------- benchmarks

_SHAPES = {  # (batch, vocab, ids per row)
    "cpu": ((1, 32000, 512), (16, 128256, 2048)),
    "cuda": ((1, 128256, 512), (1, 151936, 8192), (64, 128256, 2048), (256, 151936, 4096)),
}
REPETITION, FREQUENCY, PRESENCE = 1.1, 0.3, 0.4


def eager_penalties_from_ids(logits: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """torch, as engines do it without a kernel: counts by scatter_add (padding -> an extra column),
    then masked arithmetic over the whole row, written back in place."""
    safe = torch.where(ids < 0, vocab, ids)
    counts = torch.zeros(logits.shape[0], vocab + 1, dtype=torch.int32, device=logits.device)
    counts.scatter_add_(1, safe, torch.ones_like(safe, dtype=torch.int32))
    counts = counts[:, :vocab]
    seen = counts > 0
    x = logits.float()
    x = torch.where(seen, torch.where(x > 0, x / REPETITION, x * REPETITION), x)
    x = x - FREQUENCY * counts - PRESENCE * seen
    return logits.copy_(x)


def benchmark_cases(device: str) -> list[dict]:
    cases = []
    for batch, vocab, num_ids in _SHAPES[device]:
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(0)
            logits = (torch.randn(batch, vocab, generator=g) * 3).to(dtype=dtype, device=device)
            ids = torch.randint(0, vocab, (batch, num_ids), generator=g).to(device)
            mine, theirs = logits.clone(), logits.clone()
            cases.append({
                "op": "apply_penalties", "shape": f"{batch}x{vocab} ids {num_ids}", "dtype": dtype_name(dtype),
                # Bytes that must move: the ids, and a read and a write of each penalized logit.
                "bytes": ids.numel() * ids.element_size() + 2 * ids.numel() * logits.element_size(),
                "ours": lambda x=mine, i=ids: apply_penalties(x, i, None, REPETITION, FREQUENCY, PRESENCE, False),
                "eager": lambda x=theirs, i=ids, v=vocab: eager_penalties_from_ids(x, i, v),
                # In place: each call penalizes again, so the two copies drift apart (tests check values).
                "check": False,
            })
    return cases
