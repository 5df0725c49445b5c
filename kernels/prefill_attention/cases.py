"""prefill_attention and paged_prefill_attention: float64 references, ragged and paged test
inputs (with tree masks), report checks and benchmark cases.

The references build each request's (query, key) mask from the rules in plain torch, gather the
paged keys with indexing and do the attention in float64; they share no code with the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mllm_kernel.kernels.checks import FLOATS, Checks, bench_case, dtype_name
from mllm_kernel.kernels.prefill_attention import paged_prefill_attention, prefill_attention

NEG_INF = float("-inf")
REF_ROWS = 1024  # query rows per step of ref_attention


# ----------------------------------------------------------------------------- references


def allowed_keys(len_q: int, len_k: int, causal: bool = True, sliding_window: int = -1,
                 custom: torch.Tensor | None = None) -> torch.Tensor:
    """bool [len_q, len_k]: which keys each query of one request attends to. Query j sits at
    position j + len_k - len_q; causal keeps keys t <= position, a custom mask replaces that rule,
    a window W > 0 keeps position - W < t <= position on top."""
    pos = torch.arange(len_q).unsqueeze(1) + (len_k - len_q)
    t = torch.arange(len_k).unsqueeze(0)
    if custom is not None:
        keep = custom.reshape(len_q, len_k).cpu().bool()
    elif causal:
        keep = t <= pos
    else:
        keep = torch.ones(len_q, len_k, dtype=torch.bool)
    if sliding_window > 0:
        keep = keep & (t <= pos) & (t > pos - sliding_window)
    return keep


def ref_attention(q, k, v, keep, scale, logits_soft_cap=0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """out [Lq, H, D], lse [Lq, H] in float64 on the CPU for one request: q [Lq, H, D], k, v
    [Lk, KH, D], keep bool [Lq, Lk]. A query without keys: out 0, lse -inf. Computed in float64 on
    q's device (a GPU's float64 products are as exact as the CPU's and far faster on the long
    CUDA cases), REF_ROWS query rows at a time so that the logits stay small."""
    len_q, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    device = q.device
    kd, vd, keep = k.double().to(device), v.double().to(device), keep.to(device)
    outs, lses = [torch.zeros(0, num_heads, head_dim, dtype=torch.float64)], [torch.zeros(0, num_heads, dtype=torch.float64)]
    for r0 in range(0, len_q, REF_ROWS):
        rows = min(REF_ROWS, len_q - r0)
        qd = q[r0:r0 + rows].double().reshape(rows, num_kv_heads, group, head_dim)
        logits = torch.einsum("qkgd,nkd->kgqn", qd, kd) * scale  # [KH, G, rows, Lk]
        if logits_soft_cap > 0:
            logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
        logits = logits.masked_fill(~keep[r0:r0 + rows], NEG_INF)
        lse = torch.logsumexp(logits, dim=-1)  # [KH, G, rows]
        finite = torch.isfinite(lse)
        p = torch.exp(logits - torch.where(finite, lse, 0.0).unsqueeze(-1))
        p = torch.where(finite.unsqueeze(-1), p, 0.0)
        outs.append(torch.einsum("kgqn,nkd->qkgd", p, vd).reshape(rows, num_heads, head_dim).cpu())
        lses.append(lse.permute(2, 0, 1).reshape(rows, num_heads).cpu())
    return torch.cat(outs), torch.cat(lses)


def ref_prefill_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True, scale=None, sliding_window=-1,
                          logits_soft_cap=0.0, custom_masks=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) float64 on the CPU for a ragged batch; custom_masks: a list of per-request
    bool [len_q, len_k] masks (None: the causal / full rule)."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full(q.shape[:2], NEG_INF, dtype=torch.float64)
    for i in range(len(cq) - 1):
        len_q, len_k = cq[i + 1] - cq[i], ck[i + 1] - ck[i]
        if len_q == 0:
            continue
        custom = None if custom_masks is None else custom_masks[i]
        keep = allowed_keys(len_q, len_k, causal, sliding_window, custom)
        o, l = ref_attention(q[cq[i]:cq[i + 1]], k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]], keep, scale, logits_soft_cap)
        out[cq[i]:cq[i + 1]], lse[cq[i]:cq[i + 1]] = o, l
    return out, lse


def gather_paged(k_cache, v_cache, block_table, seq_lens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The paged keys as ragged k, v [sum seq_lens, KH, D] and their cu_seqlens_k."""
    block_size = k_cache.shape[1]
    ks, vs, cu = [], [], [0]
    table = block_table.cpu().long()
    for b, n in enumerate(seq_lens.tolist()):
        t = torch.arange(n)
        blocks = table[b, t // block_size].to(k_cache.device)
        ks.append(k_cache[blocks, (t % block_size).to(k_cache.device)])
        vs.append(v_cache[blocks, (t % block_size).to(k_cache.device)])
        cu.append(cu[-1] + n)
    if not ks:  # no requests
        empty = k_cache.new_empty(0, *k_cache.shape[2:])
        return empty, empty.clone(), torch.tensor(cu, dtype=torch.int32)
    return torch.cat(ks), torch.cat(vs), torch.tensor(cu, dtype=torch.int32)


def ref_paged_prefill_attention(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, causal=True,
                                custom_masks=None, scale=None, sliding_window=-1, logits_soft_cap=0.0):
    k, v, cu_k = gather_paged(k_cache, v_cache, block_table, seq_lens)
    return ref_prefill_attention(q, k, v, cu_seqlens_q, cu_k, causal, scale, sliding_window, logits_soft_cap,
                                 custom_masks)


def tree_mask(prefix: int, draft: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """bool [draft, prefix + draft]: a random draft tree (token i's parent is a random earlier
    token or the prefix); each draft token sees the whole prefix, its ancestors and itself."""
    parents = [int(torch.randint(-1, i, (1,), generator=gen)) if i > 0 else -1 for i in range(draft)]
    mask = torch.zeros(draft, prefix + draft, dtype=torch.bool)
    mask[:, :prefix] = True
    for i in range(draft):
        j = i
        while j >= 0:
            mask[i, prefix + j] = True
            j = parents[j]
    return mask


# ----------------------------------------------------------------------------- inputs


def _cu(lens) -> torch.Tensor:
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + int(n))
    return torch.tensor(cu, dtype=torch.int32)


@dataclass
class RaggedCase:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor

    def args(self) -> tuple:
        return self.q, self.k, self.v, self.cu_seqlens_q, self.cu_seqlens_k

    def ref(self, **kw):
        return ref_prefill_attention(*self.args(), **kw)


def make_ragged_case(lens_q, lens_k=None, num_heads=8, num_kv_heads=2, head_dim=128, dtype=torch.float32,
                     device="cpu", gen=None, q_scale=1.0, token_pad=0) -> RaggedCase:
    """q ~ N(0, q_scale^2), K, V ~ N(0, 1), drawn in float32 on the CPU and rounded to dtype;
    lens_k defaults to lens_q. token_pad > 0: q, k, v are head slices of wider rows (a token
    stride larger than heads * head_dim)."""
    lens_k = lens_q if lens_k is None else lens_k
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, num_heads + token_pad, head_dim, generator=gen) * q_scale
    kv = torch.randn(2, tk, num_kv_heads + token_pad, head_dim, generator=gen)
    q = q.to(dtype).to(device)[:, :num_heads]
    k, v = (x.to(dtype).to(device)[:, :num_kv_heads] for x in kv)
    return RaggedCase(q, k, v, _cu(lens_q).to(device), _cu(lens_k).to(device))


@dataclass
class PagedPrefillCase:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor

    def args(self) -> tuple:
        return self.q, self.k_cache, self.v_cache, self.block_table, self.cu_seqlens_q, self.seq_lens

    def ref(self, **kw):
        return ref_paged_prefill_attention(*self.args(), **kw)

    def ragged(self) -> RaggedCase:
        """The same data as ragged K/V (the paged keys gathered)."""
        k, v, cu_k = gather_paged(self.k_cache, self.v_cache, self.block_table, self.seq_lens)
        return RaggedCase(self.q, k, v, self.cu_seqlens_q, cu_k.to(self.q.device))


def make_paged_prefill_case(lens_q, lens_k, num_heads=8, num_kv_heads=2, head_dim=128, block_size=16,
                            dtype=torch.float32, device="cpu", gen=None, spare_blocks=3, pad_id=-1,
                            q_scale=1.0) -> PagedPrefillCase:
    """Random inputs of one prefill step over a paged cache whose block ids are a random
    permutation (each request's blocks neither contiguous nor ordered); each block-table row's
    unused tail (and one spare column) holds pad_id."""
    need = [-(-int(n) // block_size) for n in lens_k]
    num_blocks = sum(need) + spare_blocks
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.full((len(lens_k), max([1, *need]) + 1), pad_id, dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(ids[at:at + n], dtype=torch.int32)
        at += n
    q = (torch.randn(sum(lens_q), num_heads, head_dim, generator=gen) * q_scale).to(dtype).to(device)
    kv = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    return PagedPrefillCase(q, kv[0], kv[1], table.to(device), _cu(lens_q).to(device),
                            torch.tensor([int(n) for n in lens_k], dtype=torch.int32, device=device))


# ----------------------------------------------------------------------------- report checks


def check(c: Checks) -> None:
    dtypes = FLOATS if c.device == "cpu" else (torch.float16, torch.bfloat16)
    for dtype in dtypes:
        n = dtype_name(dtype)

        def ragged():
            case = make_ragged_case([1, 17, 70], [5, 17, 90], 8, 2, 64, dtype, c.device, c.gen)
            c.close(f"prefill_attention {n}", [prefill_attention(*case.args())], [case.ref()[0]])

        def paged_tree():
            case = make_paged_prefill_case([6, 3], [40, 3], 8, 2, 64, 16, dtype, c.device, c.gen)
            masks = [tree_mask(34, 6, c.gen), tree_mask(0, 3, c.gen)]
            flat = torch.cat([m.flatten() for m in masks]).to(c.device)
            got = paged_prefill_attention(*case.args(), custom_mask=flat)
            c.close(f"paged_prefill_attention[tree mask] {n}", [got], [case.ref(custom_masks=masks)[0]])

        c.run(f"prefill_attention {n}", ragged)
        c.run(f"paged_prefill_attention[tree mask] {n}", paged_tree)


# ----------------------------------------------------------------------------- benchmarks


def _case(device, batch, seq, dtype, causal=True, num_heads=32, num_kv_heads=8, head_dim=128):
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch * seq, num_heads, head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(batch * seq, num_kv_heads, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(batch * seq, num_kv_heads, head_dim, device=device, dtype=dtype, generator=gen)
    cu = torch.arange(0, batch * seq + 1, seq, dtype=torch.int32, device=device)
    q4, k4, v4 = (x.view(batch, seq, -1, head_dim).transpose(1, 2) for x in (q, k, v))

    def ours():
        return prefill_attention(q, k, v, cu, cu, causal=causal)

    def eager():
        out = torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, enable_gqa=True)
        return out.transpose(1, 2).reshape(batch * seq, num_heads, head_dim)

    # The least bytes moved: q, k, v read and out written once (the op is compute-bound;
    # benchmarks/bench_prefill_attention.py reports TFLOP/s).
    nbytes = (2 * q.numel() + k.numel() + v.numel()) * q.element_size()
    return bench_case("prefill_attention", f"B={batch} seq={seq} H={num_heads}/{num_kv_heads} D={head_dim} "
                      f"{'causal' if causal else 'full'}", dtype, ours, eager, nbytes)


def benchmark_cases(device: str) -> list[dict]:
    if device == "cuda":
        grid = [(torch.bfloat16, 16, 1024), (torch.bfloat16, 2, 4096)]
    else:
        grid = [(torch.float32, 1, 512), (torch.bfloat16, 1, 512)]
    return [_case(device, batch, seq, dtype) for dtype, batch, seq in grid]
