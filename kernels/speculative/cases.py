"""Speculative decoding: references of the rules, report checks and benchmark cases."""

from __future__ import annotations

import torch

from mllm_kernel.kernels.checks import Checks
from mllm_kernel.kernels.speculative import chain_speculative_sampling, tree_from_parents, tree_speculative_verify


def ref_weight(w: float) -> int:
    """A draw weight: the probability clamped to [0, 1] (NaN as 0) times 2^40, truncated."""
    return int(min(w, 1.0) * 2.0**40) if w > 0.0 else 0


def ref_draw(weights: list[int], u: float) -> int:
    """First index whose running weight exceeds floor(u * total); -1 without mass."""
    total = sum(weights)
    if total == 0:
        return -1
    target, running = int(float(u) * float(total)), 0
    for i, w in enumerate(weights):
        running += w
        if running > target:
            return i
    return len(weights) - 1


def ref_chain(draft_probs, draft_ids, target_probs, uniforms):
    """(output ids int64 [batch, n + 1], accepted counts int64 [batch]) by the module doc's rule."""
    q_all, p_all, u_all = draft_probs.float().cpu(), target_probs.float().cpu(), uniforms.float().cpu()
    batch, n = draft_ids.shape
    out = torch.full((batch, n + 1), -1, dtype=torch.int64)
    accepted = torch.zeros(batch, dtype=torch.int64)
    for b, ids in enumerate(draft_ids.cpu().tolist()):
        j = 0
        while j < n and bool(u_all[b, j] * q_all[b, j, ids[j]].clamp_min(0) < p_all[b, j, ids[j]]):
            out[b, j] = ids[j]
            j += 1
        token = -1
        if j < n:
            token = ref_draw([ref_weight(v) for v in (p_all[b, j] - q_all[b, j]).tolist()], u_all[b, n])
        if token < 0:
            token = ref_draw([ref_weight(v) for v in p_all[b, j].tolist()], u_all[b, n])
        out[b, j], accepted[b] = max(token, 0), j
    return out, accepted


def ref_greedy_walk(candidates, next_token, next_sibling, logits, width):
    """accepted_index / accepted_token_ids / accepted_length of greedy tree verification."""
    best = logits.float().cpu().argmax(-1).view(candidates.shape).tolist()
    cand, first, sib = (t.cpu().tolist() for t in (candidates, next_token, next_sibling))
    index, tokens, lengths = [], [], []
    for b in range(len(cand)):
        path, toks, cur = [0], [], 0
        while len(path) < width:
            c = first[b][cur]
            while c != -1 and cand[b][c] != best[b][cur]:
                c = sib[b][c]
            if c == -1:
                break
            path.append(c)
            toks.append(best[b][cur])
            cur = c
        toks.append(best[b][cur])
        lengths.append(len(path) - 1)
        index.append(path + [-1] * (width - len(path)))
        tokens.append(toks + [-1] * (width - len(toks)))
    return torch.tensor(index), torch.tensor(tokens), torch.tensor(lengths)


def _probs(c: Checks, *shape) -> torch.Tensor:
    return torch.softmax(c.randn(*shape, dtype=torch.float64, scale=2.0), -1).float()


def check(c: Checks) -> None:
    def chain():
        q, p = _probs(c, 3, 4, 500), _probs(c, 3, 5, 500)
        p[:2, :4] = 0.7 * q[:2] + 0.3 * p[:2, :4]  # most drafts accepted in two requests
        ids = torch.multinomial(q.reshape(-1, 500).double().cpu(), 1, generator=c.gen).view(3, 4).to(q.device)
        u = torch.rand(3, 5, generator=c.gen).to(q.device)
        out, acc = chain_speculative_sampling(q, ids, p, uniforms=u)
        want_out, want_acc = ref_chain(q, ids, p, u)
        c.equal("chain_speculative_sampling", torch.cat([out, acc[:, None]], 1), torch.cat([want_out, want_acc[:, None]], 1))

    def tree():
        parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3], [-1, 0, 1, 2, 3, 4, 5]])
        logits = c.randn(14, 300)
        best = logits.argmax(-1).view(2, 7).cpu()
        tokens = torch.stack([best[b, parents[b].clamp_min(0)] for b in range(2)])  # children carry the argmax
        tokens[0, 2] = (tokens[0, 2] + 1) % 300
        lists = [t.to(logits.device) for t in tree_from_parents(parents, tokens)]
        got = tree_speculative_verify(*lists, target_logits=logits, greedy=True)
        want = ref_greedy_walk(*(lists[0], lists[2], lists[3]), logits, 7)
        c.equal("tree_speculative_verify (greedy)", torch.cat([g.cpu() for g in got[:2]], 1), torch.cat(want[:2], 1))

    c.run("chain_speculative_sampling", chain)
    c.run("tree_speculative_verify", tree)


# ----------------------------------------------------------------------------- benchmarks


def eager_chain(q, ids, p, u):
    """Chain rejection sampling in torch ops (same accept test; a float cumsum for the draw)."""
    batch, n, vocab = q.shape
    rows = torch.arange(batch, device=q.device)
    idx = ids.long().unsqueeze(-1)
    rejected = ~(u[:, :n] * q.gather(2, idx).squeeze(-1).clamp_min(0) < p[:, :n].gather(2, idx).squeeze(-1))
    first = torch.where(rejected.any(1), rejected.int().argmax(1), n)
    p_j = p[rows, first]
    q_j = torch.where((first < n).unsqueeze(-1), q[rows, first.clamp_max(n - 1)], 0.0)
    w = (p_j - q_j).clamp_min(0.0)
    w = torch.where(w.sum(-1, keepdim=True) > 0, w, p_j)
    cdf = w.cumsum(-1)
    token = torch.searchsorted(cdf, u[:, n:] * cdf[:, -1:], right=True).clamp_max(vocab - 1).squeeze(-1)
    cols = torch.arange(n + 1, device=q.device)
    out = torch.where(cols < first.unsqueeze(-1), torch.cat([ids.long(), ids.new_zeros(batch, 1).long()], 1), -1)
    out[rows, first] = token
    return out, first


def benchmark_cases(device: str) -> list[dict]:
    cases = []
    for batch, n, vocab in ((1, 3, 32000), (16, 3, 32000)) if device == "cpu" else ((1, 3, 151936), (64, 7, 151936)):
        g = torch.Generator().manual_seed(batch + n)
        q = torch.softmax(torch.randn(batch, n, vocab, generator=g) * 3, -1).to(device)
        p = torch.softmax(torch.randn(batch, n + 1, vocab, generator=g) * 3, -1).to(device)
        ids = torch.multinomial(q.view(-1, vocab).cpu(), 1, generator=g).view(batch, n).to(device)
        u = torch.rand(batch, n + 1, generator=g).to(device)
        cases.append({
            "op": "chain_speculative_sampling", "shape": f"{batch}x{n}x{vocab}", "dtype": "float32",
            # The rows a request must read: its residual (p and q) or bonus row.
            "bytes": batch * 2 * vocab * 4,
            "ours": lambda q=q, i=ids, p=p, u=u: chain_speculative_sampling(q, i, p, uniforms=u, check=False),
            "eager": lambda q=q, i=ids, p=p, u=u: eager_chain(q, i, p, u),
            "check": False,  # the same accepted counts, but a float cumsum may pick another token at a boundary
        })
    return cases
