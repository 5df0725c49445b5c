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
@pytest.mark.parametrize("batch,n,vocab", [(1, 1, 1), (3, 1, 5), (7, 3, 1000), (4, 7, 32001), (2, 2, 151936),
                                          (1, 1, 300_001)])  # the last: wider chunks on CUDA
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
    assert pop_speculative_error() == ("chain_speculative_sampling", 2, 12)


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


# ----------------------------------------------------------------------------- trees

from mllm_kernel.kernels.speculative import (  # noqa: E402
    build_tree_attention_mask,
    tree_from_parents,
    tree_speculative_verify,
)


def random_parents(batch, nodes, max_children=4, max_depth=8):
    """Parent lists in topological order with bounded branching and depth."""
    parents = torch.full((batch, nodes), -1, dtype=torch.int64)
    for b in range(batch):
        depth, children = [0], [0] * nodes
        for i in range(1, nodes):
            options = [j for j in range(i) if children[j] < max_children and depth[j] < max_depth]
            j = options[torch.randint(len(options), ()).item()]
            parents[b, i] = j
            children[j] += 1
            depth.append(depth[j] + 1)
    return parents


def plain_lists(parents):
    """first child / next sibling by a plain loop over the parents (children in index order)."""
    batch, nodes = parents.shape
    first = [[-1] * nodes for _ in range(batch)]
    sibling = [[-1] * nodes for _ in range(batch)]
    for b in range(batch):
        last = {}
        for i in range(1, nodes):
            p = int(parents[b, i])
            if first[b][p] == -1:
                first[b][p] = i
            else:
                sibling[b][last[p]] = i
            last[p] = i
    return torch.tensor(first), torch.tensor(sibling)


def walk(candidates, first, sibling, rows, pick, width):
    """The documented walk of one request: pick(row) is the target's token at a node."""
    path, tokens, cur = [0], [], 0
    while True:
        token = pick(rows[cur], cur)
        if len(path) >= width:
            break
        c, nxt = first[cur], -1
        while c != -1:
            if candidates[c] == token:
                nxt = c
                break
            c = sibling[c]
        if nxt < 0:
            break
        path.append(nxt)
        tokens.append(token)
        cur = nxt
    tokens.append(token)
    pad = [-1] * (width - len(path))
    return path + pad, tokens + pad, len(path) - 1


def test_tree_from_parents_matches_plain_loop():
    seed("tree-lists")
    parents = random_parents(5, 26)
    tokens = torch.randint(0, 100, (5, 26), dtype=torch.int32)
    candidates, retrieve, first, sibling = tree_from_parents(parents, tokens)
    want_first, want_sibling = plain_lists(parents)
    assert torch.equal(first.long(), want_first) and torch.equal(sibling.long(), want_sibling)
    assert torch.equal(candidates, tokens) and candidates.dtype == torch.int32
    assert torch.equal(retrieve.long(), torch.arange(5 * 26).view(5, 26))
    with pytest.raises(ValueError, match="topological"):
        tree_from_parents(torch.tensor([[-1, 0, 3, 1]]), torch.zeros(1, 4, dtype=torch.int64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch,nodes", [(6, 1), (6, 2), (6, 8), (6, 26), (6, 63), (40, 26)])
@pytest.mark.parametrize("greedy", [True, False])
def test_tree_verify_matches_walk(device, batch, nodes, greedy):
    """Random trees against the documented walk. On an H100 (132 SMs) 40 x 26 node rows take the
    walk-only plan, the others the pick-every-node-first plan."""
    seed("tree", device, nodes, greedy)
    vocab = 50
    parents = random_parents(batch, nodes)
    probs = random_probs(batch, nodes, vocab, sharp=1.0)
    # A child carries its parent's argmax or a draw from its parent's row: paths get long, and
    # siblings sometimes repeat a token.
    tokens = torch.zeros(batch, nodes, dtype=torch.int64)
    for b in range(batch):
        for i in range(1, nodes):
            p = int(parents[b, i])
            tokens[b, i] = probs[b, p].argmax() if torch.rand(()) < 0.5 else torch.multinomial(probs[b, p], 1)
    candidates, retrieve, first, sibling = tree_from_parents(parents, tokens)
    u = torch.rand(batch, nodes)
    if greedy:
        got = tree_speculative_verify(*(t.to(device) for t in (candidates, retrieve, first, sibling)),
                                      target_logits=torch.log(probs).to(device), greedy=True)
    else:
        got = tree_speculative_verify(*(t.to(device) for t in (candidates, retrieve, first, sibling)), probs.to(device),
                                      greedy=False, uniforms=u.to(device))
    for b in range(batch):
        if greedy:
            pick = lambda row, cur: int(row.argmax())  # noqa: E731
        else:
            pick = lambda row, cur, b=b: max(draw([weight(v) for v in row.tolist()], u[b, cur]), 0)  # noqa: E731
        path, toks, length = walk(tokens[b].tolist(), first[b].tolist(), sibling[b].tolist(), probs[b], pick, nodes)
        assert got[0][b].tolist() == path and got[1][b].tolist() == toks and got[2][b].item() == length, b


@pytest.mark.parametrize("device", DEVICES)
def test_tree_distribution(device):
    """Whatever the tree, the first emitted token follows the root's target distribution, and
    the one after an accepted child its row's (chi-square, 200k requests)."""
    seed("tree-distribution", device)
    batch, vocab = 200_000, 8
    parents = torch.tensor([[-1, 0, 0, 0, 1, 1, 2]]).expand(batch, 7)
    tokens = torch.tensor([[0, 2, 5, 2, 1, 7, 0]]).expand(batch, 7)  # siblings 1 and 3 share token 2
    candidates, retrieve, first, sibling = tree_from_parents(parents, tokens)
    rows = random_probs(1, 7, vocab, sharp=1.2)
    rows[0, 0, 5] = 0.0  # the root's target never emits token 5: child 2 is never accepted
    rows[0, 0] /= rows[0, 0].sum()
    probs = rows.expand(batch, 7, vocab).reshape(batch * 7, vocab)
    gen = torch.Generator(device=device).manual_seed(11)
    index, toks, length = tree_speculative_verify(*(t.to(device) for t in (candidates, retrieve, first, sibling)),
                                                  probs.to(device), greedy=False, generator=gen)
    index, toks, length = index.cpu(), toks.cpu(), length.cpu()
    critical = 24.32  # 7 degrees of freedom, p = 0.001
    for rows_mask, node, position in [(torch.ones(batch, dtype=torch.bool), 0, 0),
                                      (index[:, 1] == 1, 1, 1)]:
        observed = torch.bincount(toks[rows_mask, position], minlength=vocab).double()
        expected = rows[0, node].double() * rows_mask.sum()
        assert observed[expected == 0].sum() == 0
        keep = expected > 0
        chi2 = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
        assert chi2 < critical, f"node {node}: chi-square {chi2:.1f}"
    assert not (index == 2).any() and not (index == 3).any()  # token 2 goes to child 1, the first sibling


def test_tree_cpu_bad_inputs_write_nothing():
    parents = torch.tensor([[-1, 0, 0, 1]])
    candidates, retrieve, first, sibling = tree_from_parents(parents, torch.tensor([[0, 1, 2, 3]]))
    probs = random_probs(4, 10)
    cases = [
        (dict(next_token=torch.tensor([[1, 4, -1, -1]])), "next_token\\[0, 1\\] = 4"),
        (dict(next_sibling=torch.tensor([[-1, 2, 0, -1]])), "next_sibling\\[0, 2\\] = 0"),
        (dict(next_sibling=torch.tensor([[-1, 2, 1, -1]])), "reached twice"),
        (dict(retrieve_index=torch.tensor([[0, 1, 2, 4]])), "retrieve_index\\[0, 3\\] = 4"),
        (dict(uniforms=torch.tensor([[0.5, 1.0, 0.1, 0.1]])), "uniforms\\[0, 1\\]"),
        (dict(candidates=candidates.int()), "retrieve_index"),
    ]
    for change, message in cases:
        args = dict(candidates=candidates, retrieve_index=retrieve, next_token=first, next_sibling=sibling,
                    uniforms=torch.rand(1, 4))
        args.update(change)
        with pytest.raises((ValueError, TypeError), match=message):
            tree_speculative_verify(args["candidates"], args["retrieve_index"], args["next_token"],
                                    args["next_sibling"], probs, greedy=False, uniforms=args["uniforms"])
    with pytest.raises(ValueError, match="target_logits"):
        tree_speculative_verify(candidates, retrieve, first, sibling, target_logits=probs, greedy=False)
    with pytest.raises(ValueError, match="exactly one"):
        tree_speculative_verify(candidates, retrieve, first, sibling, greedy=True)


@pytest.mark.parametrize("device", DEVICES)
def test_tree_max_depth_caps_the_path(device):
    parents = torch.tensor([[-1, 0, 1, 2]])
    probs = torch.zeros(4, 5)
    probs[0, 1] = probs[1, 2] = probs[2, 3] = probs[3, 4] = 1.0
    lists = tree_from_parents(parents, torch.tensor([[0, 1, 2, 3]]))
    index, toks, length = tree_speculative_verify(*(t.to(device) for t in lists), probs.to(device), greedy=True,
                                                  max_depth=2)
    assert index.tolist() == [[0, 1, 2]] and toks.tolist() == [[1, 2, 3]] and length.tolist() == [2]
    index, toks, length = tree_speculative_verify(*(t.to(device) for t in lists), probs.to(device), greedy=True)
    assert index.tolist() == [[0, 1, 2, 3]] and toks.tolist() == [[1, 2, 3, 4]] and length.tolist() == [3]


@cuda_only
def test_tree_cuda_bad_link_recorded():
    pop_speculative_error()
    candidates = torch.tensor([[0, 1, 2, 3]], device="cuda")
    retrieve = torch.arange(4, device="cuda").view(1, 4)
    first = torch.tensor([[1, 7, -1, -1]], device="cuda")  # node 1 links to 7: out of range
    sibling = torch.full((1, 4), -1, device="cuda")
    probs = torch.zeros(4, 5, device="cuda")
    probs[:, 1] = 1.0
    with pytest.raises(ValueError, match=r"node \(flattened\)\[1\] has a bad link or row, 7"):
        tree_speculative_verify(candidates, retrieve, first, sibling, probs, greedy=True)
    index, toks, length = tree_speculative_verify(candidates, retrieve, first, sibling, probs, greedy=True,
                                                  check=False)
    assert index.tolist() == [[0, 1, -1, -1]] and toks.tolist() == [[1, 1, -1, -1]] and length.tolist() == [1]
    assert pop_speculative_error() == ("tree_speculative_verify", 1, 7)


def plain_mask(parents, prefix_lens):
    rows = []
    positions = []
    for b in range(parents.shape[0]):
        nodes = parents.shape[1]
        prefix = int(prefix_lens[b])
        pos = []
        for i in range(nodes):
            seen, j, depth = set(), i, 0
            while j != -1:
                seen.add(j)
                j = int(parents[b, j])
                depth += j != -1
            rows += [True] * prefix + [k in seen for k in range(nodes)]
            pos.append(prefix + depth)
        positions.append(pos)
    return torch.tensor(rows, dtype=torch.bool), torch.tensor(positions)


@pytest.mark.parametrize("device", DEVICES)
def test_tree_attention_mask(device):
    seed("mask", device)
    parents = random_parents(3, 26)
    prefix_lens = torch.tensor([0, 5, 17])
    want_mask, want_pos = plain_mask(parents, prefix_lens)
    mask, pos = build_tree_attention_mask(parents.to(device), prefix_lens.to(device))
    assert mask.dtype == torch.bool and torch.equal(mask.cpu(), want_mask) and torch.equal(pos.cpu(), want_pos)
    mask, _ = build_tree_attention_mask(parents.to(device), prefix_lens.to(device), mask_numel=want_mask.numel())
    assert torch.equal(mask.cpu(), want_mask)


@pytest.mark.parametrize("device", DEVICES)
def test_tree_greedy_argmax_ties_and_nan(device):
    """Greedy picks torch.argmax's token: the first of equal maxima even when CUDA splits a row
    into slices, and the first NaN over any number."""
    vocab = 100_003
    parents = torch.tensor([[-1, 0, 0, 1]])
    logits = torch.zeros(4, vocab)
    logits[0, [70_000, 9_000, 99_999]] = 5.0  # the maximum three times: 9000 is the first
    logits[1, [3, 80_000]] = float("nan")  # the first NaN wins
    logits[1, 5] = float("inf")
    logits[2, :] = -1.0  # all equal: token 0
    logits[3, 12_345] = 1.0
    tokens = torch.tensor([[0, 9_000, 4, 3]])  # child 1 carries the root's pick; node 3 (child of 1) carries node 1's
    lists = tree_from_parents(parents, tokens)
    index, toks, length = tree_speculative_verify(*(t.to(device) for t in lists), target_logits=logits.to(device),
                                                  greedy=True)
    assert index.tolist() == [[0, 1, 3, -1]] and toks.tolist() == [[9_000, 3, 12_345, -1]] and length.tolist() == [2]


@pytest.mark.parametrize("device", DEVICES)
def test_tree_mask_drives_paged_prefill_attention(device):
    """The mask and positions feed paged_prefill_attention's custom_mask: each tree token attends
    to the prefix, its ancestors and itself (float64 attention over exactly those keys)."""
    from mllm_kernel.kernels.prefill_attention import paged_prefill_attention

    seed("mask-attention", device)
    batch, nodes, heads, kv_heads, dim, block = 2, 8, 4, 2, 64, 4
    parents = random_parents(batch, nodes)
    prefix_lens = torch.tensor([5, 11])
    mask, positions = build_tree_attention_mask(parents, prefix_lens)
    lens_k = (prefix_lens + nodes).tolist()
    blocks = [(n + block - 1) // block for n in lens_k]
    k_cache = torch.zeros(sum(blocks), block, kv_heads, dim)
    v_cache = torch.zeros_like(k_cache)
    table = torch.zeros(batch, max(blocks), dtype=torch.int32)
    keys, values, first = [], [], 0
    for b, n in enumerate(lens_k):
        k, v = torch.randn(n, kv_heads, dim), torch.randn(n, kv_heads, dim)
        keys.append(k)
        values.append(v)
        table[b, :blocks[b]] = torch.arange(first, first + blocks[b], dtype=torch.int32)
        for t in range(n):
            k_cache[first + t // block, t % block], v_cache[first + t // block, t % block] = k[t], v[t]
        first += blocks[b]
    dtype = torch.float32 if device == "cpu" else torch.bfloat16  # CUDA prefill takes 16-bit floats
    q = torch.randn(batch * nodes, heads, dim).to(dtype)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    keys, values = [k.to(dtype) for k in keys], [v.to(dtype) for v in values]
    cu = torch.tensor([0, nodes, 2 * nodes], dtype=torch.int32)
    out = paged_prefill_attention(q.to(device), k_cache.to(device), v_cache.to(device), table.to(device), cu.to(device),
                                  torch.tensor(lens_k, dtype=torch.int32).to(device), custom_mask=mask.to(device))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    want_mask, want_pos = plain_mask(parents, prefix_lens)
    assert torch.equal(positions, want_pos)
    start = 0
    for b, n in enumerate(lens_k):
        allowed = want_mask[start:start + nodes * n].view(nodes, n)
        start += nodes * n
        for i in range(nodes):
            for h in range(heads):
                kh = h // (heads // kv_heads)
                s = (keys[b][:, kh].double() @ q[b * nodes + i, h].double()) / dim**0.5
                p = torch.softmax(s.masked_fill(~allowed[i], float("-inf")), 0)
                want = p @ values[b][:, kh].double()
                torch.testing.assert_close(out[b * nodes + i, h].cpu().double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_tree_attention_mask_unchecked(device):
    """check=False reads nothing on the host (mask_numel given); a wrong mask_numel cuts the mask
    short or pads it with False, never indexes out of bounds; check=True names the mismatch."""
    parents = random_parents(2, 8).to(device)
    prefix_lens = torch.tensor([3, 4], device=device)
    want, _ = build_tree_attention_mask(parents, prefix_lens)
    for numel in (want.numel(), want.numel() - 9, want.numel() + 9):
        got, _ = build_tree_attention_mask(parents, prefix_lens, mask_numel=numel, check=False)
        n = min(numel, want.numel())
        assert got.numel() == numel and torch.equal(got[:n], want[:n]) and not got[n:].any()
    with pytest.raises(ValueError, match="mask_numel = 5"):
        build_tree_attention_mask(parents, prefix_lens, mask_numel=5)
    with pytest.raises(ValueError, match="prefix_lens must be in"):
        build_tree_attention_mask(parents, torch.tensor([3, -1], device=device))


@cuda_only
@pytest.mark.parametrize("batch", [2, 40])  # both plans on an H100
def test_tree_cuda_graph_replay(batch):
    """tree_speculative_verify (unchecked) and build_tree_attention_mask (check=False, mask_numel
    given) captured once, replayed on new target rows and uniforms."""
    seed("tree-graph", batch)
    nodes, vocab = 26, 1000
    parents = random_parents(batch, nodes)
    lists = [t.cuda() for t in tree_from_parents(parents, torch.randint(0, 3, (batch, nodes)))]
    probs = random_probs(batch * nodes, vocab, sharp=3.0).cuda()
    u = torch.rand(batch, nodes, device="cuda")
    prefix = torch.full((batch,), 9, device="cuda")
    parents_cuda = parents.cuda()
    numel = batch * nodes * (9 + nodes)
    tree_speculative_verify(*lists, probs, greedy=False, uniforms=u)  # allocates the error record
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        sampled = tree_speculative_verify(*lists, probs, greedy=False, uniforms=u, check=False)
        greedy = tree_speculative_verify(*lists, target_logits=probs, greedy=True, check=False)
        mask, _ = build_tree_attention_mask(parents_cuda, prefix, mask_numel=numel, check=False)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        probs.copy_(random_probs(batch * nodes, vocab, sharp=3.0))
        u.copy_(torch.rand(batch, nodes))
        graph.replay()
        torch.cuda.synchronize()
        for got, kwargs in ((sampled, dict(target_probs=probs, greedy=False, uniforms=u)),
                            (greedy, dict(target_logits=probs, greedy=True))):
            want = tree_speculative_verify(*lists, **kwargs)
            assert all(torch.equal(g, w) for g, w in zip(got, want))
        assert torch.equal(mask, build_tree_attention_mask(parents_cuda, prefix)[0])


def test_tree_target_views_and_numpy_scalars():
    """A [batch, D, vocab] target that is a view with D = 1 (any row stride) is accepted, and so
    are numpy integers for max_depth."""
    import numpy as np

    probs = torch.softmax(torch.randn(2, 3, 10), -1)[:, :1]  # strides (30, 10, 1)
    lists = tree_from_parents(torch.full((2, 1), -1), torch.zeros(2, 1, dtype=torch.int64))
    index, toks, length = tree_speculative_verify(*lists, target_logits=probs, greedy=True, max_depth=np.int64(0))
    assert toks[:, 0].tolist() == probs[:, 0].argmax(-1).tolist() and length.tolist() == [0, 0]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
