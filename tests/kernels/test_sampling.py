"""Token sampling (kernels/sampling) against a float64 Python reference of the same
inverse-CDF rule, CPU and CUDA."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

try:
    import mllm_kernel  # noqa: F401
except ImportError:  # run as a plain script from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mllm_kernel.kernels.sampling import (
    _modules,
    greedy_sample,
    min_p_sample,
    min_p_sample_from_uniforms,
    top_k_mask_logits,
    top_k_renorm_probs,
    top_k_top_p_sample,
    top_k_top_p_sample_from_uniforms,
    top_p_renorm_probs,
)

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
VOCABS = (1, 3, 17, 127, 1000, 4099)
BOUNDARY = 1e-6  # uniforms / thresholds closer than this to a CDF boundary are ambiguous


def make_logits(batch, vocab, dtype=torch.float32, seed=0, scale=2.0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, vocab, generator=g) * scale).to(dtype=dtype, device=device)


def f32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


# ----------------------------------------------------------------------------- reference


def ref_keep_top_k_top_p(x: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """float64 row x -> boolean kept mask (ties at a threshold kept, like the kernels)."""
    threshold = -float("inf")
    if 0 < k < x.numel():
        threshold = x.topk(k).values[-1].item()
    if p < 1.0:
        kept = x[x >= threshold].sort(descending=True).values
        w = torch.exp(kept - x.max())
        cum = w.cumsum(0)
        j = int((cum >= p * w.sum()).nonzero()[0])
        threshold = kept[j].item()
    return x >= threshold


def ref_inverse_cdf(w: torch.Tensor, u: float) -> tuple[int, float]:
    """First index whose running weight exceeds u * total; and the distance of u * total to
    the nearest CDF boundary, relative to the total (how safe the comparison is)."""
    cdf = w.cumsum(0)
    total = cdf[-1].item()
    target = u * total
    index = int((cdf > target).nonzero()[0]) if (cdf > target).any() else int(w.nonzero()[-1])
    margin = (cdf[w > 0] - target).abs().min().item() / total
    return index, margin


def ref_top_k_top_p(logits, uniforms, top_k, top_p):
    tokens, margins = [], []
    for b in range(logits.shape[0]):
        x = logits[b].double().cpu()
        keep = ref_keep_top_k_top_p(x, int(top_k[b]), float(top_p[b]))
        w = torch.where(keep, torch.exp(x - x.max()), torch.zeros_like(x))
        token, margin = ref_inverse_cdf(w, float(uniforms[b]))
        tokens.append(token)
        margins.append(margin)
    return torch.tensor(tokens), torch.tensor(margins)


def ref_min_p(probs, uniforms, min_p):
    tokens, margins = [], []
    for b in range(probs.shape[0]):
        p = probs[b].double().cpu()
        w = torch.where(p >= float(min_p[b]) * p.max(), p, torch.zeros_like(p))
        token, margin = ref_inverse_cdf(w, float(uniforms[b]))
        tokens.append(token)
        margins.append(margin)
    return torch.tensor(tokens), torch.tensor(margins)


def ref_min_p_unambiguous(probs, uniforms, min_p):
    """ref_min_p, with rows that have a probability within BOUNDARY of their threshold marked
    ambiguous (the kernels round min_p * max(p) to float32)."""
    tokens, margins = ref_min_p(probs, uniforms, min_p)
    p64 = probs.double()
    thr = min_p.double()[:, None] * p64.max(-1, keepdim=True).values
    near = ((p64 - thr).abs() <= BOUNDARY * p64.max(-1, keepdim=True).values).any(-1)
    margins[near & (min_p > 0) & (min_p < 1)] = 0.0
    return tokens, margins


def top_p_between_tokens(x: torch.Tensor, k: int, rank: int) -> float:
    """A float32 top_p halfway between the masses of the first rank and rank + 1 kept tokens
    (descending), so the kept prefix is unambiguous: rank + 1 tokens (plus ties)."""
    x = x.double().cpu()
    keep = ref_keep_top_k_top_p(x, k, 1.0)
    w = torch.exp(x[keep].sort(descending=True).values - x.max())
    cum = (w.cumsum(0) / w.sum()).tolist()
    rank = min(rank, len(cum) - 1)
    low = cum[rank - 1] if rank > 0 else 0.0
    return f32((low + cum[rank]) / 2) if rank + 1 < len(cum) else 1.0


def ref_top_k_top_p_off_boundaries(x, u, k, p, rows):
    """ref_top_k_top_p of the given rows, after moving each row's uniform (u, in place) off CDF
    boundaries where a few tries can, so that every checked row counts."""
    ref, margins = ref_top_k_top_p(x[rows], u[rows], k[rows], p[rows])
    for i, b in enumerate(rows):
        for _ in range(10):
            if margins[i] > BOUNDARY:
                break
            u[b] = (u[b] + 0.3137) % 1.0
            ref[i], margins[i] = (t[0] for t in ref_top_k_top_p(x[b:b + 1], u[b:b + 1], k[b:b + 1], p[b:b + 1]))
    return ref, margins


def safe_uniforms(batch, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, generator=g).to(device)


def assert_tokens_match(tokens, ref_tokens, margins):
    assert tokens.dtype == torch.int64 and tokens.shape == ref_tokens.shape
    safe = margins > BOUNDARY
    assert safe.float().mean() > 0.5, "test inputs land too close to CDF boundaries"
    assert torch.equal(tokens.cpu()[safe], ref_tokens[safe]), (tokens.cpu(), ref_tokens, margins)


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS + (32768,))
def test_greedy_matches_argmax(vocab, dtype):
    x = make_logits(5, vocab, dtype, seed=vocab)
    out = greedy_sample(x)
    assert out.dtype == torch.int64
    assert torch.equal(out, torch.argmax(x, dim=-1))


def test_greedy_ties_and_nan():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, float("nan"), 5.0, float("nan")],
                      [-float("inf")] * 4, [7.0, 7.0, 7.0, 7.0]])
    assert torch.equal(greedy_sample(x), torch.argmax(x, dim=-1))
    for dtype in (torch.float16, torch.bfloat16):
        assert torch.equal(greedy_sample(x.to(dtype)), torch.argmax(x.to(dtype), dim=-1))


def test_greedy_poisoned_out_and_strided_rows():
    wide = make_logits(6, 300, seed=1)
    view = wide[:, 5:290]
    out = torch.full((6,), -7, dtype=torch.int64)
    _modules["cpu"].greedy_sample(out, view, 3)
    assert torch.equal(out, torch.argmax(view, dim=-1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_top_k_top_p_matches_reference(vocab, dtype):
    batch = 6
    x = make_logits(batch, vocab, dtype, seed=vocab + 1)
    top_k = torch.tensor([0, 1, 5, 50, vocab, -3], dtype=torch.int64)
    # top_p per row, chosen between two prefix masses (or disabled).
    ranks = [0, 2, 3, 10, 30, 1]
    top_p = torch.tensor([top_p_between_tokens(x[b], int(top_k[b]), ranks[b]) for b in range(batch)],
                         dtype=torch.float32)
    top_p[0] = 1.0
    u = safe_uniforms(batch, seed=vocab)
    out = top_k_top_p_sample_from_uniforms(x, u, top_k, top_p)
    ref, margins = ref_top_k_top_p(x, u, top_k, top_p)
    assert_tokens_match(out, ref, margins)


@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_top_p_scalar_params_many_uniforms(dtype):
    batch, vocab = 64, 1000
    x = make_logits(1, vocab, dtype, seed=3).expand(batch, vocab)  # row stride 0
    u = safe_uniforms(batch, seed=4)
    for k, rank in ((0, 20), (7, 3), (40, 100), (1, 0)):
        p = top_p_between_tokens(x[0], k, rank)
        out = top_k_top_p_sample_from_uniforms(x, u, k, p)
        ref, margins = ref_top_k_top_p(x, u, [k] * batch, [p] * batch)
        assert_tokens_match(out, ref, margins)


def test_top_k_top_p_disabled_equals_plain_sampling():
    x = make_logits(8, 4099, seed=5)
    u = safe_uniforms(8, seed=6)
    plain = top_k_top_p_sample_from_uniforms(x, u, 0, 1.0)
    assert torch.equal(plain, top_k_top_p_sample_from_uniforms(x, u, 4099, 1.0))
    assert torch.equal(plain, top_k_top_p_sample_from_uniforms(x, u, -1, 1.0))
    assert torch.equal(plain, top_k_top_p_sample_from_uniforms(x, u, 10**9, 1.0))
    ref, margins = ref_min_p(torch.softmax(x.double(), -1), u, [0.0] * 8)  # no filter at all
    assert_tokens_match(plain, ref, margins)


def test_top_k_distribution():
    batch, vocab, k = 4096, 127, 5
    x = make_logits(1, vocab, seed=7, scale=1.0)
    rows = x.expand(batch, vocab)
    g = torch.Generator().manual_seed(8)
    tokens = top_k_top_p_sample(rows, k, 1.0, generator=g)
    allowed = set(x[0].topk(k).indices.tolist())
    assert set(tokens.tolist()) <= allowed
    probs = torch.softmax(x[0, list(allowed)].double(), 0)
    freq = torch.tensor([(tokens == t).double().mean().item() for t in allowed])
    assert (freq - probs).abs().max() < 0.03


def test_top_p_distribution_keeps_prefix():
    batch, vocab = 4096, 300
    x = make_logits(1, vocab, seed=9, scale=3.0)
    p = top_p_between_tokens(x[0], 0, 4)  # the five most likely tokens
    tokens = top_k_top_p_sample(x.expand(batch, vocab), 0, p, generator=torch.Generator().manual_seed(1))
    assert set(tokens.tolist()) <= set(x[0].topk(5).indices.tolist())
    assert len(set(tokens.tolist())) == 5


def test_sampling_deterministic_with_seed():
    x = make_logits(16, 1000, seed=10)
    a = top_k_top_p_sample(x, 50, 0.9, generator=torch.Generator().manual_seed(123))
    b = top_k_top_p_sample(x, 50, 0.9, generator=torch.Generator().manual_seed(123))
    c = top_k_top_p_sample(x, 50, 0.9, generator=torch.Generator().manual_seed(124))
    assert torch.equal(a, b) and not torch.equal(a, c)
    probs = torch.softmax(x, -1)
    a = min_p_sample(probs, 0.05, generator=torch.Generator().manual_seed(5))
    b = min_p_sample(probs, 0.05, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_min_p_matches_reference(vocab, dtype):
    batch = 5
    probs = torch.softmax(make_logits(batch, vocab, seed=vocab + 2).double(), -1).to(dtype)
    min_p = torch.tensor([0.0, 0.05, 0.2, 0.5, 1.0], dtype=torch.float32)
    u = safe_uniforms(batch, seed=vocab + 3)
    out = min_p_sample_from_uniforms(probs, u, min_p)
    ref, margins = ref_min_p(probs, u, min_p)
    # Also skip rows where some p lies within BOUNDARY (relative) of the threshold.
    p64 = probs.double()
    thr = min_p.double()[:, None] * p64.max(-1, keepdim=True).values
    near = ((p64 - thr).abs() <= BOUNDARY * p64.max(-1, keepdim=True).values).any(-1)
    margins[near & (min_p > 0) & (min_p < 1)] = 0.0
    assert_tokens_match(out, ref, margins)


def test_min_p_edge_rows():
    # The CPU's vector path hands rows holding a NaN to its scalar loop (the max skips a NaN after
    # the first element, a NaN first keeps nothing); rows of zeros keep nothing (token 0); a row of
    # one token and a zero tail stay in the vector path.
    batch, vocab = 6, 1001
    probs = torch.softmax(make_logits(batch, vocab, seed=51), -1)
    probs[1, 500] = float("nan")
    probs[2, 0] = float("nan")
    probs[3] = 0.0
    probs[4] = 0.0
    probs[4, 777] = 1.0
    probs[5, 900:] = 0.0
    min_p = torch.tensor([0.1, 0.1, 0.1, 0.0, 0.5, 0.05], dtype=torch.float32)
    u = safe_uniforms(batch, seed=52)
    out = min_p_sample_from_uniforms(probs, u, min_p)
    clean = torch.nan_to_num(probs, nan=0.0)  # the NaN of row 1 is never kept: as a 0 below min_p
    rows = [0, 1, 5]
    ref, margins = ref_min_p_unambiguous(clean[rows], u[rows], min_p[rows])
    assert_tokens_match(out[rows], ref, margins)
    assert out[2:5].tolist() == [0, 0, 777]


def test_min_p_distribution():
    batch, vocab = 4096, 64
    probs = torch.softmax(make_logits(1, vocab, seed=11, scale=2.0), -1)
    allowed = set((probs[0] >= 0.1 * probs[0].max()).nonzero().flatten().tolist())
    tokens = min_p_sample(probs.expand(batch, vocab), 0.1, generator=torch.Generator().manual_seed(2))
    assert set(tokens.tolist()) <= allowed
    one = min_p_sample(probs.expand(batch, vocab), 1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(one, torch.full_like(one, int(probs[0].argmax())))


def test_sampling_empty_batch():
    assert greedy_sample(torch.empty(0, 10)).shape == (0,)
    assert top_k_top_p_sample(torch.empty(0, 10), 3, 0.5).shape == (0,)
    assert min_p_sample(torch.empty(0, 10), 0.1).shape == (0,)


def test_sampling_bad_inputs():
    x = torch.randn(4, 10)
    u = torch.rand(4)
    with pytest.raises(ValueError, match="top_p"):
        top_k_top_p_sample(x, 3, 0.0)
    with pytest.raises(ValueError, match="top_p"):
        top_k_top_p_sample(x, 3, 1.5)
    with pytest.raises(ValueError, match="top_p"):
        top_k_top_p_sample(x, 3, torch.tensor([0.5, 0.0, 0.5, 0.5]))
    with pytest.raises(ValueError, match="top_k"):
        top_k_top_p_sample(x, 2.5, 0.5)
    with pytest.raises(ValueError, match="min_p"):
        min_p_sample(x.softmax(-1), -0.1)
    with pytest.raises(ValueError, match="min_p"):
        min_p_sample(x.softmax(-1), 1.1)
    with pytest.raises(ValueError, match="min_p"):
        min_p_sample(x.softmax(-1), torch.tensor([0.1, 0.1, 2.0, 0.1]))
    with pytest.raises(ValueError, match="uniforms"):
        top_k_top_p_sample_from_uniforms(x, torch.full((4,), 1.0), 3, 0.5)
    with pytest.raises(ValueError, match="2-D"):
        greedy_sample(torch.randn(2, 3, 4))
    with pytest.raises(TypeError, match="dtype"):
        greedy_sample(torch.ones(2, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="dtype"):
        top_k_top_p_sample(x, torch.tensor([1, 2, 3, 4], dtype=torch.int32), 0.5)
    with pytest.raises(TypeError, match="dtype"):
        min_p_sample(x, torch.tensor([0.1] * 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="batch"):
        top_k_top_p_sample(x, torch.tensor([1, 2], dtype=torch.int64), 0.5)
    with pytest.raises(ValueError, match="batch"):
        top_k_top_p_sample_from_uniforms(x, torch.rand(3), 3, 0.5)
    with pytest.raises(ValueError, match="stride"):
        greedy_sample(torch.randn(10, 4).t())
    with pytest.raises(ValueError, match="vocab"):
        greedy_sample(torch.empty(2, 0))
    with pytest.raises(ValueError, match="device"):
        greedy_sample(torch.randn(2, 3, device="meta"))
    del u


def test_sampling_torch_compile():
    x = make_logits(6, 1000, seed=12)
    u = safe_uniforms(6, seed=13)

    def fn(logits, uniforms):
        probs = torch.softmax(logits, -1)
        return (greedy_sample(logits * 2),
                top_k_top_p_sample_from_uniforms(logits, uniforms, 20, 0.8),
                min_p_sample_from_uniforms(probs, uniforms, 0.1))

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(x, u), fn(x, u)):
        assert torch.equal(got, want)


# ----------------------------------------------------------------------------- filters (CPU and CUDA)


def ref_top_k_threshold(x: torch.Tensor, k: int) -> float:
    return x.topk(k).values[-1].item() if 0 < k < x.numel() else -float("inf")


def ref_filter(op: str, x: torch.Tensor, param) -> torch.Tensor:
    """float64 reference of one row of a filter op."""
    x = x.double()
    if op == "top_k_mask_logits":
        return torch.where(x >= ref_top_k_threshold(x, int(param)), x, torch.full_like(x, -float("inf")))
    if op == "top_k_renorm_probs":
        thr = ref_top_k_threshold(x, int(param))
    else:
        thr = -float("inf")
        if float(param) < 1.0:
            vals = x.sort(descending=True).values
            cum = vals.clamp_min(0).cumsum(0)
            thr = vals[int((cum >= float(param) * cum[-1]).nonzero()[0])].item()
    kept = torch.where(x >= thr, x, torch.zeros_like(x))
    return kept / kept.sum()


def top_p_between_probs(p: torch.Tensor, rank: int) -> float:
    """A float32 top_p halfway between the masses of the first rank and rank + 1 probabilities
    (descending), relative to the row's mass: the kept prefix is unambiguous."""
    cum = (p.double().sort(descending=True).values.cumsum(0) / p.double().sum()).tolist()
    low = cum[rank - 1] if rank > 0 else 0.0
    return f32((low + cum[rank]) / 2) if rank + 1 < len(cum) else 1.0


FILTER_TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def check_filter(op: str, device: str, x: torch.Tensor, params: torch.Tensor) -> None:
    """The op (through its module, into a NaN-poisoned out) against ref_filter, row by row."""
    out = torch.full(x.shape, float("nan"), dtype=x.dtype, device=device)
    threads = (2,) if device == "cpu" else ()  # the CPU modules take a thread count
    getattr(_modules[device], op)(out, x.to(device), params.to(device), *threads)
    for b in range(x.shape[0]):
        want = ref_filter(op, x[b], params[b])
        torch.testing.assert_close(out[b].cpu().double(), want, rtol=FILTER_TOL[x.dtype], atol=1e-7,
                                   msg=lambda m: f"{op} row {b}: {m}")


def filter_inputs(op: str, batch: int, vocab: int, dtype, seed: int):
    logits = make_logits(batch, vocab, dtype, seed=seed)
    if op == "top_k_mask_logits":
        return logits, torch.tensor([[0, 1, 5, 50, vocab, -3][b % 6] for b in range(batch)], dtype=torch.int64)
    probs = torch.softmax(logits.double(), -1).to(dtype)
    if op == "top_k_renorm_probs":
        return probs, torch.tensor([[0, 1, 5, 50, vocab, -3][b % 6] for b in range(batch)], dtype=torch.int64)
    ranks = [0, 2, 9, 40, 1, 200]
    top_p = [top_p_between_probs(probs[b], min(ranks[b % 6], vocab - 1)) for b in range(batch)]
    top_p[0] = 1.0
    return probs, torch.tensor(top_p, dtype=torch.float32)


FILTERS = ("top_k_mask_logits", "top_k_renorm_probs", "top_p_renorm_probs")


@pytest.mark.parametrize("op", FILTERS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", (1, 17, 1000, 4099))
def test_filters_match_reference(op, vocab, dtype):
    x, params = filter_inputs(op, 6, vocab, dtype, seed=vocab + 31)
    check_filter(op, "cpu", x, params)


def test_filters_public_api():
    logits = make_logits(3, 200, seed=41)
    masked = top_k_mask_logits(logits, 7)
    assert masked.shape == logits.shape and (masked > -float("inf")).sum(-1).tolist() == [7, 7, 7]
    probs = torch.softmax(logits, -1)
    assert torch.allclose(top_k_renorm_probs(probs, 200), probs / probs.sum(-1, keepdim=True))
    assert torch.equal(top_p_renorm_probs(probs, 1.0) > 0, probs > 0)
    kept = top_p_renorm_probs(probs, torch.full((3,), 1e-6))  # tiny top_p: the top token only
    assert torch.equal(kept.argmax(-1), probs.argmax(-1)) and torch.equal(kept.amax(-1), torch.ones(3))
    with pytest.raises(ValueError, match="top_p"):
        top_p_renorm_probs(probs, 0.0)
    with pytest.raises(ValueError, match=r"top_p\[1\]"):
        top_p_renorm_probs(probs, torch.tensor([0.5, 1.5, 0.5]))
    with pytest.raises(TypeError, match="top_k"):
        top_k_mask_logits(logits, "7")
    with pytest.raises(ValueError, match="2-D"):
        top_k_renorm_probs(probs[0], 3)
    compiled = torch.compile(lambda x: top_k_mask_logits(x, torch.full((3,), 5)), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(logits), top_k_mask_logits(logits, 5))


@requires_cuda
@pytest.mark.parametrize("op", FILTERS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,vocab", [(6, 17), (6, 4099), (1, 151936), (2, 600_001), (300, 999), (40, 100_000)])
def test_filters_cuda(op, batch, vocab, dtype):
    # Every launch plan: a row over 8 blocks, over 16 (600_001 16-bit values fit shared memory
    # only so) or beyond shared memory (float32), one block per row, and more blocks than SMs in
    # clusters of 4-8 (40 x 100_000: 256-thread blocks).
    x, params = filter_inputs(op, batch, vocab, dtype, seed=batch + vocab)
    rows = min(batch, 6)
    out = torch.full(x.shape, float("nan"), dtype=x.dtype, device="cuda")
    getattr(_modules["cuda"], op)(out, x.cuda(), params.cuda())
    check_filter(op, "cuda", x[:rows], params[:rows])
    assert not out.isnan().any()  # every element written, every row
    unaligned = torch.cat([x[:, :1], x], 1)[:, 1:]  # off 16-byte alignment
    torch.testing.assert_close(globals()[op](unaligned.cuda(), params.cuda()), out, rtol=0, atol=0)


@requires_cuda
@pytest.mark.parametrize("vocab", (4099, 128256))
def test_top_k_mask_cuda_special_values_at_the_boundary(vocab):
    # The k-th largest logit lands on signed zeros, subnormals, an infinity or the largest
    # floats: later radix passes tell the elements of a bin by a float range, which must agree
    # with the key order there (-0 and +0 are one value; no NaN in these rows).
    g = torch.Generator().manual_seed(vocab)
    rows, ks = [], []
    def row(specials, k):
        x = torch.randn(vocab, generator=g) - 50.0  # below every special value but -inf
        x[: len(specials)] = torch.tensor(specials)
        rows.append(x[torch.randperm(vocab, generator=g)])
        ks.append(k)
    tiny = 2.0 ** -149
    zeros = [-0.0] * 300 + [0.0] * 300
    row([1.0] * 100 + zeros, 150)                              # the 150th: a zero of either sign
    row([1.0] * 100 + zeros + [-tiny] * 50, 701)                # -denorm_min, just below -0
    row([tiny] * 40 + [2 * tiny] * 40 + zeros, 60)              # subnormals above +0
    row([tiny] * 40 + zeros + [-tiny, -2 * tiny] * 30, 650)     # negative subnormals
    row([float("inf")] * 10 + [3e38] * 20 + [-3e38] * 20, 25)   # the largest finite floats
    row([float("inf")] * 10 + [3e38] * 20 + [-3e38] * 20, 45)   # the most negative finite one
    row([float("-inf")] * (vocab - 30), vocab - 10)            # -inf at the boundary
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.stack(rows).to(dtype)
        k = torch.tensor(ks, dtype=torch.int64)
        out = top_k_mask_logits(x.cuda(), k.cuda()).cpu()
        for b in range(x.shape[0]):
            expect = ref_filter("top_k_mask_logits", x[b], int(k[b])).to(dtype)
            assert torch.equal(out[b], expect), (dtype, b)
        assert torch.equal(out, top_k_mask_logits(x, k))


# ----------------------------------------------------------------------------- CUDA


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS + (32768, 128256))
def test_greedy_cuda(vocab, dtype):
    x = make_logits(5, vocab, dtype, seed=vocab, device="cuda")
    assert torch.equal(greedy_sample(x), torch.argmax(x, dim=-1))
    nan = make_logits(2, vocab, dtype, seed=1, device="cuda")
    nan[1, vocab // 2] = float("nan")
    assert torch.equal(greedy_sample(nan), torch.argmax(nan, dim=-1))


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS + (128256,))
def test_top_k_top_p_cuda_matches_reference_and_cpu(vocab, dtype):
    batch = 6
    x = make_logits(batch, vocab, dtype, seed=vocab + 1)
    top_k = torch.tensor([0, 1, 5, 50, vocab, -3], dtype=torch.int64)
    ranks = [0, 2, 3, 10, 30, 1]
    top_p = torch.tensor([top_p_between_tokens(x[b], int(top_k[b]), ranks[b]) for b in range(batch)],
                         dtype=torch.float32)
    top_p[0] = 1.0
    u = safe_uniforms(batch, seed=vocab)
    ref, margins = ref_top_k_top_p(x, u, top_k, top_p)
    out = top_k_top_p_sample_from_uniforms(x.cuda(), u.cuda(), top_k.cuda(), top_p.cuda())
    assert out.device.type == "cuda"
    assert_tokens_match(out, ref, margins)
    assert_tokens_match(out, top_k_top_p_sample_from_uniforms(x, u, top_k, top_p), margins)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS + (128256,))
def test_min_p_cuda_matches_reference_and_cpu(vocab, dtype):
    batch = 5
    probs = torch.softmax(make_logits(batch, vocab, seed=vocab + 2).double(), -1).to(dtype)
    min_p = torch.tensor([0.0, 0.05, 0.2, 0.5, 1.0], dtype=torch.float32)
    u = safe_uniforms(batch, seed=vocab + 3)
    ref, margins = ref_min_p_unambiguous(probs, u, min_p)
    out = min_p_sample_from_uniforms(probs.cuda(), u.cuda(), min_p.cuda())
    assert_tokens_match(out, ref, margins)
    assert_tokens_match(out, min_p_sample_from_uniforms(probs, u, min_p), margins)


@requires_cuda
def test_sampling_cuda_distribution_and_determinism():
    batch, vocab, k = 8192, 1000, 10
    x = make_logits(1, vocab, seed=14, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(7)
    tokens = top_k_top_p_sample(x.expand(batch, vocab), k, 1.0, generator=g)
    assert set(tokens.tolist()) <= set(x[0].topk(k).indices.tolist())
    a = top_k_top_p_sample(x.expand(64, vocab), 40, 0.9, generator=torch.Generator("cuda").manual_seed(3))
    b = top_k_top_p_sample(x.expand(64, vocab), 40, 0.9, generator=torch.Generator("cuda").manual_seed(3))
    assert torch.equal(a, b)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_sampling_cuda_unaligned(dtype):
    vocab = 4096
    base = make_logits(1, 4 * vocab + 1, dtype, seed=15, device="cuda").flatten()
    x = base[1:].view(4, vocab)  # pointer off 16-byte alignment: scalar loads
    assert torch.equal(greedy_sample(x), torch.argmax(x, dim=-1))
    u = safe_uniforms(4, seed=16)
    p = top_p_between_tokens(x[0], 30, 5)
    ref, margins = ref_top_k_top_p(x.cpu(), u, [30] * 4, [p] * 4)
    assert_tokens_match(top_k_top_p_sample_from_uniforms(x, u.cuda(), 30, p), ref, margins)


@requires_cuda
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("batch,vocab", [(1, 151936), (2, 600_001), (40, 32000), (300, 4099), (40, 100_000)])
def test_sampling_cuda_launch_plans(batch, vocab, dtype):
    # Rows split over 8 blocks (batch 1), over 16 (600_001 bfloat16), rows too long for shared
    # memory (600_001 float32: read from global memory each pass), a few blocks per row (40),
    # one block per row (300, on sm_90 too) and more blocks than SMs in clusters of 4-8
    # (40 x 100_000: min_p's 256-thread blocks).
    x = make_logits(batch, vocab, dtype, seed=batch + vocab)
    # k = 3000: more top-k survivors than a block compacts (1024) where a block holds the row.
    rows = list(range(min(batch, 7)))  # the float64 reference is slow: check a few rows
    u = safe_uniforms(batch, seed=vocab + 7)
    k = torch.tensor([[0, 1, 5, 50, 1000, -3, 3000][b % 7] for b in range(batch)], dtype=torch.int64)
    p = torch.tensor([[1.0, 0.5, 0.9, 0.95, 0.3, 0.8, 0.9][b % 7] for b in range(batch)], dtype=torch.float32)
    for b in rows:
        p[b] = top_p_between_tokens(x[b], int(k[b]), [0, 2, 3, 10, 30, 1, 40][b % 7]) if b % 7 else 1.0
    ref, margins = ref_top_k_top_p_off_boundaries(x, u, k, p, rows)
    out = top_k_top_p_sample_from_uniforms(x.cuda(), u.cuda(), k.cuda(), p.cuda()).cpu()
    assert_tokens_match(out[rows], ref, margins)
    for b in range(batch):  # every row: a kept token (its logit reaches the row's k-th largest)
        if 0 < k[b] < vocab:
            assert x[b, out[b]] >= x[b].topk(int(k[b])).values[-1]
    assert torch.equal(greedy_sample(x.cuda()).cpu(), torch.argmax(x, dim=-1))
    probs = torch.softmax(x.double(), -1).to(dtype)
    min_p = torch.tensor([[0.0, 0.05, 0.2, 0.5, 1.0][b % 5] for b in range(batch)], dtype=torch.float32)
    ref, margins = ref_min_p_unambiguous(probs[rows], u[rows], min_p[rows])
    for i, b in enumerate(rows):
        for _ in range(10):  # a row near a min-p threshold stays ambiguous: move on after a few tries
            if margins[i] > BOUNDARY:
                break
            u[b] = (u[b] + 0.3137) % 1.0
            ref[i], margins[i] = (t[0] for t in ref_min_p_unambiguous(probs[b:b + 1], u[b:b + 1], min_p[b:b + 1]))
    out = min_p_sample_from_uniforms(probs.cuda(), u.cuda(), min_p.cuda()).cpu()
    assert_tokens_match(out[rows], ref, margins)


@requires_cuda
def test_sampling_cuda_same_token_for_every_plan():
    # Fixed-point weights: the token does not depend on how a row is split over blocks.
    vocab = 128256
    x = make_logits(1, vocab, seed=21, device="cuda")
    u = torch.rand(64, generator=torch.Generator().manual_seed(22)).cuda()
    alone = [top_k_top_p_sample_from_uniforms(x, u[i:i + 1], 40, 0.9) for i in range(64)]
    together = top_k_top_p_sample_from_uniforms(x.expand(64, vocab), u, 40, 0.9)
    assert torch.equal(torch.cat(alone), together)
    probs = torch.softmax(x, -1)
    alone = [min_p_sample_from_uniforms(probs, u[i:i + 1], 0.05) for i in range(64)]
    assert torch.equal(torch.cat(alone), min_p_sample_from_uniforms(probs.expand(64, vocab), u, 0.05))


def assert_cuda_plans_agree(x, u, k, p, ref, batch):
    """top_k_top_p on CUDA gives ref for each row alone (a cluster of blocks each) and for the rows
    repeated in a batch of `batch` (other plans)."""
    alone = torch.cat([top_k_top_p_sample_from_uniforms(x[b:b + 1].cuda(), u[b:b + 1].cuda(), k[b:b + 1].cuda(),
                                                        p[b:b + 1].cuda()).cpu() for b in range(x.shape[0])])
    assert torch.equal(alone, ref)
    rep = torch.arange(batch) % x.shape[0]
    many = top_k_top_p_sample_from_uniforms(x[rep].cuda(), u[rep].cuda(), k[rep].cuda(), p[rep].cuda()).cpu()
    assert torch.equal(many, ref[rep])


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_candidates_and_their_fallbacks(dtype):
    # A top-k search first bounds the k-th largest logit by the blocks' thread maxima and keeps
    # the few logits above it in one block; rows where that does not hold or does not fit take
    # the full search. Each row below takes one of these paths; all must give the reference token.
    batch, vocab = 6, 151936
    x = make_logits(batch, vocab, torch.float32, seed=31)
    x[1, 1000:40000] = 9.0   # ties at the k-th largest span whole blocks: too many candidates
    x[2] = 0.5               # one value everywhere: every logit is a candidate
    x[3, 30:] = -float("inf")  # fewer finite logits than k: no bound
    x[4, ::997] += 20.0      # a few large logits spread over every block
    x = x.to(dtype)
    k = torch.tensor([50, 50, 5, 50, 200, 1], dtype=torch.int64)
    p = torch.tensor([0.9, 0.5, 0.7, 0.95, 0.8, 1.0], dtype=torch.float32)
    for b in (0, 4):
        p[b] = top_p_between_tokens(x[b], int(k[b]), [7, 0, 0, 0, 40][b])
    u = safe_uniforms(batch, seed=32)
    ref, margins = ref_top_k_top_p_off_boundaries(x, u, k, p, list(range(batch)))
    out = top_k_top_p_sample_from_uniforms(x.cuda(), u.cuda(), k.cuda(), p.cuda()).cpu()
    assert (margins > BOUNDARY).all()
    assert torch.equal(out, ref), (out, ref)
    assert_cuda_plans_agree(x, u, k, p, ref, 64)
    assert_cuda_plans_agree(x, u, k, p, ref, rows_per_block_batch())
    # The top-k filters on the same rows (they search the whole slice; see TUNING.md).
    check_filter("top_k_mask_logits", "cuda", x, k)
    check_filter("top_k_renorm_probs", "cuda", torch.softmax(x.double(), -1).to(dtype), k)


def rows_per_block_batch() -> int:
    """A batch of two rows per SM: top_k_top_p then reads each row of more than 96 KiB once, in
    one block (StreamRows in sampling.cuh)."""
    return 2 * torch.cuda.get_device_properties(0).multi_processor_count


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", (100_003, 65_541))  # rows of more than 96 KiB, with a tail
def test_top_k_rows_read_once(dtype, vocab):
    # With two rows per SM, one block reads a row once and keeps the elements at or above a
    # rising bound of the k-th largest in a buffer of 2048, compacting it to the top k when half
    # full. Rows that refill it at every chunk (ascending), that have nothing after the first
    # chunk (descending), k at the compaction's limit (1024 kept) and past it, more ties at the
    # k-th largest than a compaction keeps, and a NaN must give the reference token; so must
    # the same rows unaligned (the search over global memory).
    x = make_logits(8, vocab, torch.float32, seed=vocab, scale=3.0)
    x[0] = torch.linspace(-5.0, 5.0, vocab)     # ascending
    x[1] = torch.linspace(5.0, -5.0, vocab)     # descending
    x[4] /= 3.0
    x[4, 7:1500] = 8.0                          # 1493 ties at the k-th largest
    x[5, vocab // 3] = float("nan")             # kept by every plan: above every key
    x = x.to(dtype)
    k = torch.tensor([50, 50, 1024, 1025, 100, 50, 1000, 1], dtype=torch.int64)
    u = safe_uniforms(8, seed=vocab + 1)
    p = torch.ones(8, dtype=torch.float32)
    for b, rank in ((0, 20), (2, 300), (6, 500)):
        p[b] = top_p_between_tokens(x[b], int(k[b]), rank)
    plain = [b for b in range(8) if b != 5]  # the reference has no NaN rule: row 5 checked against the plans
    ref, margins = ref_top_k_top_p_off_boundaries(x, u, k, p, plain)
    assert (margins > BOUNDARY).all()
    alone = torch.cat([top_k_top_p_sample_from_uniforms(x[b:b + 1].cuda(), u[b:b + 1].cuda(), k[b:b + 1].cuda(),
                                                        p[b:b + 1].cuda()).cpu() for b in range(8)])
    assert torch.equal(alone[plain], ref), (alone, ref)
    batch = rows_per_block_batch()
    rep = torch.arange(batch) % 8
    many = top_k_top_p_sample_from_uniforms(x[rep].cuda(), u[rep].cuda(), k[rep].cuda(), p[rep].cuda()).cpu()
    assert torch.equal(many, alone[rep]), (many, alone[rep])
    base = torch.empty(batch * (vocab + 1) + 1, dtype=dtype, device="cuda")
    unaligned = base[1:].view(batch, vocab + 1)[:, :vocab]  # rows off 16-byte alignment
    unaligned.copy_(x[rep])
    out = top_k_top_p_sample_from_uniforms(unaligned, u[rep].cuda(), k[rep].cuda(), p[rep].cuda()).cpu()
    assert torch.equal(out, alone[rep])


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_top_p_without_top_k_paths(dtype):
    # Top-p without top-k searches every element of the row: rows of ties (one value everywhere, a
    # plateau holding the boundary across blocks), few finite logits, and logits that weigh 0 (40
    # below the rest) must give the reference token, alone and in a batch (other plans), and the
    # CPU's token.
    batch, vocab = 6, 151936
    x = make_logits(batch, vocab, torch.float32, seed=41, scale=3.0)
    x[1] = 0.5                   # one value everywhere: every logit ties
    x[2, 2000:60000] = 4.0       # a tie plateau over several blocks' slices, holding the boundary
    x[3, 40:] = -float("inf")    # a few finite logits
    x[4, 1::2] -= 40.0           # half the row 40 below the rest: it weighs 0
    p = torch.tensor([0.9, 0.5, 0.9, 0.95, 0.999, 1e-7], dtype=torch.float32)
    x = x.to(dtype)
    for b, rank in ((0, 30), (3, 7), (4, 200)):
        p[b] = top_p_between_tokens(x[b], 0, rank)
    w = torch.exp(x[2].double() - x[2].double().max())  # the boundary inside the plateau
    p[2] = f32(((w[x[2] > 4.0].sum() + w[x[2] == 4.0].sum() / 2) / w.sum()).item())
    k = torch.zeros(batch, dtype=torch.int64)
    u = safe_uniforms(batch, seed=42)
    ref, margins = ref_top_k_top_p_off_boundaries(x, u, k, p, list(range(batch)))
    assert (margins > BOUNDARY).all()
    out = top_k_top_p_sample_from_uniforms(x.cuda(), u.cuda(), k.cuda(), p.cuda()).cpu()
    assert torch.equal(out, ref), (out, ref)
    assert torch.equal(top_k_top_p_sample_from_uniforms(x, u, k, p), ref)
    assert_cuda_plans_agree(x, u, k, p, ref, 256)


@requires_cuda
def test_sampling_cuda_graph():
    x = make_logits(4, 32000, torch.bfloat16, seed=17, device="cuda")
    u = safe_uniforms(4, seed=18, device="cuda")
    probs = torch.softmax(x.float(), -1)
    top_k = torch.tensor([0, 5, 50, 1], dtype=torch.int64, device="cuda")

    def step():
        return (greedy_sample(x), top_k_top_p_sample_from_uniforms(x, u, top_k, 0.9),
                min_p_sample_from_uniforms(probs, u, 0.05))

    step()  # build and load outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    x.copy_(make_logits(4, 32000, torch.bfloat16, seed=19, device="cuda"))
    probs.copy_(torch.softmax(x.float(), -1))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outs, step()):
        assert torch.equal(got, want)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_thread_counts_give_the_same_results(dtype):
    """num_threads splits the rows over threads: every op returns exactly what one thread does,
    for more threads than rows too, on strided rows, into poisoned outputs."""
    import mllm_kernel as mk

    wide = make_logits(13, 21000, seed=7).to(dtype)
    logits = wide[:, 3:20980]  # a row stride; enough elements for several workers, even for argmax
    probs = torch.softmax(logits.float(), dim=-1).to(dtype)
    uniforms = torch.rand(13, generator=torch.Generator().manual_seed(3))
    top_k = torch.randint(0, 60, (13,), generator=torch.Generator().manual_seed(4))
    top_p = torch.rand(13, generator=torch.Generator().manual_seed(5)) * 0.9 + 0.1
    min_p = torch.rand(13, generator=torch.Generator().manual_seed(6)) * 0.3
    calls = {
        "greedy_sample": lambda n: mk.greedy_sample(logits, num_threads=n),
        "top_k_top_p_sample": lambda n: mk.top_k_top_p_sample_from_uniforms(logits, uniforms, top_k, top_p,
                                                                            num_threads=n),
        "min_p_sample": lambda n: mk.min_p_sample_from_uniforms(probs, uniforms, min_p, num_threads=n),
        "top_k_mask_logits": lambda n: mk.top_k_mask_logits(logits, top_k, num_threads=n),
        "top_k_renorm_probs": lambda n: mk.top_k_renorm_probs(probs, top_k, num_threads=n),
        "top_p_renorm_probs": lambda n: mk.top_p_renorm_probs(probs, top_p, num_threads=n),
    }
    for name, call in calls.items():
        one = call(1)
        for n in (2, 3, 64):
            assert torch.equal(call(n), one), (name, n)
    # the filters into a poisoned output through the module: every element written
    out = torch.full(probs.shape, float("nan"), dtype=dtype)
    _modules["cpu"].top_p_renorm_probs(out, probs, top_p, 4)
    assert torch.equal(out, calls["top_p_renorm_probs"](1))
    with pytest.raises(ValueError, match="greedy_sample: num_threads must be >= 1, got 0"):
        mk.greedy_sample(logits, num_threads=0)
    with pytest.raises(ValueError, match="top_p_renorm_probs: num_threads must be >= 1, got -2"):
        mk.top_p_renorm_probs(probs, 0.5, num_threads=-2)
    with pytest.raises(TypeError, match="min_p_sample: num_threads must be an int >= 1, got float 2.0"):
        mk.min_p_sample(probs, 0.1, num_threads=2.0)

@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_bad_num_threads_refused_on_every_device(device):
    # CUDA ignores the thread count, but a bad one is refused there as on the CPU.
    import mllm_kernel as mk

    logits = torch.randn(2, 100, device=device)
    probs = torch.softmax(logits, -1)
    u = torch.rand(2, device=device)
    calls = {
        "greedy_sample": lambda n: mk.greedy_sample(logits, num_threads=n),
        "top_k_top_p_sample": lambda n: mk.top_k_top_p_sample_from_uniforms(logits, u, 5, 0.9, num_threads=n),
        "min_p_sample": lambda n: mk.min_p_sample_from_uniforms(probs, u, 0.1, num_threads=n),
        "top_k_mask_logits": lambda n: mk.top_k_mask_logits(logits, 5, num_threads=n),
        "top_k_renorm_probs": lambda n: mk.top_k_renorm_probs(probs, 5, num_threads=n),
        "top_p_renorm_probs": lambda n: mk.top_p_renorm_probs(probs, 0.9, num_threads=n),
    }  # softmax and log_softmax: test_softmax.py
    for name, call in calls.items():
        call(3)  # any count >= 1 runs
        for bad in (0, -1):
            with pytest.raises(ValueError, match=f"{name}: num_threads must be >= 1, got {bad}"):
                call(bad)
        with pytest.raises(TypeError, match=f"{name}: num_threads must be an int >= 1, got NoneType"):
            call(None)

