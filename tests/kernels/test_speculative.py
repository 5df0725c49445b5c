"""chain_speculative_sampling (kernels/speculative): the documented rule written out here, and the
distribution it must reproduce (chi-square over 200k requests)."""

from __future__ import annotations

import zlib

import pytest
import torch

from mllm_kernel.kernels.speculative import chain_speculative_sampling, pop_speculative_error

HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=cuda_only)]


def seed(*parts) -> None:
    torch.manual_seed(zlib.crc32(repr(parts).encode()))


def weight(w: float) -> int:
    """The documented integer weight: the probability clamped to [0, 1] (NaN as 0) times 2^40, truncated."""
    w = float(torch.tensor(w, dtype=torch.float32))
    if not w > 0.0:
        return 0
    return int(min(w, 1.0) * 2.0**40)


def draw(weights: list[int], u: float) -> int:
    """First index whose running weight exceeds floor(u * total) (u * total in float64); -1 if no mass."""
    total = sum(weights)
    if total == 0:
        return -1
    target = int(float(u) * float(total))
    running = 0
    for i, w in enumerate(weights):
        running += w
        if running > target:
            return i
    raise AssertionError("unreachable")


def reference(draft_probs, draft_ids, target_probs, uniforms):
    """The rule of the module doc, request by request (float32 accept test, integer draws)."""
    q_all, p_all = draft_probs.float().cpu(), target_probs.float().cpu()
    ids, u_all = draft_ids.cpu().tolist(), uniforms.float().cpu()
    batch, n = draft_ids.shape
    out = torch.full((batch, n + 1), -1, dtype=torch.int64)
    accepted = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        j = 0
        while j < n:
            x = ids[b][j]
            p, q, u = p_all[b, j, x], q_all[b, j, x], u_all[b, j]
            if not bool(u * q < p):  # float32 product and compare
                break
            out[b, j] = x
            j += 1
        p_row = p_all[b, j]
        token = -1
        if j < n:
            residual = (p_row - q_all[b, j]).tolist()  # float32 subtraction
            token = draw([weight(r) for r in residual], u_all[b, n])
        if token < 0:
            token = draw([weight(v) for v in p_row.tolist()], u_all[b, n])
        out[b, j] = max(token, 0)
        accepted[b] = j
    return out, accepted


def random_probs(*shape, sharp=2.0, zeros=0.0):
    logits = torch.randn(*shape, dtype=torch.float64) * sharp
    probs = torch.softmax(logits, -1)
    if zeros:
        keep = (torch.rand(*shape) >= zeros) | (logits == logits.amax(-1, keepdim=True))  # never an empty row
        probs = probs * keep
        probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-300)
    return probs.float()


def sample_drafts(q: torch.Tensor) -> torch.Tensor:
    batch, n, vocab = q.shape
    return torch.multinomial(q.reshape(-1, vocab).double(), 1).view(batch, n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("batch,n,vocab", [(1, 1, 1), (3, 1, 5), (7, 3, 1000), (4, 7, 32001), (2, 2, 151936)])
def test_matches_rule(device, id_dtype, batch, n, vocab):
    seed(device, id_dtype, batch, n, vocab)
    q = random_probs(batch, n, vocab, zeros=0.3)
    p = random_probs(batch, n + 1, vocab, zeros=0.3)
    # Mix: near-equal p and q accept often; unrelated ones reject often.
    p[: batch // 2, :n] = (0.8 * q[: batch // 2] + 0.2 * p[: batch // 2, :n])
    ids = sample_drafts(q).to(id_dtype)
    u = torch.rand(batch, n + 1)
    want_out, want_acc = reference(q, ids, p, u)
    out, acc = chain_speculative_sampling(q.to(device), ids.to(device), p.to(device), uniforms=u.to(device))
    assert out.dtype == id_dtype and acc.dtype == torch.int64
    assert torch.equal(out.cpu().long(), want_out), (out, want_out)
    assert torch.equal(acc.cpu(), want_acc)


@pytest.mark.parametrize("device", DEVICES)
def test_distribution(device):
    """Whatever the draft distribution, position j of the output follows target_probs[:, j]
    among the requests that accepted j drafts (chi-square, 200k requests, fixed seed)."""
    seed("distribution", device)
    batch, n, vocab = 200_000, 3, 8
    q = random_probs(1, n, vocab, sharp=1.5).expand(batch, n, vocab)
    p = random_probs(1, n + 1, vocab, sharp=1.5)
    p[0, 1, 3] = 0.0  # a zero-probability target token the draft proposes
    p[0, 1] /= p[0, 1].sum()
    p = p.expand(batch, n + 1, vocab)
    ids = torch.multinomial(q[0].double(), batch, replacement=True).t().contiguous()
    gen = torch.Generator(device=device).manual_seed(7)
    out, acc = chain_speculative_sampling(q.to(device), ids.to(device), p.to(device), generator=gen)
    out, acc = out.cpu(), acc.cpu()
    critical = 24.32  # chi-square, 7 degrees of freedom, p = 0.001
    for j in range(n + 1):
        rows = acc >= j
        tokens = out[rows, j]
        assert (tokens >= 0).all()
        observed = torch.bincount(tokens, minlength=vocab).double()
        expected = p[0, j].double() * rows.sum()
        assert observed[expected == 0].sum() == 0, f"position {j}: a zero-probability token was emitted"
        keep = expected > 0
        chi2 = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
        assert chi2 < critical, f"position {j}: chi-square {chi2:.1f} over {int(rows.sum())} requests"
    assert (out[acc < n].gather(1, acc[acc < n].unsqueeze(1) + 1) == -1).all()


@pytest.mark.parametrize("device", DEVICES)
def test_edge_cases(device):
    vocab = 6
    q = torch.tensor([[0.5, 0.5, 0, 0, 0, 0], [0, 0, 1.0, 0, 0, 0]]).unsqueeze(0)  # [1, 2, 6]
    p_same = torch.cat([q, torch.tensor([[[0, 0, 0, 0, 0, 1.0]]])], 1)
    ids = torch.tensor([[1, 2]])
    # p = q: every draft accepted even at u near 1, then the bonus from p[n] (token 5).
    u = torch.tensor([[0.99999994, 0.99999994, 0.3]])
    out, acc = chain_speculative_sampling(q.to(device), ids.to(device), p_same.to(device), uniforms=u.to(device))
    assert out.cpu().tolist() == [[1, 2, 5]] and acc.tolist() == [2]
    # p(x) = 0 < q(x): never accepted, even with u = 0; the residual max(0, p - q) is drawn.
    p_zero = torch.tensor([[[0, 0, 0, 1.0, 0, 0], [0, 0, 1.0, 0, 0, 0], [0, 0, 0, 0, 0, 1.0]]])
    u0 = torch.zeros(1, 3)
    out, acc = chain_speculative_sampling(q.to(device), ids.to(device), p_zero.to(device), uniforms=u0.to(device))
    assert out.cpu().tolist() == [[3, -1, -1]] and acc.tolist() == [0]
    # q(x) = 0 < p(x): always accepted.
    q0 = torch.tensor([[[0.0, 0.0, 1.0, 0, 0, 0], [0, 0, 0, 1.0, 0, 0]]])
    p_pos = torch.full((1, 3, vocab), 1.0 / vocab)
    out, acc = chain_speculative_sampling(q0.to(device), ids.to(device), p_pos.to(device),
                                          uniforms=torch.full((1, 3), 0.5, device=device))
    assert acc.tolist() == [2] and out.cpu().tolist()[0][:2] == [1, 2]
    # A rejection whose residual max(0, p - q) has no mass (p below q everywhere: probs used as
    # given, not renormalized): the token is drawn from p instead. n = 1.
    q_res = torch.tensor([[[0.5, 0.5, 0, 0, 0, 0]]])
    p_res = torch.tensor([[[0.4, 0.4, 0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0]]])
    out, acc = chain_speculative_sampling(q_res.to(device), torch.tensor([[1]], device=device), p_res.to(device),
                                          uniforms=torch.tensor([[0.9, 0.75]], device=device))
    assert acc.tolist() == [0] and out.cpu().tolist() == [[1, -1]]


def test_out_accepted_and_int32():
    q = random_probs(3, 2, 50)
    p = random_probs(3, 3, 50)
    ids = sample_drafts(q).int()
    buf = torch.full((3,), -7, dtype=torch.int32)
    out, acc = chain_speculative_sampling(q, ids, p, uniforms=torch.rand(3, 3), out_accepted=buf)
    assert acc is buf and out.dtype == torch.int32 and (buf >= 0).all()


def test_cpu_bad_inputs():
    q, p = random_probs(2, 2, 10), random_probs(2, 3, 10)
    ids = torch.tensor([[1, 2], [3, 4]])
    u = torch.rand(2, 3)
    cases = [
        (dict(draft_token_ids=torch.tensor([[1, 2], [3, 10]])), ValueError, r"draft_token_ids\[1, 1\] = 10"),
        (dict(draft_token_ids=torch.tensor([[1, -1], [3, 4]])), ValueError, r"draft_token_ids\[0, 1\] = -1"),
        (dict(target_probs=random_probs(2, 2, 10)), ValueError, "num_draft \\+ 1"),
        (dict(target_probs=random_probs(2, 3, 11)), ValueError, "target_probs"),
        (dict(draft_probs=q.double()), TypeError, "draft_probs"),
        (dict(draft_token_ids=ids.float()), TypeError, "draft_token_ids"),
        (dict(uniforms=torch.rand(2, 2)), ValueError, "uniforms"),
        (dict(uniforms=torch.tensor([[0.1, 1.0, 0.2], [0.1, 0.1, 0.1]])), ValueError, r"uniforms\[0, 1\] = 1"),
        (dict(draft_probs=q.transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "draft_probs"),
        (dict(out_accepted=torch.zeros(3, dtype=torch.int64)), ValueError, "out_accepted"),
        (dict(out_accepted=ids[:, 0]), ValueError, "out_accepted"),
    ]
    for change, error, message in cases:
        kwargs = dict(draft_probs=q, draft_token_ids=ids, target_probs=p, uniforms=u)
        kwargs.update(change)
        with pytest.raises(error, match=message):
            chain_speculative_sampling(kwargs.pop("draft_probs"), kwargs.pop("draft_token_ids"),
                                       kwargs.pop("target_probs"), **kwargs)
    with pytest.raises(ValueError, match="not both"):
        chain_speculative_sampling(q, ids, p, uniforms=u, generator=torch.Generator())


@cuda_only
def test_cuda_matches_cpu_at_scale():
    seed("cpu-cuda")
    batch, n, vocab = 16, 3, 151936
    q = random_probs(batch, n, vocab, sharp=3.0)
    p = random_probs(batch, n + 1, vocab, sharp=3.0)
    p[:8, :n] = 0.5 * q[:8] + 0.5 * p[:8, :n]
    ids = sample_drafts(q)
    u = torch.rand(batch, n + 1)
    cpu = chain_speculative_sampling(q, ids, p, uniforms=u)
    gpu = chain_speculative_sampling(q.cuda(), ids.cuda(), p.cuda(), uniforms=u.cuda())
    assert torch.equal(gpu[0].cpu(), cpu[0]) and torch.equal(gpu[1].cpu(), cpu[1])


@cuda_only
def test_cuda_bad_draft_id_recorded():
    pop_speculative_error()
    q, p = random_probs(2, 2, 10).cuda(), random_probs(2, 3, 10).cuda()
    ids = torch.tensor([[1, 2], [12, 4]], device="cuda")
    with pytest.raises(ValueError, match=r"\[2\] = 12 is out of range"):
        chain_speculative_sampling(q, ids, p, uniforms=torch.zeros(2, 3, device="cuda"))
    out, acc = chain_speculative_sampling(q, ids, p, uniforms=torch.zeros(2, 3, device="cuda"), check=False)
    assert acc[1].item() == 0 and out[1, 1:].tolist() == [-1, -1]  # rejected at the bad id
    assert pop_speculative_error() == (2, 12)


@cuda_only
def test_cuda_graph_replay():
    batch, n, vocab = 4, 3, 32000
    q = random_probs(batch, n, vocab).cuda()
    p = random_probs(batch, n + 1, vocab).cuda()
    ids = sample_drafts(q.cpu()).cuda()
    u = torch.rand(batch, n + 1, device="cuda")
    acc = torch.empty(batch, dtype=torch.int64, device="cuda")
    chain_speculative_sampling(q, ids, p, uniforms=u, out_accepted=acc)  # allocates the error record
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out, _ = chain_speculative_sampling(q, ids, p, uniforms=u, out_accepted=acc, check=False)
    torch.cuda.current_stream().wait_stream(stream)
    u.copy_(torch.rand(batch, n + 1, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    want_out, want_acc = reference(q, ids, p, u)
    assert torch.equal(out.cpu(), want_out) and torch.equal(acc.cpu(), want_acc)
