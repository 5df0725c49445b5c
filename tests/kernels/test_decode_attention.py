"""decode_attention and merge_attention_states (kernels/decode_attention) against the float64
references of kernels/decode_attention/cases.py.

CPU tests run once per SIMD target (conftest.py's autouse `simd_target` fixture) and cover a
representative subset at short and medium lengths (~5000 keys at most); the CUDA tests run the full
matrix (every head_dim x dtype x group size x block size), lengths past 32768 keys, the split and
unsplit paths, CUDA-graph replay and the device-side error record.

Tolerances: an output is a convex combination of V rows (|V| <= ~5 here), so it is compared with
about 2x the report's per-dtype tolerance (mllm_kernel/kernels/checks.py TOL); lse (float32) with
1e-4 (float32 inputs) or 2e-3 (16-bit inputs) absolute plus a relative term. Every `out=` is
poisoned with NaN first, so an element the kernel never writes fails the comparison.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from mllm_kernel.kernels.decode_attention import decode_attention, merge_attention_states, pop_decode_attention_error
from mllm_kernel.kernels.decode_attention.cases import (
    PagedCase,
    attended_range,
    make_paged_case,
    ref_merge_attention_states,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CUDA_DTYPES = [torch.float32, torch.float16, torch.bfloat16]  # float32: the plain float32 kernel
CUDA_FP8_Q_DTYPES = [torch.float16, torch.bfloat16]  # a float8 cache goes with 16-bit q on CUDA
HEAD_DIMS = [64, 128, 256]
HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
NAN, NEG_INF = float("nan"), float("-inf")

# (atol, rtol) of out against float64, and of lse (float32) by the inputs' dtype.
OUT_TOL = {torch.float32: (2e-5, 2e-4), torch.float16: (2e-3, 8e-3), torch.bfloat16: (1.6e-2, 3.2e-2)}
LSE_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 1e-3), torch.bfloat16: (2e-3, 1e-3)}

# (num_heads, num_kv_heads, block_size): group sizes 1, 4, 8 and block sizes 1, 7, 16, 64.
CPU_CONFIGS = [(8, 8, 16), (8, 2, 7), (16, 2, 64), (16, 2, 1)]
# Groups of 16 (one full CTA of query heads), 20 and 32 (two CTAs a KV head) and 7 (odd) too.
CUDA_CONFIGS = [(8, 8, 16), (8, 2, 7), (16, 2, 64), (16, 2, 1), (32, 8, 16), (64, 8, 32), (4, 1, 16),
                (32, 2, 16), (40, 2, 16), (32, 1, 16), (28, 4, 16)]


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def seed(*parts) -> None:
    """A per-test seed that does not depend on PYTHONHASHSEED."""
    torch.manual_seed(zlib.crc32(repr(parts).encode()))


def ragged_lens(block_size: int, long: int) -> list[int]:
    """A long request first (others share its blocks with shared=True), then the edges around one
    block: 0, 1, bs - 1, bs, bs + 1, and 2 bs + 3."""
    return [long, 0, 1, max(block_size - 1, 0), block_size, block_size + 1, 2 * block_size + 3]


def assert_attention(out, lse, want_out, want_lse, dtype, what=""):
    assert out.dtype == dtype and out.shape == want_out.shape, (out.dtype, out.shape)
    atol, rtol = OUT_TOL[dtype]
    torch.testing.assert_close(out.double().cpu(), want_out, atol=atol, rtol=rtol, msg=lambda m: f"out {what}: {m}")
    empty = torch.isneginf(want_lse)
    assert torch.equal(out.cpu()[empty], torch.zeros_like(out.cpu()[empty])), f"out {what}: no keys must give 0"
    if lse is not None:
        assert lse.dtype == torch.float32 and lse.shape == want_lse.shape
        atol, rtol = LSE_TOL[dtype]
        lse = lse.double().cpu()
        assert torch.equal(torch.isneginf(lse), empty), f"lse {what}: -inf exactly where there are no keys"
        torch.testing.assert_close(lse[~empty], want_lse[~empty], atol=atol, rtol=rtol,
                                   msg=lambda m: f"lse {what}: {m}")


def run_checked(case: PagedCase, dtype, *, out_given=True, what="", want=None, **kw):
    """decode_attention into a NaN-poisoned out=, with lse, compared with the reference (`want`:
    case.ref(...) computed already); on CUDA, asserts that nothing was recorded as a bad index."""
    out = torch.full(case.q.shape, NAN, dtype=dtype, device=case.q.device) if out_given else None
    got, lse = decode_attention(*case.args(), return_lse=True, out=out, **kw)
    if out_given:
        assert got is out
    if case.q.is_cuda:
        assert pop_decode_attention_error(case.q.device) is None, "a good call recorded an error"
    if want is None:
        want = case.ref(**{k: kw[k] for k in ("scale", "sliding_window", "logits_soft_cap") if k in kw})
    assert_attention(got, lse, *want, dtype, what)
    return got, lse


def plant_needles(case: PagedCase, seq_lens, window: int, target_logit: float) -> None:
    """Keys that the query heads of each KV group strongly prefer, at the first and last attended
    tokens (a kernel that drops them is far off) and just outside the attended range: the token
    before the window and the token after seq_len within its last block (a kernel that includes
    them is far off; they get a larger logit). Needs pad-free, unshared tables."""
    num_blocks, block_size, num_kv_heads, head_dim = case.k_cache.shape
    group = case.q.shape[1] // num_kv_heads
    scale = head_dim ** -0.5
    for b, n in enumerate(seq_lens):
        start, end = attended_range(n, window)
        if end <= start:
            continue
        qg = case.q[b].double().reshape(num_kv_heads, group, head_dim)
        direction = qg.sum(1)
        direction = direction / direction.norm(dim=-1, keepdim=True)
        per_head = scale * torch.einsum("kgd,kd->kg", qg, direction).mean(-1).clamp(min=0.05)  # [KH]
        spots = [(start, target_logit), (end - 1, target_logit)]
        if start > 0:
            spots.append((start - 1, target_logit + 4))
        if end % block_size:
            spots.append((end, target_logit + 4))
        for t, logit in spots:
            block = int(case.block_table[b, t // block_size])
            key = direction * (logit / per_head).unsqueeze(-1)
            case.k_cache[block, t % block_size] = key.to(case.k_cache.dtype)
            case.v_cache[block, t % block_size] = (torch.randn(num_kv_heads, head_dim, device=key.device) * 2).to(
                case.v_cache.dtype)


def merge_union(case: PagedCase, split_blocks: int, dtype, **kw):
    """decode over the first split_blocks table columns and over the rest, merged, against decode
    and the reference over all the keys. Returns the two partial (out, lse)."""
    block_size = case.k_cache.shape[1]
    cut = split_blocks * block_size
    lens_a = case.seq_lens.clamp(max=cut)
    lens_b = (case.seq_lens - cut).clamp(min=0)
    part_a = decode_attention(case.q, case.k_cache, case.v_cache, case.block_table[:, :split_blocks], lens_a,
                              return_lse=True, **kw)
    part_b = decode_attention(case.q, case.k_cache, case.v_cache, case.block_table[:, split_blocks:], lens_b,
                              return_lse=True, **kw)
    assert torch.isneginf(part_b[1].cpu()[lens_b.cpu() == 0]).all()
    v, lse = merge_attention_states(*part_a, *part_b)
    want = case.ref()
    assert_attention(v, lse, *want, dtype, "merged halves vs reference")
    whole, whole_lse = decode_attention(*case.args(), return_lse=True, **kw)
    atol, rtol = OUT_TOL[dtype]
    torch.testing.assert_close(v.double(), whole.double(), atol=2 * atol, rtol=2 * rtol)
    # The reference's own merge of the kernel's halves: the merge kernel alone.
    ref_v, ref_lse = ref_merge_attention_states(*part_a, *part_b)
    assert_attention(v, lse, ref_v, ref_lse, dtype, "merge vs reference merge")
    return part_a, part_b


def random_states(shape, dtype, device, row_pad=0):
    """Two partial states [..., H, D] with lse patterns: both -inf, one side -inf, far apart,
    equal; v rows may be row-strided views (row_pad extra heads per row)."""
    *lead, heads, dim = shape
    v_big = [torch.randn(*lead, heads + row_pad, dim).to(dtype) for _ in range(2)]
    v_a, v_b = (t[..., :heads, :].to(device) for t in v_big)
    lse_a, lse_b = torch.randn(*lead, heads) * 4, torch.randn(*lead, heads) * 4
    flat_a, flat_b = lse_a.view(-1), lse_b.view(-1)
    flat_a[0] = flat_b[0] = NEG_INF  # no keys on either side
    flat_a[1] = NEG_INF  # no keys on one side
    flat_b[2] = NEG_INF
    flat_a[3], flat_b[3] = 80.0, -80.0  # one side dominates completely
    flat_a[4] = flat_b[4] = 3.0  # equal weights
    return v_a, lse_a.to(device), v_b, lse_b.to(device)


def check_merge_random(device, dtype):
    for shape, row_pad in (((5, 8, 128), 0), ((3, 4, 64), 2), ((2, 3, 4, 256), 0)):
        v_a, lse_a, v_b, lse_b = random_states(shape, dtype, device, row_pad)
        v, lse = merge_attention_states(v_a, lse_a, v_b, lse_b)
        assert v.shape == v_a.shape and v.dtype == dtype and lse.shape == lse_a.shape and lse.dtype == torch.float32
        want_v, want_lse = ref_merge_attention_states(v_a, lse_a, v_b, lse_b)
        assert_attention(v.reshape(-1, *shape[-2:]), lse.reshape(-1, shape[-2]), want_v.reshape(-1, *shape[-2:]),
                         want_lse.reshape(-1, shape[-2]), dtype, f"merge {shape}")
        flat_v, flat_lse = v.reshape(-1, shape[-1]).cpu(), lse.reshape(-1).cpu()
        assert torch.isneginf(flat_lse[0]) and not flat_v[0].any(), "both -inf: v 0, lse -inf"
        assert torch.equal(flat_lse[1], lse_b.reshape(-1)[1].cpu()), "one side -inf: the other lse"


def check_nan_propagates(device, dtype, **kw):
    """A NaN in q makes that head's out and lse NaN; a NaN in an attended key makes every head of
    its KV group NaN for that request. Nothing else changes, and the NaN is never hidden as the
    0 / -inf of a request without keys (also with the keys split over several chunks)."""
    seed("nan", device, dtype, kw)
    case = make_paged_case([40, 50, 33], 8, 2, 64, 16, dtype, device=device)
    case.q[0, 0, 3] = NAN
    block = int(case.block_table[1, 17 // 16])
    case.k_cache[block, 17 % 16, 0, 5] = NAN  # request 1, key 17, KV head 0 (query heads 0-3)
    out, lse = decode_attention(*case.args(), return_lse=True, **kw)
    bad = torch.zeros(3, 8, dtype=torch.bool)
    bad[0, 0] = True
    bad[1, :4] = True
    assert torch.equal(torch.isnan(out.cpu()).all(-1), bad) and torch.equal(torch.isnan(out.cpu()).any(-1), bad)
    assert torch.equal(torch.isnan(lse.cpu()), bad)
    want_out, want_lse = case.ref()
    assert_attention(out.cpu()[2:], lse.cpu()[2:], want_out[2:], want_lse[2:], dtype, "the request without NaN")


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_nan_propagates(dtype):
    # Also on x86 targets without F16C, whose float16 promotion needs PromoteToF32's fix-up
    # (mllm_kernel/cpu/simd_io-inl.h).
    check_nan_propagates("cpu", dtype)


@pytest.mark.parametrize("config", CPU_CONFIGS, ids=lambda c: f"H{c[0]}_KH{c[1]}_bs{c[2]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_reference(dtype, head_dim, config):
    num_heads, num_kv_heads, block_size = config
    seed("cpu_reference", dtype, head_dim, config)
    lens = ragged_lens(block_size, 300)
    case = make_paged_case(lens, num_heads, num_kv_heads, head_dim, block_size, dtype, shared=True, q_scale=2.0)
    run_checked(case, dtype)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_long(dtype, head_dim):
    seed("cpu_long", dtype, head_dim)
    case = make_paged_case([5000, 4097, 1, 0], 16, 2, head_dim, 16, dtype, shared=True, q_scale=2.0)
    run_checked(case, dtype)
    run_checked(case, dtype, sliding_window=3000)


@pytest.mark.parametrize("window", [1, 7, 16, 100, 10**6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_cpu_sliding_window(dtype, window):
    seed("cpu_window", dtype, window)
    lens = [1000, 0, 1, 5, 16, 17, 100, 101]
    case = make_paged_case(lens, 8, 2, 64, 16, dtype, shared=True, q_scale=2.0)
    run_checked(case, dtype, sliding_window=window)
    if window >= 1000:  # W >= L: every key, as without a window
        no_window = decode_attention(*case.args())
        assert torch.equal(decode_attention(*case.args(), sliding_window=window), no_window)


@pytest.mark.parametrize("cap", [1.0, 30.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_soft_cap_and_scale(dtype, cap):
    seed("cpu_cap", dtype, cap)
    case = make_paged_case([257, 3, 40], 16, 4, 128, 16, dtype, q_scale=4.0)
    run_checked(case, dtype, logits_soft_cap=cap)
    run_checked(case, dtype, logits_soft_cap=cap, scale=0.3, sliding_window=33)
    run_checked(case, dtype, scale=0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_cpu_large_logits(dtype):
    """Logits in the thousands: exp overflows unless the running max is subtracted."""
    seed("cpu_large", dtype)
    case = make_paged_case([700, 33, 1], 8, 2, 64, 16, dtype, q_scale=300.0)
    out, _ = run_checked(case, dtype)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("window", [-1, 20])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_stale_slots_ignored(dtype, window):
    """NaN in every cache slot no request attends to (past seq_len in a last block, before the
    window, blocks no one reads) and -1 / huge ids in unread table entries change nothing."""
    seed("cpu_stale", dtype, window)
    lens = [130, 0, 1, 15, 16, 17, 63]
    case = make_paged_case(lens, 8, 2, 128, 16, dtype, shared=True, stale=NAN, window=window, spare_columns=2)
    out, _ = run_checked(case, dtype, sliding_window=window)
    assert not out.isnan().any()
    case.block_table[:, -1] = 2**31 - 1  # an unread column (spare_columns = 2)
    run_checked(case, dtype, sliding_window=window)


@pytest.mark.parametrize("window", [-1, 5, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_needles_at_the_edges(dtype, window):
    """Dominant keys at the first and last attended tokens and just outside them: an off-by-one
    in the attended range is a large error even in bfloat16."""
    seed("cpu_needles", dtype, window)
    lens = [1, 15, 16, 17, 33, 64, 100]
    case = make_paged_case(lens, 16, 2, 64, 16, dtype)
    plant_needles(case, lens, window, target_logit=12.0)
    run_checked(case, dtype, sliding_window=window)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_strided_inputs(dtype):
    """q with a batch stride, K and V views of one fused tensor (block stride 2 blocks), a
    column slice of a wider block table; out allocated by the op and given."""
    seed("cpu_strided", dtype)
    case = make_paged_case([77, 0, 16, 200], 16, 2, 128, 16, dtype, fused_kv=True, q_batch_pad=3,
                           table_row_pad=5, shared=True)
    assert not case.q.is_contiguous() and not case.k_cache.is_contiguous()
    assert case.block_table.stride(0) > case.block_table.shape[1]
    run_checked(case, dtype, out_given=False)
    run_checked(case, dtype)


def test_cpu_out_and_return_lse():
    seed("cpu_out")
    case = make_paged_case([20, 0, 5], 8, 2, 64, 16, torch.float32)
    plain = decode_attention(*case.args())
    assert isinstance(plain, torch.Tensor) and plain.shape == case.q.shape
    out = torch.full_like(plain, NAN)
    assert decode_attention(*case.args(), out=out) is out
    assert torch.equal(out, plain)
    out.fill_(NAN)
    got, lse = decode_attention(*case.args(), out=out, return_lse=True)
    assert got is out and torch.equal(out, plain)
    assert_attention(out, lse, *case.ref(), torch.float32)


@pytest.mark.parametrize("split_blocks", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_merge_vs_union(dtype, split_blocks):
    seed("cpu_merge_union", dtype, split_blocks)
    case = make_paged_case([100, 0, 10, 16, 17, 48, 250], 8, 2, 64, 16, dtype, shared=True, q_scale=2.0)
    merge_union(case, split_blocks, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_merge_random(dtype):
    seed("cpu_merge", dtype)
    check_merge_random("cpu", dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_cpu_num_threads_bitwise(dtype):
    seed("cpu_threads", dtype)
    case = make_paged_case([900, 0, 33, 1, 500, 64], 16, 2, 128, 16, dtype, shared=True)
    one = decode_attention(*case.args(), return_lse=True, num_threads=1)
    for threads in (0, 4, 64):
        many = decode_attention(*case.args(), return_lse=True, num_threads=threads)
        assert torch.equal(many[0], one[0]) and torch.equal(many[1], one[1]), threads
    assert_attention(*one, *case.ref(), dtype)


def test_cpu_num_splits_accepted():
    """The CPU never splits: a forced num_splits gives the same result."""
    seed("cpu_splits")
    case = make_paged_case([600, 3, 0], 8, 2, 64, 16, torch.float32)
    base = run_checked(case, torch.float32, num_splits=1)
    for splits in (7, 128):
        got = run_checked(case, torch.float32, num_splits=splits)
        assert torch.equal(got[0], base[0]) and torch.equal(got[1], base[1])


def test_cpu_empty():
    seed("cpu_empty")
    case = make_paged_case([], 8, 2, 64, 16, torch.float32)
    out, lse = decode_attention(*case.args(), return_lse=True)
    assert out.shape == (0, 8, 64) and lse.shape == (0, 8)
    case = make_paged_case([0, 0], 8, 2, 64, 16, torch.bfloat16)
    out, lse = run_checked(case, torch.bfloat16)
    assert not out.any() and torch.isneginf(lse).all()


def _small(dtype=torch.float32, **kw):
    return make_paged_case([20, 40], 8, 2, 64, 16, dtype, spare_blocks=0, **kw)


# name: (error, regex naming the argument, the arguments that replace _small()'s).
BAD_INPUTS = {
    "k_cache_dtype": (TypeError, "k_cache", lambda c: dict(k_cache=c.k_cache.half())),
    "v_cache_dtype": (TypeError, "v_cache", lambda c: dict(v_cache=c.v_cache.bfloat16())),
    "q_float64": (TypeError, r"\bq\b", lambda c: dict(q=c.q.double(), k_cache=c.k_cache.double(),
                                                     v_cache=c.v_cache.double())),
    "q_not_tensor": (TypeError, r"\bq\b", lambda c: dict(q=c.q.tolist())),
    "block_table_int64": (TypeError, "block_table", lambda c: dict(block_table=c.block_table.long())),
    "seq_lens_int64": (TypeError, "seq_lens", lambda c: dict(seq_lens=c.seq_lens.long())),
    "out_dtype": (TypeError, "out", lambda c: dict(out=torch.empty(c.q.shape, dtype=torch.half))),
    "out_shape": (ValueError, "out", lambda c: dict(out=torch.empty(2, 8, 32))),
    "out_aliases_q": (ValueError, "out", lambda c: dict(out=c.q)),
    "head_dim_96": (ValueError, "head_dim", lambda c: dict(
        q=torch.randn(2, 8, 96), k_cache=torch.randn(c.k_cache.shape[0], 16, 2, 96),
        v_cache=torch.randn(c.k_cache.shape[0], 16, 2, 96))),
    "heads_not_multiple": (ValueError, "num_heads", lambda c: dict(
        q=torch.randn(2, 6, 64), k_cache=torch.randn(c.k_cache.shape[0], 16, 4, 64),
        v_cache=torch.randn(c.k_cache.shape[0], 16, 4, 64))),
    "k_head_dim_strided": (ValueError, "k_cache", lambda c: dict(
        k_cache=torch.randn(c.k_cache.shape[0], 16, 2, 128)[..., ::2])),
    "k_tokens_not_packed": (ValueError, "k_cache", lambda c: dict(
        k_cache=c.k_cache.transpose(1, 2).contiguous().transpose(1, 2))),
    "v_block_size": (ValueError, "v_cache", lambda c: dict(v_cache=c.v_cache[:, :8])),
    "v_kv_heads": (ValueError, "v_cache", lambda c: dict(v_cache=c.v_cache[:, :, :1])),
    "block_table_batch": (ValueError, "block_table", lambda c: dict(block_table=c.block_table[:1])),
    "seq_lens_batch": (ValueError, "seq_lens", lambda c: dict(seq_lens=c.seq_lens[:1])),
    "q_rank_2": (ValueError, r"\bq\b", lambda c: dict(q=c.q[0])),
    "scale_zero": (ValueError, "scale", lambda c: dict(scale=0.0)),
    "scale_nan": (ValueError, "scale", lambda c: dict(scale=float("nan"))),
    "soft_cap_negative": (ValueError, "logits_soft_cap", lambda c: dict(logits_soft_cap=-1.0)),
    "num_splits_129": (ValueError, "num_splits", lambda c: dict(num_splits=129)),
    "num_threads_negative": (ValueError, "num_threads", lambda c: dict(num_threads=-2)),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_cpu_bad_inputs(name):
    seed("cpu_bad")
    error, pattern, change = BAD_INPUTS[name]
    case = _small()
    args = dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, block_table=case.block_table,
                seq_lens=case.seq_lens)
    args.update(change(case))
    with pytest.raises(error, match=pattern):
        decode_attention(**args)


def test_cpu_merge_bad_inputs():
    v, lse = torch.randn(3, 4, 64), torch.randn(3, 4)
    with pytest.raises(TypeError, match="v_b"):
        merge_attention_states(v, lse, v.half(), lse)
    with pytest.raises(TypeError, match="lse_a"):
        merge_attention_states(v, lse.double(), v, lse)
    with pytest.raises(ValueError):
        merge_attention_states(v, lse, v[:, :3], lse)  # heads differ
    with pytest.raises(ValueError):
        merge_attention_states(v, lse[:, :3], v, lse)
    with pytest.raises(ValueError):
        merge_attention_states(torch.randn(3, 64, 4).transpose(1, 2), lse, v, lse)  # dims not contiguous
    with pytest.raises(ValueError):
        merge_attention_states(torch.randn(64), lse, v, lse)


@pytest.mark.parametrize("bad", [99, -1, 6])
def test_cpu_bad_block_id(bad):
    """A bad id among the blocks a request reads raises naming the entry; out= is untouched."""
    seed("cpu_bad_block", bad)
    case = _small()  # requests of 20 and 40 tokens, block 16: request 1 reads columns 0..2
    case.block_table[1, 2] = bad
    out = torch.full(case.q.shape, 7.0)
    with pytest.raises(ValueError, match=rf"block_table\[1, 2\] = {bad}\b"):
        decode_attention(*case.args(), out=out)
    assert (out == 7.0).all(), "a rejected call must not write out"
    # The same id in an entry no request reads is padding: fine.
    case = _small()
    case.block_table[0, 2] = bad
    run_checked(case, torch.float32)
    # ... and so is a block wholly before the sliding window (request 1 reads columns 1..2).
    case = _small()
    case.block_table[1, 0] = bad
    run_checked(case, torch.float32, sliding_window=20)


@pytest.mark.parametrize("bad", [65, -1, 2**31 - 1])
def test_cpu_bad_seq_len(bad):
    seed("cpu_bad_len", bad)
    case = _small()  # 3 + 1 spare columns of 16: capacity 64
    case.seq_lens[1] = bad
    out = torch.full(case.q.shape, 7.0)
    with pytest.raises(ValueError, match=rf"seq_lens\[1\] = {bad}\b"):
        decode_attention(*case.args(), out=out)
    assert (out == 7.0).all(), "a rejected call must not write out"
    case.seq_lens[1] = 64  # the full capacity is fine (the spare column holds padding -1: fill it)
    case.block_table[1, 3] = 0
    run_checked(case, torch.float32)


def test_cpu_torch_compile():
    seed("cpu_compile")
    case = make_paged_case([50, 7, 0], 8, 2, 64, 16, torch.float32)

    def fn(q, k_cache, v_cache, block_table, seq_lens):
        out, lse = decode_attention(q, k_cache, v_cache, block_table, seq_lens, return_lse=True, sliding_window=30)
        return out * 2, lse

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    got, want = compiled(*case.args()), fn(*case.args())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ----------------------------------------------------------------------------- CUDA


def cuda_case(lens, *args, **kw) -> PagedCase:
    """make_paged_case on the GPU, drawn there (long cases are large)."""
    return make_paged_case(lens, *args, device="cuda", **kw)


@pytest.fixture
def clean_cuda_errors():
    if HAS_CUDA:
        pop_decode_attention_error("cuda")
    yield
    if HAS_CUDA:
        assert pop_decode_attention_error("cuda") is None, "a test left an error record behind"


@cuda_only
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_nan_propagates(dtype, num_splits, clean_cuda_errors):
    check_nan_propagates("cuda", dtype, num_splits=num_splits)


@cuda_only
@pytest.mark.parametrize("config", CUDA_CONFIGS, ids=lambda c: f"H{c[0]}_KH{c[1]}_bs{c[2]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_reference(dtype, head_dim, config, clean_cuda_errors):
    num_heads, num_kv_heads, block_size = config
    seed("cuda_reference", dtype, head_dim, config)
    lens = ragged_lens(block_size, 3000) + [777]
    case = cuda_case(lens, num_heads, num_kv_heads, head_dim, block_size, dtype, shared=True, q_scale=2.0)
    run_checked(case, dtype)
    run_checked(case, dtype, out_given=False, num_splits=1)


@cuda_only
@pytest.mark.parametrize("heads", [(16, 2), (32, 8)], ids=lambda h: f"H{h[0]}_KH{h[1]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_long(dtype, head_dim, heads, clean_cuda_errors):
    """Past 32768 keys, planned and forced split counts, with and without a window."""
    seed("cuda_long", dtype, head_dim, heads)
    lens = [32768 + 37, 40000, 1, 0, 777]
    case = cuda_case(lens, *heads, head_dim, 16, dtype, shared=True, q_scale=2.0)
    want = case.ref()
    for splits in (None, 1, 7, 8):
        run_checked(case, dtype, num_splits=splits, what=f"num_splits={splits}", want=want)
    run_checked(case, dtype, sliding_window=20000, what="window")


@cuda_only
@pytest.mark.parametrize("kw", [{}, {"sliding_window": 700}, {"logits_soft_cap": 30.0}, {"scale": 0.05}],
                         ids=["plain", "window", "soft_cap", "scale"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_split_vs_unsplit(dtype, head_dim, kw, clean_cuda_errors):
    """num_splits=1 (no workspace) and forced splits (more splits than some requests have keys,
    the maximum 128) agree with each other and with the reference. On sm_90 this grid of up to 8
    splits merges inside the kernel (one cluster per request and KV head), more in MergeSplitsKernel."""
    seed("cuda_splits", dtype, head_dim, tuple(kw.items()))
    case = cuda_case([5000, 0, 1, 5, 300, 2049], 16, 2, head_dim, 16, dtype, q_scale=2.0)
    want = case.ref(**kw)
    base, base_lse = run_checked(case, dtype, num_splits=1, what="unsplit", want=want, **kw)
    atol, rtol = OUT_TOL[dtype]
    for splits in (2, 7, 8, 9, 128, None):
        out, lse = run_checked(case, dtype, num_splits=splits, what=f"num_splits={splits}", want=want, **kw)
        torch.testing.assert_close(out.double(), base.double(), atol=2 * atol, rtol=2 * rtol)
        torch.testing.assert_close(lse, base_lse, atol=2 * LSE_TOL[dtype][0], rtol=2 * LSE_TOL[dtype][1])


@cuda_only
@pytest.mark.parametrize("window", [1, 7, 16, 100, 10**6])
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_sliding_window(dtype, window, clean_cuda_errors):
    seed("cuda_window", dtype, window)
    lens = [4000, 0, 1, 5, 16, 17, 100, 101]
    case = cuda_case(lens, 32, 8, 128, 16, dtype, shared=True, q_scale=2.0)
    for splits in (1, 7):
        run_checked(case, dtype, sliding_window=window, num_splits=splits)


@cuda_only
@pytest.mark.parametrize("cap", [1.0, 30.0])
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_soft_cap_and_scale(dtype, cap, clean_cuda_errors):
    seed("cuda_cap", dtype, cap)
    case = cuda_case([2570, 3, 40], 16, 4, 128, 16, dtype, q_scale=4.0)
    run_checked(case, dtype, logits_soft_cap=cap)
    run_checked(case, dtype, logits_soft_cap=cap, scale=0.3, sliding_window=333)
    run_checked(case, dtype, scale=0.02)


@cuda_only
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_large_logits(dtype, clean_cuda_errors):
    seed("cuda_large", dtype)
    case = cuda_case([7000, 33, 1], 8, 2, 64, 16, dtype, q_scale=300.0)
    for splits in (1, 7):
        out, _ = run_checked(case, dtype, num_splits=splits)
        assert torch.isfinite(out).all()


@cuda_only
@pytest.mark.parametrize("window", [-1, 20])
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_stale_slots_ignored(dtype, window, clean_cuda_errors):
    seed("cuda_stale", dtype, window)
    lens = [1300, 0, 1, 15, 16, 17, 63]
    case = cuda_case(lens, 8, 2, 128, 16, dtype, shared=True, stale=NAN, window=window, spare_columns=2)
    for splits in (1, 7):
        out, _ = run_checked(case, dtype, sliding_window=window, num_splits=splits)
        assert not out.isnan().any()
    case.block_table[:, -1] = 2**31 - 1
    run_checked(case, dtype, sliding_window=window)


@cuda_only
@pytest.mark.parametrize("window", [-1, 5, 16, 1000])
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_needles_at_the_edges(dtype, window, clean_cuda_errors):
    seed("cuda_needles", dtype, window)
    lens = [1, 15, 16, 17, 33, 64, 100, 1000, 4097]
    case = cuda_case(lens, 16, 2, 128, 16, dtype)
    plant_needles(case, lens, window, target_logit=12.0)
    for splits in (1, 7, None):
        run_checked(case, dtype, sliding_window=window, num_splits=splits)


@cuda_only
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_strided_inputs(dtype, clean_cuda_errors):
    seed("cuda_strided", dtype)
    case = cuda_case([77, 0, 16, 2000], 16, 2, 128, 16, dtype, fused_kv=True, q_batch_pad=3, table_row_pad=5,
                     shared=True)
    for splits in (1, 7):
        run_checked(case, dtype, out_given=False, num_splits=splits)
        run_checked(case, dtype, num_splits=splits)


@cuda_only
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_large_batch(dtype, clean_cuda_errors):
    """Many requests of random lengths: the unsplit plan with many CTAs."""
    seed("cuda_batch", dtype)
    lens = torch.randint(0, 600, (256,)).tolist()
    case = cuda_case(lens, 32, 8, 128, 16, dtype)
    run_checked(case, dtype)


@cuda_only
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_matches_cpu(dtype, clean_cuda_errors):
    seed("cuda_cpu", dtype)
    case = make_paged_case([900, 0, 33, 1, 500], 16, 2, 128, 16, dtype, shared=True, q_scale=2.0)
    cpu_out, cpu_lse = decode_attention(*case.args(), return_lse=True, sliding_window=600, logits_soft_cap=20.0)
    gpu = PagedCase(*(t.cuda() for t in case.args()))
    gpu_out, gpu_lse = run_checked(gpu, dtype, sliding_window=600, logits_soft_cap=20.0)
    atol, rtol = OUT_TOL[dtype]
    torch.testing.assert_close(gpu_out.cpu().double(), cpu_out.double(), atol=2 * atol, rtol=2 * rtol)
    torch.testing.assert_close(gpu_lse.cpu(), cpu_lse, atol=2 * LSE_TOL[dtype][0], rtol=2 * LSE_TOL[dtype][1])


@cuda_only
@pytest.mark.parametrize("split_blocks", [1, 40])
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_merge_vs_union(dtype, split_blocks, clean_cuda_errors):
    seed("cuda_merge_union", dtype, split_blocks)
    case = cuda_case([1000, 0, 10, 16, 17, 640, 2500], 32, 8, 128, 16, dtype, shared=True, q_scale=2.0)
    merge_union(case, split_blocks, dtype)


@cuda_only
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_merge_random(dtype):
    seed("cuda_merge", dtype)
    check_merge_random("cuda", dtype)


@cuda_only
@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_cuda_graph(num_splits, clean_cuda_errors):
    """Capture once (check=False), then change seq_lens, block_table and q in place: the replay
    follows the new values (the split plan depends on shapes only)."""
    seed("cuda_graph", num_splits)
    dtype = torch.bfloat16
    lens = [3000, 17, 0, 900]
    case = cuda_case(lens, 32, 8, 128, 16, dtype, spare_columns=2)
    capacity = case.block_table.shape[1] * 16
    num_blocks = case.k_cache.shape[0]
    decode_attention(*case.args(), num_splits=num_splits)  # warm-up: module, flag buffer, plan
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        decode_attention(*case.args(), num_splits=num_splits)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = decode_attention(*case.args(), num_splits=num_splits, return_lse=True, check=False)
    for new_lens in ([5, capacity, 1, 0], [0, 0, 0, 0], [3001, 2999, 16, 17]):
        case.seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        rows = torch.randint(0, num_blocks, case.block_table.shape, dtype=torch.int32)
        case.block_table.copy_(rows)
        case.q.copy_(torch.randn(case.q.shape).to(dtype))
        out.fill_(NAN)
        graph.replay()
        torch.cuda.synchronize()
        assert pop_decode_attention_error("cuda") is None
        assert_attention(out, lse, *case.ref(), dtype, f"replay with seq_lens {new_lens}")


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_cuda_bad_block_id(dtype, clean_cuda_errors):
    seed("cuda_bad_block", dtype)
    case = make_paged_case([20, 40], 8, 2, 64, 16, dtype, device="cuda", spare_blocks=0)
    case.block_table[1, 2] = 99  # request 1's last block (tokens 32..39)
    out = torch.full(case.q.shape, NAN, dtype=dtype, device="cuda")
    with pytest.raises(ValueError, match=r"block_table\[1, 2\] = 99\b"):
        decode_attention(*case.args(), out=out, check=True)
    assert pop_decode_attention_error("cuda") is None, "the raise consumed the record"
    # Unchecked: no raise, the record waits; the bad block's keys are masked, the rest computed.
    out, lse = decode_attention(*case.args(), return_lse=True)
    message = pop_decode_attention_error("cuda")
    assert message is not None and "block_table[1, 2] = 99" in message, message
    assert pop_decode_attention_error("cuda") is None
    masked = PagedCase(case.q, case.k_cache, case.v_cache, case.block_table,
                       torch.tensor([20, 32], dtype=torch.int32, device="cuda"))
    assert_attention(out, lse, *masked.ref(), dtype, "bad block masked")
    # Negative ids; padding entries and blocks before the window are never read: no record.
    case.block_table[1, 2] = -5
    with pytest.raises(ValueError, match=r"block_table\[1, 2\] = -5\b"):
        decode_attention(*case.args(), check=True)
    case.block_table[1, 2] = 0
    case.block_table[0, 2] = case.block_table[0, 3] = -1
    case.block_table[1, 0] = 2**31 - 1
    run_checked(case, dtype, sliding_window=20)


@cuda_only
@pytest.mark.parametrize("bad", [65, -1, 2**31 - 1])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=dtype_id)
def test_cuda_bad_seq_len(dtype, bad, clean_cuda_errors):
    seed("cuda_bad_len", dtype, bad)
    case = make_paged_case([20, 40], 8, 2, 64, 16, dtype, device="cuda", spare_blocks=0, spare_columns=1)
    case.block_table[1, 3] = 0  # the spare column, so that the clamped length reads valid blocks
    case.seq_lens[1] = bad
    with pytest.raises(ValueError, match=rf"seq_lens\[1\] = {bad}\b"):
        decode_attention(*case.args(), check=True)
    assert pop_decode_attention_error("cuda") is None
    out, lse = decode_attention(*case.args(), return_lse=True)
    assert pop_decode_attention_error("cuda") is not None
    clamped = PagedCase(case.q, case.k_cache, case.v_cache, case.block_table,
                        torch.tensor([20, min(max(bad, 0), 64)], dtype=torch.int32, device="cuda"))
    assert_attention(out, lse, *clamped.ref(), dtype, "clamped seq_len")


@cuda_only
def test_cuda_bad_inputs(clean_cuda_errors):
    seed("cuda_bad")
    case = make_paged_case([20, 40], 8, 2, 64, 16, torch.bfloat16, device="cuda")
    q, kc, vc, table, lens = case.args()
    with pytest.raises(TypeError, match="k_cache"):
        decode_attention(q, kc.half(), vc, table, lens)
    with pytest.raises(ValueError, match="head_dim"):
        decode_attention(torch.randn(2, 8, 96, device="cuda", dtype=torch.bfloat16),
                         torch.randn(6, 16, 2, 96, device="cuda", dtype=torch.bfloat16),
                         torch.randn(6, 16, 2, 96, device="cuda", dtype=torch.bfloat16), table, lens)
    with pytest.raises(ValueError, match="num_heads"):
        decode_attention(q[:, :6], kc[:, :, :1].repeat(1, 1, 4, 1), vc[:, :, :1].repeat(1, 1, 4, 1), table, lens)
    with pytest.raises(ValueError, match="k_cache"):
        decode_attention(q, kc.transpose(1, 2).contiguous().transpose(1, 2), vc, table, lens)
    with pytest.raises(ValueError, match="num_splits"):
        decode_attention(*case.args(), num_splits=129)


@cuda_only
def test_cuda_mismatched_devices(clean_cuda_errors):
    case = make_paged_case([20, 40], 8, 2, 64, 16, torch.bfloat16, device="cuda")
    q, kc, vc, table, lens = case.args()
    for args in ((q, kc, vc, table.cpu(), lens), (q, kc, vc, table, lens.cpu()), (q, kc.cpu(), vc, table, lens),
                 (q.cpu(), kc, vc, table, lens)):
        with pytest.raises(ValueError, match="device"):
            decode_attention(*args)
    with pytest.raises(ValueError, match="device"):
        decode_attention(*case.args(), out=torch.empty(q.shape, dtype=q.dtype))
    v, lse = torch.randn(3, 4, 64, device="cuda"), torch.randn(3, 4, device="cuda")
    with pytest.raises(ValueError, match="device"):
        merge_attention_states(v, lse, v, lse.cpu())


@cuda_only
def test_cuda_unaligned_rows_rejected(clean_cuda_errors):
    # 16-byte vector loads and cp.async: a q or cache whose rows are not 16-byte aligned raises
    # (naming it) instead of faulting.
    seed("unaligned")
    case = cuda_case([20], 4, 2, 64, 16, torch.float16)
    buffer = torch.randn(4 * 64 + 1, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="q must be 16-byte aligned"):
        decode_attention(buffer[1:].view(1, 4, 64), case.k_cache, case.v_cache, case.block_table, case.seq_lens)
    cache = torch.randn(case.k_cache.numel() + 1, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="k_cache must be 16-byte aligned"):
        decode_attention(case.q, cache[1:].view(case.k_cache.shape), case.v_cache, case.block_table, case.seq_lens)



# ----------------------------------------------------------------------------- float8 caches

F8 = torch.float8_e4m3fn
F8_SCALES = ["none", "float", "tensor1", "per_head"]


def fp8_scales(mode: str, num_kv_heads: int, device):
    """(k_scale, v_scale) arguments of a mode and their per-head values (float64, CPU)."""
    if mode == "none":
        return None, None, torch.ones(num_kv_heads, dtype=torch.float64), torch.ones(num_kv_heads, dtype=torch.float64)
    if mode == "float":
        return 0.03, 0.4, torch.full((num_kv_heads,), 0.03, dtype=torch.float64), torch.full(
            (num_kv_heads,), 0.4, dtype=torch.float64)
    if mode == "tensor1":
        k, v = torch.tensor(0.02, device=device), torch.tensor([0.7], device=device)
        return k, v, torch.full((num_kv_heads,), 0.02, dtype=torch.float64), torch.full(
            (num_kv_heads,), 0.7, dtype=torch.float64)
    k = torch.rand(num_kv_heads, device=device) * 0.05 + 0.01
    v = torch.rand(num_kv_heads, device=device) + 0.2
    return k, v, k.double().cpu(), v.double().cpu()


def fp8_case(case: PagedCase, k_per_head, v_per_head):
    """case's caches quantized to float8 with the scales (K, V ~ N(0, 1) here, so a k scale of
    ~0.03 spreads them over e4m3's range), and their dequantized float64 values for the reference."""
    shape = (1, 1, -1, 1)
    dev = case.k_cache.device
    k8 = (case.k_cache.float() / k_per_head.float().to(dev).view(shape)).clamp(-448, 448).to(F8)
    v8 = (case.v_cache.float() / v_per_head.float().to(dev).view(shape)).clamp(-448, 448).to(F8)
    k64 = k8.double() * k_per_head.to(dev).view(shape)
    v64 = v8.double() * v_per_head.to(dev).view(shape)
    return k8, v8, k64, v64


def check_fp8(device, dtype, head_dim, config, mode, lens, **kw):
    num_heads, num_kv_heads, block_size = config
    seed("fp8", device, dtype, head_dim, config, mode, lens, kw)
    case = make_paged_case(lens, num_heads, num_kv_heads, head_dim, block_size, dtype, device=device, shared=True)
    k_scale, v_scale, k_per_head, v_per_head = fp8_scales(mode, num_kv_heads, device)
    k8, v8, k64, v64 = fp8_case(case, k_per_head, v_per_head)
    ref_kw = {k: kw[k] for k in ("sliding_window", "logits_soft_cap") if k in kw}
    want = PagedCase(case.q, k64, v64, case.block_table, case.seq_lens).ref(**ref_kw)
    out = torch.full(case.q.shape, NAN, dtype=dtype, device=device)
    got, lse = decode_attention(case.q, k8, v8, case.block_table, case.seq_lens, k_scale=k_scale, v_scale=v_scale,
                                return_lse=True, out=out, **kw)
    if device == "cuda":
        assert pop_decode_attention_error(device) is None
    assert_attention(got, lse, *want, dtype, f"fp8 {mode}")


def check_fp8_every_byte(device, dtype):
    """One key per request: out is its value row exactly (times v_scale, a power of two), so all
    256 e4m3 bytes in a head_dim 256 row must come back as torch converts them (NaN as NaN)."""
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    v8 = bits.view(F8).view(1, 1, 1, 256).to(device)
    k8 = torch.zeros_like(v8)
    q = torch.randn(1, 2, 256, device=device).to(dtype)
    table = torch.zeros(1, 1, dtype=torch.int32, device=device)
    lens = torch.ones(1, dtype=torch.int32, device=device)
    out = decode_attention(q, k8, v8, table, lens, v_scale=0.5)
    want = (bits.view(F8).double() * 0.5).to(dtype)
    got = out.cpu()[0, 0]
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan) and torch.equal(got[~nan], want[~nan])


def check_fp8_store_roundtrip(device, dtype):
    """store_kv_cache quantizes into the float8 cache that decode_attention then reads: the same
    as decoding the dequantized values the store produced (checked bytewise in test_kv_cache)."""
    from mllm_kernel.kernels.kv_cache import store_kv_cache

    seed("fp8_roundtrip", device, dtype)
    num_blocks, block_size, kv_heads, head_dim, heads = 6, 16, 2, 128, 8
    tokens = 70
    k = torch.randn(tokens, kv_heads, head_dim, device=device).to(dtype)
    v = torch.randn(tokens, kv_heads, head_dim, device=device).to(dtype)
    k_scale = torch.tensor([0.02, 0.05], device=device)
    k8 = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=F8, device=device)
    v8 = torch.zeros_like(k8)
    table = torch.tensor([[3, 0, 5, 1, 4]], dtype=torch.int32, device=device)
    slots = (table[0].long().repeat_interleave(block_size) * block_size + torch.arange(block_size, device=device).repeat(5))[:tokens]
    store_kv_cache(k, v, k8, v8, slots, k_scale=k_scale, v_scale=0.25)
    lens = torch.tensor([tokens], dtype=torch.int32, device=device)
    q = torch.randn(1, heads, head_dim, device=device).to(dtype)
    got, lse = decode_attention(q, k8, v8, table, lens, k_scale=k_scale, v_scale=0.25, return_lse=True)
    k64 = k8.double() * k_scale.double().view(1, 1, -1, 1)
    v64 = v8.double() * 0.25
    want = PagedCase(q, k64, v64, table, lens).ref()
    assert_attention(got, lse, *want, dtype, "store -> decode")
    # And the stored values are the inputs within e4m3's half-ulp: 2^-4 relative, and half the
    # subnormal step (2^-10) times the largest scale (0.05) near zero.
    stored = k64.view(-1, kv_heads, head_dim)[slots].cpu()
    assert torch.allclose(stored, k.double().cpu(), rtol=2 ** -4, atol=0.05 * 2 ** -10 * 1.001)


@pytest.mark.parametrize("mode", F8_SCALES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_fp8_cache(dtype, head_dim, mode):
    check_fp8("cpu", dtype, head_dim, (8, 2, 16), mode, [300, 0, 1, 17])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_cpu_fp8_window_cap_threads(dtype):
    check_fp8("cpu", dtype, 128, (16, 4, 7), "per_head", [500, 33], sliding_window=100, logits_soft_cap=20.0)
    check_fp8("cpu", dtype, 64, (4, 4, 1), "float", [90, 3], num_threads=3)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_fp8_every_byte(dtype):
    check_fp8_every_byte("cpu", dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_fp8_store_roundtrip(dtype):
    check_fp8_store_roundtrip("cpu", dtype)


def test_fp8_scale_arguments():
    # A scale needs a float8 cache; a float8 cache needs both caches float8; scales are checked.
    case = make_paged_case([20], 4, 2, 64, 16, torch.float32)
    k8, v8 = case.k_cache.to(F8), case.v_cache.to(F8)
    with pytest.raises(ValueError, match="k_scale applies to float8_e4m3fn caches only"):
        decode_attention(*case.args(), k_scale=0.5)
    with pytest.raises((ValueError, TypeError), match="v_cache"):
        decode_attention(case.q, k8, case.v_cache, case.block_table, case.seq_lens)
    for bad, match in ((float("inf"), "k_scale"), (0.0, "k_scale"), (-1.0, "k_scale"), (1e39, "k_scale"),
                       (torch.ones(3), "k_scale"), (torch.ones(2, dtype=torch.float64), "k_scale")):
        with pytest.raises((ValueError, TypeError), match=match):
            decode_attention(case.q, k8, v8, case.block_table, case.seq_lens, k_scale=bad)
    with pytest.raises(TypeError, match="v_scale"):
        decode_attention(case.q, k8, v8, case.block_table, case.seq_lens, v_scale="1")


@cuda_only
@pytest.mark.parametrize("mode", F8_SCALES)
@pytest.mark.parametrize("config", [(8, 8, 16), (32, 8, 16), (16, 2, 1), (40, 2, 7)],
                         ids=lambda c: f"H{c[0]}_KH{c[1]}_bs{c[2]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", CUDA_FP8_Q_DTYPES, ids=dtype_id)
def test_cuda_fp8_cache(dtype, head_dim, config, mode, clean_cuda_errors):
    lens = ragged_lens(config[2], 2000) + [777]
    check_fp8("cuda", dtype, head_dim, config, mode, lens)
    check_fp8("cuda", dtype, head_dim, config, mode, lens, num_splits=1)
    check_fp8("cuda", dtype, head_dim, config, mode, lens, num_splits=5)


@cuda_only
@pytest.mark.parametrize("dtype", CUDA_FP8_Q_DTYPES, ids=dtype_id)
def test_cuda_fp8_window_cap_long(dtype, clean_cuda_errors):
    check_fp8("cuda", dtype, 128, (16, 4, 16), "per_head", [40000, 33], sliding_window=5000, logits_soft_cap=20.0)
    check_fp8("cuda", dtype, 256, (8, 1, 16), "float", [33000, 1, 0])


@cuda_only
@pytest.mark.parametrize("exponent", [-90, -40, 40, 100])
def test_cuda_fp8_bf16_q_outside_fp16_range(exponent, clean_cuda_errors):
    # With a float8 cache the products run in float16: bfloat16 q rows far outside float16's
    # range (per head 2^(exponent + [-3, 3])) must give the reference's answer, with scale
    # bringing the logits back near 1.
    seed("fp8_q_range", exponent)
    case = cuda_case([300, 17, 1], 16, 4, 128, 16, torch.bfloat16)
    k_scale, v_scale, k_per_head, v_per_head = fp8_scales("per_head", 4, "cuda")
    k8, v8, k64, v64 = fp8_case(case, k_per_head, v_per_head)
    head_exp = torch.randint(-3, 4, (16, 1), device="cuda").double() + exponent
    q = (case.q.double() * torch.exp2(head_exp)).to(torch.bfloat16)
    assert torch.isfinite(q).all() and (q != 0).any()
    scale = 128 ** -0.5 * 2.0 ** -exponent
    want = PagedCase(q, k64, v64, case.block_table, case.seq_lens).ref(scale=scale)
    got, lse = decode_attention(q, k8, v8, case.block_table, case.seq_lens, k_scale=k_scale, v_scale=v_scale,
                                scale=scale, return_lse=True)
    assert pop_decode_attention_error("cuda") is None
    assert_attention(got, lse, *want, torch.bfloat16, f"q * 2^{exponent}")


@cuda_only
@pytest.mark.parametrize("dtype", CUDA_FP8_Q_DTYPES, ids=dtype_id)
def test_cuda_fp8_every_byte(dtype, clean_cuda_errors):
    check_fp8_every_byte("cuda", dtype)


@cuda_only
@pytest.mark.parametrize("dtype", CUDA_FP8_Q_DTYPES, ids=dtype_id)
def test_cuda_fp8_store_roundtrip(dtype, clean_cuda_errors):
    check_fp8_store_roundtrip("cuda", dtype)


@cuda_only
def test_cuda_fp8_graph_reads_scale_tensors(clean_cuda_errors):
    # Scale tensors are read by the kernel: a captured graph follows their updates.
    seed("fp8_graph")
    case = cuda_case([300, 45], 8, 2, 128, 16, torch.bfloat16)
    k_scale, v_scale = torch.tensor([0.03, 0.05], device="cuda"), torch.tensor([0.5], device="cuda")
    k8, v8, _, _ = fp8_case(case, k_scale.double().cpu(), v_scale.double().cpu().expand(2))
    out = torch.empty_like(case.q)
    decode_attention(case.q, k8, v8, case.block_table, case.seq_lens, k_scale=k_scale, v_scale=v_scale, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(case.q, k8, v8, case.block_table, case.seq_lens, k_scale=k_scale, v_scale=v_scale, out=out)
    for ks, vs in (([0.03, 0.05], 0.5), ([0.01, 0.2], 2.0)):
        k_scale.copy_(torch.tensor(ks))
        v_scale.fill_(vs)
        graph.replay()
        torch.cuda.synchronize()
        k64 = k8.double() * torch.tensor(ks, dtype=torch.float64, device="cuda").view(1, 1, -1, 1)
        want = PagedCase(case.q, k64, v8.double() * vs, case.block_table, case.seq_lens).ref()
        assert_attention(out, None, *want, torch.bfloat16, f"graph replay with k_scale {ks}")


@cuda_only
def test_cuda_float32_q_rejects_float8_cache():
    case = make_paged_case([20], 8, 2, 64, 16, torch.float32, device="cuda")
    fp8 = case.k_cache.to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="float32 q needs a float32 k_cache and v_cache on CUDA"):
        decode_attention(case.q, fp8, fp8, case.block_table, case.seq_lens)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
