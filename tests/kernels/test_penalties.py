"""apply_penalties against a float64 reference written here (kernels/penalties)."""

from __future__ import annotations

import zlib

import pytest
import torch

from mllm_kernel.kernels.penalties import apply_penalties, pop_penalties_error

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=cuda_only)]

# (batch, vocab, ids per row): one token, a vocab that is not a multiple of anything, vocabs
# crossing the CUDA kernels' 4096 / 8192-token slices, an empty id list, lists longer than the vocab.
SHAPES = [(1, 1, 3), (3, 7, 20), (2, 8193, 300), (5, 20011, 0), (4, 20011, 9000), (1, 151936, 4097)]


def seed(*parts) -> None:
    torch.manual_seed(zlib.crc32(repr(parts).encode()))


def counts_of(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """float64 [batch, vocab]: occurrences of each id per row, ids < 0 ignored (plain loop)."""
    counts = torch.zeros(ids.shape[0], vocab, dtype=torch.float64)
    for b, row in enumerate(ids.cpu().tolist()):
        for t in row:
            if t >= 0:
                counts[b, t] += 1
    return counts


def column(value, batch: int) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().double().view(batch, 1)
    return torch.full((batch, 1), float(value), dtype=torch.float64)


def reference(logits, counts, repetition, frequency, presence) -> torch.Tensor:
    """float64: x / r if x > 0 else x * r, then x - f * c - p, where the count c > 0."""
    x = logits.detach().cpu().double()
    c = counts.double()
    batch = x.shape[0]
    r, f, p = column(repetition, batch), column(frequency, batch), column(presence, batch)
    scaled = torch.where(x > 0, x / r, x * r)
    return torch.where(c > 0, scaled - f * c - p, x)


def assert_penalized(got, before, counts, repetition, frequency, presence):
    """Penalized tokens within a float32 computation rounded once to the dtype; the others
    bit-identical (never rewritten)."""
    want = reference(before, counts, repetition, frequency, presence)
    got_d, before_d = got.detach().cpu().double(), before.detach().cpu().double()
    seen = counts > 0
    untouched = ~seen
    assert torch.equal(got_d[untouched], before_d[untouched]), "a token with count 0 changed"
    batch = got.shape[0]
    scale = before_d.abs() + column(frequency, batch).abs() * counts + column(presence, batch).abs()
    eps = torch.finfo(got.dtype).eps
    tol = eps * want.abs() + 4 * torch.finfo(torch.float32).eps * scale + 1e-30
    err = (got_d - want).abs()
    bad = seen & ~(err <= tol)
    assert not bad.any(), f"{int(bad.sum())} wrong, worst err {float(err[seen].max())}"


def random_ids(batch, num_ids, vocab, dtype, device, padding=True):
    # Draws from a small range as well, so ids repeat.
    ids = torch.randint(0, vocab, (batch, num_ids))
    repeat = torch.randint(0, min(vocab, 50), (batch, num_ids))
    ids = torch.where(torch.rand(batch, num_ids) < 0.5, repeat, ids)
    if padding:
        ids = torch.where(torch.rand(batch, num_ids) < 0.1, -1 - torch.randint(0, 5, (batch, num_ids)), ids)
    return ids.to(dtype=dtype, device=device)


def random_params(batch, device):
    return ((torch.rand(batch) * 1.5 + 0.5).to(device), (torch.rand(batch) - 0.3).to(device),
            (torch.rand(batch) * 2 - 1).to(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_from_ids(device, shape, id_dtype, dtype):
    seed(shape, id_dtype, dtype)
    batch, vocab, num_ids = shape
    logits = (torch.randn(batch, vocab) * 4).to(dtype=dtype, device=device)
    ids = random_ids(batch, num_ids, vocab, id_dtype, device)
    rep, freq, pres = random_params(batch, device)
    before = logits.clone()
    out = apply_penalties(logits, ids, None, rep, freq, pres)
    assert out is logits
    assert_penalized(logits, before, counts_of(ids, vocab), rep, freq, pres)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("count_dtype", [torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("dtype", DTYPES)
def test_from_counts(device, count_dtype, dtype):
    seed(count_dtype, dtype)
    for batch, vocab in [(1, 1), (3, 4097), (2, 151936)]:
        logits = (torch.randn(batch, vocab) * 4).to(dtype=dtype, device=device)
        counts = torch.randint(0, 4, (batch, vocab)) * (torch.rand(batch, vocab) < 0.3)
        counts = (counts > 0) if count_dtype == torch.bool else counts.to(count_dtype)
        before = logits.clone()
        apply_penalties(logits, None, counts.to(device), 1.25, 0.5, -0.75)
        assert_penalized(logits, before, counts.double(), 1.25, 0.5, -0.75)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_views_and_scalars(device):
    """Row-strided logits, ids and counts (views into wider buffers), scalar parameters; the
    columns outside the views stay untouched."""
    seed(device)
    batch, vocab = 3, 9001
    wide = torch.randn(batch, vocab + 13, device=device)
    logits = wide[:, 5:5 + vocab]
    wide_ids = random_ids(batch, 400, vocab, torch.int64, device)
    ids = wide_ids[:, 100:]
    outside = torch.cat([wide[:, :5], wide[:, 5 + vocab:]], 1).clone()
    before = logits.clone()
    apply_penalties(logits, ids, None, 2.0, 0.125, 1.0)
    assert_penalized(logits, before, counts_of(ids, vocab), 2.0, 0.125, 1.0)
    assert torch.equal(torch.cat([wide[:, :5], wide[:, 5 + vocab:]], 1), outside)

    counts = torch.randint(0, 3, (batch, vocab + 7), dtype=torch.int32, device=device)[:, 7:]
    before = logits.clone()
    apply_penalties(logits, None, counts, 0.5, 0.0, 0.0)
    assert_penalized(logits, before, counts.double().cpu(), 0.5, 0.0, 0.0)


@pytest.mark.parametrize("device", DEVICES)
def test_no_op_parameters_and_special_values(device):
    """repetition 1 and zero frequency / presence leave every logit bit-identical; +-inf stay
    infinite and NaN stays NaN under a penalty; 0 stays 0 under repetition alone."""
    logits = torch.tensor([[0.0, -0.0, 3.0, -3.0, float("inf"), float("-inf"), float("nan"), 7.5]], device=device)
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 6]], device=device)
    same = apply_penalties(logits.clone(), ids)
    assert torch.equal(same.isnan(), logits.isnan()) and torch.equal(same.nan_to_num(), logits.nan_to_num())
    got = apply_penalties(logits.clone(), ids, None, 2.0).cpu()
    assert got[0, :4].tolist() == [0.0, 0.0, 1.5, -6.0]
    assert got[0, 4] == float("inf") and got[0, 5] == float("-inf") and got[0, 6].isnan() and got[0, 7] == 7.5


@pytest.mark.parametrize("device", DEVICES)
def test_vllm_split(device):
    """The documented recipe for vLLM's split (repetition over prompt and output tokens,
    frequency / presence over output tokens) gives vLLM's formula."""
    seed("vllm", device)
    batch, vocab = 2, 500
    logits = torch.randn(batch, vocab, device=device) * 3
    prompt = torch.randint(0, vocab, (batch, 40), device=device)
    output = torch.randint(0, vocab, (batch, 30), device=device)
    out_counts = counts_of(output, vocab)
    union = (counts_of(prompt, vocab) > 0) | (out_counts > 0)
    x = logits.cpu().double()
    want = torch.where(union, torch.where(x > 0, x / 1.3, x * 1.3), x)
    want = want - 0.2 * out_counts - 0.7 * (out_counts > 0)
    got = logits.clone()
    apply_penalties(got, None, union.to(device), 1.3)
    apply_penalties(got, output, None, 1.0, 0.2, 0.7)
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-6, atol=1e-5)


# ----------------------------------------------------------------------------- bad values


def test_cpu_bad_values_write_nothing():
    logits = torch.randn(2, 10)
    before = logits.clone()
    cases = [
        (dict(token_ids=torch.tensor([[1, 2], [3, 10]])), r"token_ids \(flattened\)\[3\] = 10"),
        (dict(token_ids=torch.tensor([[1, 2], [3, 2**40]])), r"= 1099511627776"),
        (dict(counts_or_mask=torch.tensor([[0] * 10, [0] * 9 + [-2]])), r"counts_or_mask \(flattened\)\[19\] = -2"),
        (dict(token_ids=torch.tensor([[1], [2]]), repetition=torch.tensor([1.0, -1.0])), r"repetition\[1\]"),
        (dict(token_ids=torch.tensor([[1], [2]]), frequency=torch.tensor([float("inf"), 0.0])), r"frequency\[0\]"),
        (dict(token_ids=torch.tensor([[1], [2]]), presence=torch.tensor([0.0, float("nan")])), r"presence\[1\]"),
        (dict(token_ids=torch.tensor([[1], [2]]), repetition=0.0), r"repetition must be a positive"),
        (dict(token_ids=torch.tensor([[1], [2]]), frequency=float("nan")), r"frequency must be a finite"),
        (dict(token_ids=torch.tensor([[1], [2]]), presence=1e39), r"presence = 1e\+39 is out of range"),
        (dict(token_ids=torch.tensor([[1], [2]]), counts_or_mask=torch.ones(2, 10, dtype=torch.int32)), "both"),
        (dict(), "neither"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            apply_penalties(logits, **kwargs)
        assert torch.equal(logits, before), kwargs


def test_cpu_bad_arguments_name_them():
    logits = torch.randn(2, 10)
    with pytest.raises(TypeError, match="token_ids"):
        apply_penalties(logits, torch.zeros(2, 3))  # float ids
    with pytest.raises(TypeError, match="counts_or_mask"):
        apply_penalties(logits, None, torch.zeros(2, 10, dtype=torch.int16))
    with pytest.raises(ValueError, match="token_ids"):
        apply_penalties(logits, torch.zeros(3, 3, dtype=torch.int64))  # batch mismatch
    with pytest.raises(ValueError, match="counts_or_mask"):
        apply_penalties(logits, None, torch.zeros(2, 11, dtype=torch.int32))  # vocab mismatch
    with pytest.raises(ValueError, match="repetition"):
        apply_penalties(logits, torch.zeros(2, 3, dtype=torch.int64), None, torch.ones(3))
    with pytest.raises(TypeError, match="frequency"):
        apply_penalties(logits, torch.zeros(2, 3, dtype=torch.int64), None, 1.0, torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="logits"):
        apply_penalties(torch.randn(2, 10).t(), torch.zeros(10, 3, dtype=torch.int64))  # non-unit last stride
    with pytest.raises(ValueError, match="logits"):
        apply_penalties(torch.randn(1, 10).expand(3, 10), torch.zeros(3, 2, dtype=torch.int64))  # rows overlap
    with pytest.raises(ValueError, match="logits"):
        apply_penalties(logits, logits.view(torch.int32))  # aliases logits
    with pytest.raises(TypeError, match="check"):
        apply_penalties(logits, torch.zeros(2, 3, dtype=torch.int64), check="yes")


def test_empty_shapes():
    apply_penalties(torch.empty(0, 10), torch.empty(0, 4, dtype=torch.int64))
    apply_penalties(torch.empty(0, 10), None, torch.empty(0, 10, dtype=torch.bool))
    x = torch.randn(2, 5)
    assert torch.equal(apply_penalties(x.clone(), torch.empty(2, 0, dtype=torch.int32), None, 3.0), x)


# ----------------------------------------------------------------------------- CUDA specifics


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(dtype):
    """The same float32 operations on both devices: equal results."""
    seed("cpu-cuda", dtype)
    batch, vocab = 6, 32003
    logits = (torch.randn(batch, vocab) * 5).to(dtype)
    ids = random_ids(batch, 700, vocab, torch.int64, "cpu")
    rep, freq, pres = random_params(batch, "cpu")
    on_cpu = apply_penalties(logits.clone(), ids, None, rep, freq, pres)
    on_cuda = apply_penalties(logits.cuda(), ids.cuda(), None, rep.cuda(), freq.cuda(), pres.cuda())
    torch.testing.assert_close(on_cuda.cpu(), on_cpu, rtol=torch.finfo(dtype).eps, atol=0.0)


@cuda_only
def test_cuda_many_work_items():
    """More (row, slice) pairs than the grid's blocks: the grid-stride loop covers them all."""
    seed("many")
    batch, vocab = 300, 128256
    logits = torch.randn(batch, vocab, device="cuda")
    ids = torch.randint(0, vocab, (batch, 64), device="cuda")
    before = logits.clone()
    apply_penalties(logits, ids, None, 1.5, 0.25, 0.5)
    assert_penalized(logits, before, counts_of(ids, vocab), 1.5, 0.25, 0.5)
    counts = torch.randint(0, 2, (batch, vocab), dtype=torch.int32, device="cuda")
    before = logits.clone()
    apply_penalties(logits, None, counts, 1.5, 0.25, 0.5)
    assert_penalized(logits, before, counts.double().cpu(), 1.5, 0.25, 0.5)


@cuda_only
def test_cuda_bad_elements_are_skipped_and_recorded():
    pop_penalties_error()
    logits = torch.randn(2, 10, device="cuda")
    before = logits.clone()
    ids = torch.tensor([[1, 12], [3, 3]], device="cuda")
    with pytest.raises(ValueError, match=r"token_ids \(flattened\)\[1\] = 12 is out of range"):
        apply_penalties(logits, ids, None, 2.0)
    counts = torch.zeros(2, 10, device="cpu")
    counts[0, 1] = 1
    counts[1, 3] = 2
    assert_penalized(logits, before, counts, 2.0, 0.0, 0.0)  # the good ids were applied

    before = logits.clone()
    bad_counts = torch.zeros(2, 10, dtype=torch.int32, device="cuda")
    bad_counts[1, 4], bad_counts[0, 2] = -3, 1
    apply_penalties(logits, None, bad_counts, 2.0, check=False)
    assert pop_penalties_error() == ("counts_or_mask", 14, -3)
    assert pop_penalties_error() is None
    assert_penalized(logits, before, bad_counts.clamp_min(0).double().cpu(), 2.0, 0.0, 0.0)


@cuda_only
def test_cuda_bad_parameter_values_act_as_no_ops():
    """CUDA cannot raise on device values: repetition <= 0 / NaN acts as 1, non-finite frequency
    and presence as 0 (the module doc's rule)."""
    logits = torch.randn(4, 100, device="cuda")
    ids = torch.arange(8, device="cuda").repeat(4, 1)
    rep = torch.tensor([0.0, float("nan"), 2.0, -1.0], device="cuda")
    freq = torch.tensor([float("inf"), 0.5, float("nan"), 0.5], device="cuda")
    pres = torch.tensor([0.25, float("-inf"), 0.25, 0.0], device="cuda")
    before = logits.clone()
    apply_penalties(logits, ids, None, rep, freq, pres)
    counts = torch.zeros(4, 100)
    counts[:, :8] = 1
    assert_penalized(logits, before, counts, torch.tensor([1.0, 1.0, 2.0, 1.0]), torch.tensor([0.0, 0.5, 0.0, 0.5]),
                     torch.tensor([0.25, 0.0, 0.25, 0.0]))


@cuda_only
def test_cuda_graph_replay():
    """Captured once (unchecked: a checked call syncs), replayed on new data."""
    batch, vocab = 8, 50000
    logits = torch.randn(batch, vocab, device="cuda")
    ids = torch.randint(0, vocab, (batch, 256), device="cuda")
    apply_penalties(logits.clone(), ids, None, 1.2, 0.1, 0.1)  # allocates the error record outside capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        apply_penalties(logits, ids, None, 1.2, 0.1, 0.1, False)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        logits.copy_(torch.randn(batch, vocab, device="cuda"))
        ids.copy_(torch.randint(0, vocab, (batch, 256), device="cuda"))
        before = logits.clone()
        graph.replay()
        torch.cuda.synchronize()
        assert_penalized(logits, before, counts_of(ids, vocab), 1.2, 0.1, 0.1)


@pytest.mark.parametrize("device", DEVICES)
def test_bool_bytes_other_than_one_count_once(device):
    """A bool tensor viewed from uint8 may hold 2 in a byte: it counts as seen once."""
    logits = torch.zeros(1, 4, device=device)
    mask = torch.tensor([[2, 0, 1, 255]], dtype=torch.uint8, device=device).view(torch.bool)
    apply_penalties(logits, None, mask, 1.0, 1.0, 0.0)
    assert logits.cpu().tolist() == [[-1.0, 0.0, -1.0, -1.0]]


@pytest.mark.parametrize("device", DEVICES)
def test_empty_vocab_rejects_every_id(device):
    """With vocab 0 every id >= 0 is out of range (padding ids < 0 are still fine)."""
    apply_penalties(torch.empty(2, 0, device=device), torch.full((2, 3), -1, device=device))
    with pytest.raises(ValueError, match=r"token_ids \(flattened\)\[0\] = 0 is out of range"):
        apply_penalties(torch.empty(2, 0, device=device), torch.tensor([[0, -1], [-1, -1]], device=device))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
