"""decode_attention and merge_attention_states: float64 references, paged test inputs, report
checks and benchmark cases.

The references gather each request's keys from the paged cache with plain torch indexing and
do the attention in float64; they share no code with the kernels or their wrapper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mllm_kernel.kernels.checks import FLOATS, Checks, bench_case, dtype_name
from mllm_kernel.kernels.decode_attention import decode_attention, merge_attention_states

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------- references


def attended_range(seq_len: int, sliding_window: int = -1) -> tuple[int, int]:
    """[start, end) of the tokens a request with seq_len cached tokens attends to."""
    start = max(0, seq_len - sliding_window) if sliding_window > 0 else 0
    return start, seq_len


def ref_decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale=None, sliding_window=-1,
                         logits_soft_cap=0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse), float64 on the CPU: out [B, H, D] = softmax(logits) @ V, lse [B, H] =
    logsumexp(logits) (natural log), logits = scale * q . k (cap * tanh(logits / cap) if cap > 0),
    over tokens attended_range(seq_lens[b], sliding_window) of request b, token t at
    cache[block_table[b, t // block_size], t % block_size]; query head h reads KV head
    h // (H // KH). No keys: out 0, lse -inf. Computed on q's device (CUDA float64 is fine)."""
    batch, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    scale = head_dim ** -0.5 if scale is None else float(scale)
    device = q.device
    out = torch.zeros(batch, num_heads, head_dim, dtype=torch.float64, device=device)
    lse = torch.full((batch, num_heads), NEG_INF, dtype=torch.float64, device=device)
    lens = seq_lens.tolist()
    table = block_table.to(device=device, dtype=torch.long)
    for b, seq_len in enumerate(lens):
        if not 0 <= seq_len <= table.shape[1] * block_size:
            raise ValueError(f"ref_decode_attention: seq_lens[{b}] = {seq_len} is out of range")
        start, end = attended_range(seq_len, sliding_window)
        if end <= start:
            continue
        tokens = torch.arange(start, end, device=device)
        blocks = table[b, tokens // block_size]
        if blocks.numel() and not (0 <= int(blocks.min()) and int(blocks.max()) < num_blocks):
            raise ValueError(f"ref_decode_attention: request {b} reads a block id outside [0, {num_blocks})")
        k = k_cache[blocks, tokens % block_size].to(device=device, dtype=torch.float64)  # [n, KH, D]
        v = v_cache[blocks, tokens % block_size].to(device=device, dtype=torch.float64)
        qb = q[b].to(torch.float64).reshape(num_kv_heads, group, head_dim)
        logits = torch.einsum("kgd,nkd->kgn", qb, k) * scale
        if logits_soft_cap > 0:
            logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
        lse_b = torch.logsumexp(logits, dim=-1)  # [KH, group]
        p = torch.exp(logits - lse_b.unsqueeze(-1))
        out[b] = torch.einsum("kgn,nkd->kgd", p, v).reshape(num_heads, head_dim)
        lse[b] = lse_b.reshape(num_heads)
    return out.cpu(), lse.cpu()


def ref_merge_attention_states(v_a, lse_a, v_b, lse_b) -> tuple[torch.Tensor, torch.Tensor]:
    """(v, lse), float64 on the CPU: the attention over the union of two disjoint key sets from
    the two partial states; both lse -inf gives v = 0, lse = -inf."""
    va, vb = v_a.double().cpu(), v_b.double().cpu()
    la, lb = lse_a.double().cpu(), lse_b.double().cpu()
    m = torch.maximum(la, lb)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    wa, wb = torch.exp(la - m), torch.exp(lb - m)
    total = wa + wb
    empty = total == 0
    lse = torch.where(empty, torch.full_like(m, NEG_INF), m + torch.log(torch.where(empty, 1.0, total)))
    v = (wa.unsqueeze(-1) * va + wb.unsqueeze(-1) * vb) / torch.where(empty, 1.0, total).unsqueeze(-1)
    v = torch.where(empty.unsqueeze(-1), torch.zeros_like(v), v)
    return v, lse


# ----------------------------------------------------------------------------- paged inputs


@dataclass
class PagedCase:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor

    def args(self) -> tuple:
        return self.q, self.k_cache, self.v_cache, self.block_table, self.seq_lens

    def ref(self, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        return ref_decode_attention(*self.args(), **kwargs)


def _randn(shape, gen, device, scale=1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32, device=device) * scale


def make_paged_case(seq_lens, num_heads: int = 8, num_kv_heads: int = 2, head_dim: int = 128,
                    block_size: int = 16, dtype=torch.float32, device="cpu", *, gen=None,
                    shared: bool = False, spare_blocks: int = 2, spare_columns: int = 1, pad_id: int | None = -1,
                    q_scale: float = 1.0, stale: float | None = None, window: int = -1, fused_kv: bool = False,
                    q_batch_pad: int = 0, table_row_pad: int = 0) -> PagedCase:
    """Random inputs of one decode step: q ~ N(0, q_scale^2), K, V ~ N(0, 1) (drawn in float32
    from `gen` on its device, else from the global generator on `device`, then rounded to dtype),
    in a paged cache whose block ids are a random permutation (not contiguous, not ordered; the
    block table is drawn on the CPU).

    shared: requests b > 0 share their first blocks with request 0 (prefix caching).
    spare_blocks: blocks no request reads; spare_columns: block-table columns past the longest
      request, filled (like each row's unused tail) with pad_id (None: random valid ids).
    stale: a value (NaN, inf, a large number) for every cache slot that no request attends to
      under `window`: slots past seq_len in a last block, slots before the window, spare blocks.
    fused_kv: k_cache, v_cache are views [:, 0] and [:, 1] of one [num_blocks, 2, block_size, KH, D]
      tensor (a block stride of 2 blocks). q_batch_pad: q is q_big[:, :H] of a [B, H + pad, D]
      tensor (a batch stride). table_row_pad: block_table is a column slice of a wider table.
    """
    lens = [int(x) for x in seq_lens]
    batch = len(lens)
    need = [-(-n // block_size) for n in lens]
    share = [0] * batch
    if shared and batch > 1 and need[0] > 0:
        for b in range(1, batch):
            share[b] = min(need[b], max(1, need[0] // 2))
    distinct = sum(need) - sum(share)
    num_blocks = distinct + spare_blocks
    max_blocks = max([1, *need]) + spare_columns
    cpu_gen = gen if gen is not None and gen.device.type == "cpu" else None
    draw_device = gen.device if gen is not None else torch.device(device)
    ids = torch.randperm(num_blocks, generator=cpu_gen)[:distinct].tolist()
    table = torch.full((batch, max_blocks + table_row_pad), -1, dtype=torch.int32)
    if pad_id is None:
        table.copy_(torch.randint(0, max(num_blocks, 1), table.shape, generator=cpu_gen, dtype=torch.int32))
    else:
        table.fill_(pad_id)
    next_id = 0
    for b in range(batch):
        row = table[0, : share[b]].tolist() + ids[next_id : next_id + need[b] - share[b]]
        next_id += need[b] - share[b]
        table[b, : need[b]] = torch.tensor(row, dtype=torch.int32)
    q_full = _randn((batch, num_heads + q_batch_pad, head_dim), gen, draw_device, q_scale).to(dtype)
    kv = _randn((num_blocks, 2, block_size, num_kv_heads, head_dim), gen, draw_device).to(dtype)
    if stale is not None:
        attended = torch.zeros(num_blocks, block_size, dtype=torch.bool)
        for b, n in enumerate(lens):
            start, end = attended_range(n, window)
            t = torch.arange(start, end)
            attended[table[b, t // block_size].long(), t % block_size] = True
        kv.transpose(1, 2)[~attended.to(draw_device)] = stale  # [num_blocks, block_size, 2, KH, D] view
    kv = kv.to(device)
    if fused_kv:
        k_cache, v_cache = kv[:, 0], kv[:, 1]
    else:
        k_cache, v_cache = kv[:, 0].contiguous(), kv[:, 1].contiguous()
    q = q_full.to(device)[:, :num_heads]
    block_table = table.to(device)[:, :max_blocks]
    return PagedCase(q, k_cache, v_cache, block_table, torch.tensor(lens, dtype=torch.int32, device=device))


# ----------------------------------------------------------------------------- report checks

# lse (float32) against float64: (atol, rtol) by the inputs' dtype.
LSE_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 1e-3), torch.bfloat16: (2e-3, 1e-3)}


def _close_lse(c: Checks, label: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = LSE_TOL[dtype]
    got, want = got.double().cpu(), want.cpu()
    same_inf = torch.equal(torch.isneginf(got), torch.isneginf(want))
    finite = ~torch.isneginf(want)
    err = (got[finite] - want[finite]).abs()
    worst_err = err.max().item() if err.numel() else 0.0
    ratio = (err / (atol + rtol * want[finite].abs())).max().item() if err.numel() else 0.0
    ok = same_inf and ratio <= 1.0 and math.isfinite(ratio)
    detail = f"max err {worst_err:.2e} ({ratio:.2f} of tol)" + ("" if same_inf else "; -inf rows differ")
    c.results.append((label, ok, detail))


def check(c: Checks) -> None:
    dtypes = FLOATS  # CUDA: float32 runs the plain float32 kernel
    for dtype in dtypes:
        n = dtype_name(dtype)

        def decode():
            case = make_paged_case([0, 1, 16, 17, 100], 8, 2, 64, 16, dtype, c.device, gen=c.gen, shared=True)
            out, lse = decode_attention(*case.args(), return_lse=True)
            want_out, want_lse = case.ref()
            c.close(f"decode_attention {n}", [out], [want_out])
            _close_lse(c, f"decode_attention[lse] {n}", lse, want_lse, dtype)

        def decode_window_cap():
            case = make_paged_case([5, 40, 130], 16, 2, 128, 7, dtype, c.device, gen=c.gen, q_scale=3.0)
            kw = dict(sliding_window=33, logits_soft_cap=20.0)
            out, lse = decode_attention(*case.args(), return_lse=True, **kw)
            want_out, want_lse = case.ref(**kw)
            c.close(f"decode_attention[window,soft_cap] {n}", [out], [want_out])
            _close_lse(c, f"decode_attention[window,soft_cap,lse] {n}", lse, want_lse, dtype)

        def merge():
            v_a, v_b = c.randn(3, 4, 64, dtype=dtype), c.randn(3, 4, 64, dtype=dtype)
            lse_a, lse_b = c.randn(3, 4, scale=3.0), c.randn(3, 4, scale=3.0)
            lse_a[0, 0] = lse_b[0, 0] = NEG_INF  # no keys on either side
            lse_a[1, 1] = NEG_INF  # no keys on one side
            v, lse = merge_attention_states(v_a, lse_a, v_b, lse_b)
            want_v, want_lse = ref_merge_attention_states(v_a, lse_a, v_b, lse_b)
            c.close(f"merge_attention_states {n}", [v], [want_v])
            _close_lse(c, f"merge_attention_states[lse] {n}", lse, want_lse, torch.float32)

        c.run(f"decode_attention {n}", decode)
        c.run(f"decode_attention[window,soft_cap] {n}", decode_window_cap)
        c.run(f"merge_attention_states {n}", merge)


# ----------------------------------------------------------------------------- benchmarks


def _case(device, batch, context, dtype, num_heads=32, num_kv_heads=8, head_dim=128, block_size=16):
    gen = torch.Generator(device=device).manual_seed(0)
    per_seq = -(-context // block_size)
    num_blocks = batch * per_seq
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, device=device, dtype=dtype, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, device=device, dtype=dtype, generator=gen)
    q = torch.randn(batch, num_heads, head_dim, device=device, dtype=dtype, generator=gen)
    table = torch.randperm(num_blocks, device=device, generator=gen).view(batch, per_seq).to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    # SDPA's K/V [B, KH, L, D], gathered here, outside the timed call.
    k = k_cache[table.long()].view(batch, per_seq * block_size, num_kv_heads, head_dim)[:, :context]
    v = v_cache[table.long()].view(batch, per_seq * block_size, num_kv_heads, head_dim)[:, :context]
    k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    q4 = q.unsqueeze(2)  # [B, H, 1, D]

    def ours():
        return decode_attention(q, k_cache, v_cache, table, seq_lens)

    def eager():
        return torch.nn.functional.scaled_dot_product_attention(q4, k, v, enable_gqa=True).squeeze(2)

    kv_bytes = 2 * batch * context * num_kv_heads * head_dim * k_cache.element_size()
    return bench_case("decode_attention", f"B={batch} ctx={context} H={num_heads}/{num_kv_heads} D={head_dim} "
                      f"block={block_size}", dtype, ours, eager, kv_bytes)


def benchmark_cases(device: str) -> list[dict]:
    if device == "cuda":
        grid = [(torch.bfloat16, b, ctx) for b in (1, 8, 64) for ctx in (512, 4096)]
    else:
        grid = [(dtype, b, ctx) for dtype in (torch.float32, torch.bfloat16) for b in (1, 4) for ctx in (512, 2048)]
    return [_case(device, batch, ctx, dtype) for dtype, batch, ctx in grid]
