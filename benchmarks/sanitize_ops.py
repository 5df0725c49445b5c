"""Calls every CUDA op once per dtype on small, awkward inputs (odd sizes, unaligned views) so
that `compute-sanitizer --tool memcheck python3 benchmarks/sanitize_ops.py` checks each kernel's
memory accesses. Prints one line per op; exits non-zero if an op raises."""

import os
import sys

import torch

import mllm_kernel as mk
from mllm_kernel.cuda.jit import add_constant

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def unaligned(shape, dtype):
    # A view one element into a larger buffer: exercises the scalar (non-16-byte) paths.
    flat = torch.randn(int(torch.tensor(shape).prod()) + 1, device="cuda", dtype=dtype)
    return flat[1:].view(shape)


def run_all():
    g = torch.Generator(device="cuda").manual_seed(0)
    add_constant(torch.arange(1001, dtype=torch.int32, device="cuda"), 1)
    yield "add_constant"
    for dtype in DTYPES:
        # Hidden sizes reach every norm launch shape: 1, 2, 4 and 8 vectors per thread, and scalar;
        # 600 rows of 4096 take the plan of grids over one wave.
        for rows, hidden in ((3, 1000), (5, 4096), (7, 8192), (600, 4096), (2, 8193), (3, 20480), (2, 40000)):
            for x in (torch.randn(rows, hidden, device="cuda", dtype=dtype), unaligned((rows, hidden), dtype)):
                w = torch.randn(hidden, device="cuda", dtype=dtype)
                mk.rms_norm(x, w)
                mk.fused_add_rms_norm(x.clone(), x.clone(), w)
                mk.silu_and_mul(x[:, : hidden // 2 * 2])
                mk.gelu_and_mul(x[:, : hidden // 2 * 2] * 8)  # 16-bit: the x < -6 branch too
                mk.gelu_and_mul(x[:, : hidden // 2 * 2], approximate="tanh")
                mk.softmax(x, temperature=0.7)
                mk.log_softmax(x)
        long_rows = torch.randn(2, 151936, device="cuda", dtype=dtype)  # softmax: rows over clusters
        for x in (long_rows, unaligned((2, 151936), dtype), torch.randn(1, 1_000_003, device="cuda", dtype=dtype)):
            mk.softmax(x)
            mk.log_softmax(x)
        yield f"norm/activation/softmax {dtype}"
        logits = torch.randn(4, 32001, device="cuda", dtype=dtype, generator=g)
        mk.greedy_sample(logits)
        mk.top_k_top_p_sample(logits, 50, 0.9, generator=g)
        mk.top_k_top_p_sample(logits, torch.tensor([0, 1, 7, 32001], device="cuda"),
                              torch.tensor([1.0, 0.5, 0.9, 0.01], device="cuda"), generator=g)
        mk.min_p_sample(torch.softmax(logits.float(), -1).to(dtype), 0.1, generator=g)
        # Every launch plan: a row over 8 blocks, over 16 (600_001 16-bit values) or too long for
        # shared memory (600_001 float32), one block per row, and an unaligned row.
        for logits in (torch.randn(1, 151936, device="cuda", dtype=dtype), torch.randn(2, 600_001, device="cuda", dtype=dtype),
                       torch.randn(300, 999, device="cuda", dtype=dtype), unaligned((3, 70001), dtype)):
            mk.greedy_sample(logits)
            mk.top_k_top_p_sample(logits, 50, 0.9, generator=g)
            mk.top_k_top_p_sample(logits, 0, 0.5, generator=g)
            mk.min_p_sample(torch.softmax(logits.float(), -1).to(dtype), 0.1, generator=g)
        # Top-k candidates that do not fit one block (ties everywhere) take the full search.
        mk.top_k_top_p_sample(torch.full((2, 151936), 0.5, device="cuda", dtype=dtype), 50, 0.9, generator=g)
        # Two rows per SM of more than 96 KiB: one block reads each row once (StreamTopK). An
        # ascending row refills its candidate buffer at every chunk; k = 1025 overflows it, and
        # unaligned rows and rows without top-k search the row in global memory.
        rows = torch.randn(2 * torch.cuda.get_device_properties(0).multi_processor_count, 65541, device="cuda",
                           dtype=dtype, generator=g)
        rows[0] = torch.linspace(-5.0, 5.0, rows.shape[1], device="cuda")
        top_k = torch.tensor([50, 1025, 0, 7], device="cuda").repeat(rows.shape[0] // 4 + 1)[: rows.shape[0]]
        mk.top_k_top_p_sample(rows, top_k, 0.9, generator=g)
        mk.top_k_top_p_sample(unaligned(tuple(rows.shape), dtype), 50, 0.9, generator=g)
        yield f"sampling {dtype}"
        tokens, heads, kv_heads, head_dim = 7, 8, 2, 80
        qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device="cuda", dtype=dtype)
        q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
        k = qkv[:, heads * head_dim: (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
        cache = torch.randn(64, 64, device="cuda", dtype=torch.float32)
        positions = torch.randint(0, 64, (tokens,), device="cuda")
        mk.apply_rope(q, k, positions, cache, is_neox=True)
        mk.apply_rope(q, k, positions, cache, is_neox=False)
        # Llama's shapes: 512-thread blocks over several tokens each.
        q, k = (torch.randn(300, h, 128, device="cuda", dtype=dtype) for h in (32, 8))
        cache = torch.randn(4096, 128, device="cuda", dtype=torch.float32)
        mk.apply_rope(q, k, torch.randint(0, 4096, (300,), device="cuda"), cache, is_neox=True)
        yield f"rope {dtype}"
        kv = torch.randn(tokens, kv_heads, head_dim, device="cuda", dtype=dtype)
        k_cache = torch.zeros(3, 4, kv_heads, head_dim, device="cuda", dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        slots = torch.tensor([0, 5, -1, 11, 3, -1, 7], device="cuda")
        mk.store_kv_cache(kv, kv, k_cache, v_cache, slots)
        yield f"kv_cache {dtype}"
        table = torch.randn(1000, 129, device="cuda", dtype=dtype)
        mk.embedding(torch.randint(0, 1000, (3, 5), device="cuda"), table)
        yield f"embedding {dtype}"
    yield from decode_attention_calls()
    yield from prefill_attention_calls()
    yield from penalties_and_speculative_calls()


def decode_attention_calls():
    # Every head_dim, block sizes 1/7/16/64, ragged lengths (0, bs - 1, bs + 1, long), windows,
    # soft cap, split and unsplit, float8 caches, and a bad block id and seq_len (masked /
    # clamped, never read).
    from mllm_kernel.kernels.decode_attention import pop_decode_attention_error

    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        for head_dim, heads, kv_heads, block, lens, splits in (
            (64, 8, 2, 7, [0, 1, 6, 7, 8, 300], None),
            (128, 32, 8, 16, [1000, 5], 3),
            (256, 20, 1, 1, [77, 130], None),
            (128, 4, 4, 64, [200], 1),
            (128, 16, 2, 16, [3000, 40], 8),  # on sm_90: merged in a cluster of 8
            (128, 16, 2, 16, [3000, 40], 9),  # merged by MergeSplitsKernel
        ):
            max_blocks = max(-(-n // block) for n in lens) + 1
            num_blocks = len(lens) * max_blocks + 2
            k_cache = torch.randn(num_blocks, block, kv_heads, head_dim, device="cuda", dtype=dtype)
            v_cache = torch.randn_like(k_cache)
            table = torch.stack([torch.randperm(num_blocks, generator=gen)[:max_blocks] for _ in lens])
            table = table.int().cuda()
            seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
            q = torch.randn(len(lens), heads, head_dim, device="cuda", dtype=dtype)
            mk.decode_attention(q, k_cache, v_cache, table, seq_lens, num_splits=splits, sliding_window=50,
                                logits_soft_cap=20.0)
            mk.decode_attention(q, k_cache, v_cache, table, seq_lens, num_splits=splits)
            # float8 caches, written by store_kv_cache: a float scale, a per-head tensor, a 0-d one.
            k8 = torch.zeros(k_cache.shape, device="cuda", dtype=torch.float8_e4m3fn)
            v8 = torch.zeros_like(k8)
            rows = k_cache.view(-1, kv_heads, head_dim)
            slots = torch.arange(rows.shape[0], device="cuda")
            slots[::5] = -1
            mk.store_kv_cache(rows, rows, k8, v8, slots, k_scale=0.05,
                              v_scale=torch.rand(kv_heads, device="cuda") + 0.5)
            mk.decode_attention(q, k8, v8, table, seq_lens, num_splits=splits, k_scale=torch.tensor(0.05, device="cuda"),
                                v_scale=0.7)
            table[0, 0], seq_lens[-1] = 10**6, 10**6
            mk.decode_attention(q, k_cache, v_cache, table, seq_lens, num_splits=splits)
            if pop_decode_attention_error() is None:
                raise RuntimeError("decode_attention: the bad block id / seq_len was not recorded")
            mk.decode_attention(q, k8, v8, table, seq_lens, num_splits=splits)
            if pop_decode_attention_error() is None:
                raise RuntimeError("decode_attention (float8): the bad block id / seq_len was not recorded")
        v = torch.randn(3, 4, 64, device="cuda", dtype=dtype)
        lse = torch.randn(3, 4, device="cuda")
        mk.merge_attention_states(v, lse, v, lse)
        yield f"decode_attention {dtype}"


def prefill_attention_calls():
    # Every head_dim, ragged and paged (block sizes 1/7/16 by cp.async, 32 by TMA boxes at 128 and 256), lengths 0
    # to 300 with len_k > len_q, causal or not, window and soft cap, tree masks (and one short mask),
    # and bad block ids, seq_lens and prefix sums (clamped / masked, never read); long ragged
    # requests at head_dim 64.
    from mllm_kernel.kernels.prefill_attention import pop_prefill_attention_error
    from mllm_kernel.kernels.prefill_attention.cases import make_paged_prefill_case, make_ragged_case, tree_mask

    gen = torch.Generator().manual_seed(0)
    lens_q, lens_k = [1, 130, 0, 17], [5, 130, 9, 300]
    # On an H100/H200 both kernels by name (the Hopper one takes block sizes 1, 7 and 16 through its
    # cp.async path); elsewhere "sm90" raises, so only the automatic choice runs.
    backends = ("auto", "fa2", "sm90") if torch.cuda.get_device_capability() == (9, 0) else ("auto",)
    chosen = os.environ.get("MLLM_KERNEL_PREFILL_BACKEND")
    for backend, dtype in ((b, d) for b in backends for d in (torch.float16, torch.bfloat16)):
        os.environ["MLLM_KERNEL_PREFILL_BACKEND"] = backend
        for head_dim, heads, kv_heads, blocks in ((64, 8, 2, (7,)), (128, 16, 2, (16, 32)), (256, 8, 8, (1, 32))):
            ragged = make_ragged_case(lens_q, lens_k, heads, kv_heads, head_dim, dtype, "cuda", gen)
            for causal in (True, False):
                mk.prefill_attention(*ragged.args(), causal=causal)
            mk.prefill_attention(*ragged.args(), sliding_window=20, logits_soft_cap=10.0)
            bad = []
            for block in blocks:
                paged = make_paged_prefill_case(lens_q, lens_k, heads, kv_heads, head_dim, block, dtype, "cuda", gen)
                mk.paged_prefill_attention(*paged.args())
                mask = torch.cat([tree_mask(k - q, q, gen).flatten() for q, k in zip(lens_q, lens_k)]).cuda()
                mk.paged_prefill_attention(*paged.args(), custom_mask=mask)
                mk.paged_prefill_attention(*paged.args(), custom_mask=mask[:-7])  # entries past the end read 0
                bad.append(pop_prefill_attention_error())
                table = paged.block_table.clone()
                table[1, 2] = 10**6
                mk.paged_prefill_attention(paged.q, paged.k_cache, paged.v_cache, table, paged.cu_seqlens_q, paged.seq_lens)
                bad.append(pop_prefill_attention_error())
                seq_lens = paged.seq_lens.clone()
                seq_lens[3] = 10**6
                mk.paged_prefill_attention(paged.q, paged.k_cache, paged.v_cache, paged.block_table, paged.cu_seqlens_q,
                                           seq_lens)
                bad.append(pop_prefill_attention_error())
            cu_q = ragged.cu_seqlens_q.clone()
            cu_q[1], cu_q[2] = 10**6, -5
            mk.prefill_attention(ragged.q, ragged.k, ragged.v, cu_q, ragged.cu_seqlens_k)
            bad.append(pop_prefill_attention_error())
            if None in bad:
                raise RuntimeError(f"prefill_attention: a bad input was not recorded: {bad}")
        # Requests averaging >= 2048 queries: ragged head_dim 64 takes 192-row work items on Hopper.
        wide = make_ragged_case([2049, 2100], [2049, 3000], 4, 2, 64, dtype, "cuda", gen)
        for causal in (True, False):
            mk.prefill_attention(*wide.args(), causal=causal)
        if (recorded := pop_prefill_attention_error()) is not None:
            raise RuntimeError(f"prefill_attention: good inputs (192-row items) recorded {recorded}")
        cu_q = wide.cu_seqlens_q.clone()
        cu_q[1] = 10**6
        mk.prefill_attention(wide.q, wide.k, wide.v, cu_q, wide.cu_seqlens_k)
        if pop_prefill_attention_error() is None:
            raise RuntimeError("prefill_attention: a bad prefix sum (192-row items) was not recorded")
        yield f"prefill_attention {dtype} ({backend})"
    if chosen is None:
        del os.environ["MLLM_KERNEL_PREFILL_BACKEND"]
    else:
        os.environ["MLLM_KERNEL_PREFILL_BACKEND"] = chosen


def penalties_and_speculative_calls():
    """apply_penalties from ids (vocab slices, repeats, padding, a bad id) and counts / masks; chain
    and tree verification over both tree plans, with bad ids and links (recorded, never read)."""
    from mllm_kernel.kernels.penalties import pop_penalties_error
    from mllm_kernel.kernels.speculative import pop_speculative_error

    gen = torch.Generator(device="cuda").manual_seed(3)
    for dtype in DTYPES:
        for batch, vocab, num_ids in ((1, 5, 3), (3, 9000, 300), (2, 20011, 9000)):
            x = unaligned((batch, vocab), dtype)
            ids = torch.randint(-2, vocab, (batch, num_ids), device="cuda", generator=gen)
            mk.apply_penalties(x, ids, None, 1.2, 0.1, 0.2)
            mk.apply_penalties(x, ids.int(), None, torch.rand(batch, device="cuda") + 0.5, 0.1, 0.2)
            counts = torch.randint(0, 3, (batch, vocab), device="cuda", generator=gen, dtype=torch.int32)
            mk.apply_penalties(x, None, counts, 1.2, 0.1, 0.2)
            mk.apply_penalties(x, None, counts > 0, 1.2, 0.1, 0.2)
            ids[0, 0] = vocab + 5
            mk.apply_penalties(x, ids, None, 1.2, check=False)
            if pop_penalties_error() is None:
                raise RuntimeError("apply_penalties: a bad id was not recorded")
        yield f"apply_penalties {dtype}"
    for batch, vocab in ((1, 7), (3, 9000), (2, 151936)):
        for n in (1, 3):
            q = torch.softmax(torch.randn(batch, n, vocab, device="cuda"), -1)
            p = torch.softmax(torch.randn(batch, n + 1, vocab, device="cuda"), -1)
            ids = torch.randint(0, vocab, (batch, n), device="cuda", generator=gen)
            mk.chain_speculative_sampling(q, ids, p, generator=gen)
            ids[0, 0] = -4
            mk.chain_speculative_sampling(q, ids.int(), p, generator=gen, check=False)
            if pop_speculative_error() is None:
                raise RuntimeError("chain_speculative_sampling: a bad id was not recorded")
        walk_only = ((26, 40),) if vocab <= 9000 else ()  # more node rows than the pick-first plan takes
        for nodes, reps in ((1, 1), (8, 1), (26, 1)) + walk_only:
            b = batch * reps
            parents = torch.full((b, nodes), -1, dtype=torch.int64)
            for i in range(1, nodes):
                parents[:, i] = torch.randint(0, i, (b,))
            lists = [t.cuda() for t in mk.tree_from_parents(parents, torch.randint(0, min(vocab, 4), (b, nodes)))]
            probs = torch.softmax(torch.randn(b * nodes, vocab, device="cuda") * 4, -1)
            mk.tree_speculative_verify(*lists, target_logits=probs.bfloat16(), greedy=True)
            mk.tree_speculative_verify(*lists, probs, greedy=False, generator=gen)
            if nodes > 1:
                lists[2][0, 0] = nodes + 3  # the root's first child out of range
                mk.tree_speculative_verify(*lists, probs, greedy=True, check=False)
                if pop_speculative_error() is None:
                    raise RuntimeError("tree_speculative_verify: a bad link was not recorded")
            mk.build_tree_attention_mask(parents.cuda(), torch.full((b,), 7, device="cuda"))
        yield f"chain / tree verification, vocab {vocab}"


def main() -> int:
    for name in run_all():
        torch.cuda.synchronize()
        print(f"ok  {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
