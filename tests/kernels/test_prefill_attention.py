"""prefill_attention and paged_prefill_attention (kernels/prefill_attention) against the float64
references of kernels/prefill_attention/cases.py.

CPU tests run once per SIMD target (conftest.py's autouse `simd_target` fixture) and cover a
representative subset at short lengths; the CUDA tests run the full matrix (every head_dim x
dtype x group size, block sizes 1/16/24/32/64, lengths 1 to 4097), CUDA-graph replay with changed
lengths and the device-side error record.

Tolerances as test_decode_attention.py: an output is a convex combination of V rows; lse
(float32) with 1e-4 (float32 inputs) or 2e-3 (16-bit inputs) absolute plus a relative term. Every
`out=` is poisoned with NaN first, so an element the kernel never writes fails the comparison.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from mllm_kernel.kernels.decode_attention import decode_attention
from mllm_kernel.kernels.prefill_attention import (
    paged_prefill_attention,
    pop_prefill_attention_error,
    prefill_attention,
)
from mllm_kernel.kernels.prefill_attention.cases import (
    RaggedCase,
    allowed_keys,
    make_paged_prefill_case,
    make_ragged_case,
    tree_mask,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CUDA_DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [64, 128, 256]
HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
NAN, NEG_INF = float("nan"), float("-inf")

OUT_TOL = {torch.float32: (2e-5, 2e-4), torch.float16: (2e-3, 8e-3), torch.bfloat16: (1.6e-2, 3.2e-2)}
LSE_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 1e-3), torch.bfloat16: (2e-3, 1e-3)}
HEADS = [(8, 8), (8, 2), (16, 2)]  # group sizes 1, 4, 8

# (lens_q, lens_k): ragged prompts (k = q), prefix caching / chunked prefill (k > q), a request
# without queries, one whose keys are fewer than its queries (its first queries see nothing).
SHORT = ([1, 15, 16, 17, 0, 40], [1, 15, 16, 17, 9, 40])
PREFIX = ([7, 33, 1, 64], [50, 33, 130, 64])
FEWER_KEYS = ([20, 5], [12, 5])
CUDA_LONG = ([1, 15, 16, 17, 127, 1000, 4097], [1, 15, 16, 17, 127, 1000, 4097])
CUDA_LONG_PREFIX = ([127, 1000, 65], [1127, 4097, 3000])
# Requests averaging >= 2048 queries: ragged head_dim 64 then runs 192-row work items (three
# consumer warpgroups on Hopper, prefill_attention.cuh kWideRows); these leave partial last items.
CUDA_WIDE = ([2500, 1700, 2049], [2500, 1700, 2049])
CUDA_WIDE_PREFIX = ([2100, 2300], [4000, 2300])


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def gen_for(*parts) -> torch.Generator:
    """A per-test generator that does not depend on PYTHONHASHSEED."""
    return torch.Generator().manual_seed(zlib.crc32(repr(parts).encode()))


def assert_attention(out, lse, want_out, want_lse, dtype, what=""):
    assert out.dtype == dtype and out.shape == want_out.shape, (out.dtype, out.shape)
    atol, rtol = OUT_TOL[dtype]
    torch.testing.assert_close(out.double().cpu(), want_out, atol=atol, rtol=rtol, msg=lambda m: f"out {what}: {m}")
    empty = torch.isneginf(want_lse)
    assert torch.equal(out.cpu()[empty], torch.zeros_like(out.cpu()[empty])), f"out {what}: no keys must give 0"
    atol, rtol = LSE_TOL[dtype]
    lse = lse.double().cpu()
    assert lse.dtype == torch.float64 and lse.shape == want_lse.shape
    assert torch.equal(torch.isneginf(lse), empty), f"lse {what}: -inf exactly where there are no keys"
    torch.testing.assert_close(lse[~empty], want_lse[~empty], atol=atol, rtol=rtol, msg=lambda m: f"lse {what}: {m}")


def assert_no_device_error(device):
    if torch.device(device).type == "cuda":
        assert pop_prefill_attention_error(device) is None


def run_ragged(case, dtype, what="", **kw):
    out = torch.full(case.q.shape, NAN, dtype=case.q.dtype, device=case.q.device)
    got, lse = prefill_attention(*case.args(), out=out, return_lse=True, **kw)
    assert got is out
    assert_no_device_error(case.q.device)
    want_out, want_lse = case.ref(**kw)
    assert_attention(out, lse, want_out, want_lse, dtype, what)
    return out, lse


def run_paged(case, dtype, what="", custom_masks=None, **kw):
    out = torch.full(case.q.shape, NAN, dtype=case.q.dtype, device=case.q.device)
    flat = None
    if custom_masks is not None:
        flat = torch.cat([m.flatten() for m in custom_masks]).to(case.q.device)
    got, lse = paged_prefill_attention(*case.args(), custom_mask=flat, out=out, return_lse=True, **kw)
    assert got is out
    assert_no_device_error(case.q.device)
    want_out, want_lse = case.ref(custom_masks=custom_masks, **kw)
    assert_attention(out, lse, want_out, want_lse, dtype, what)
    return out, lse


def tree_masks(lens_q, lens_k, gen):
    """A random draft tree per request: its last len_q keys are the draft tokens."""
    return [tree_mask(k - q, q, gen) for q, k in zip(lens_q, lens_k)]


# ----------------------------------------------------------------------------- both devices
# Each check runs as test_cpu_<name> (every SIMD target, DTYPES) and test_cuda_<name> (CUDA_DTYPES).

def check_ragged_reference(device, dtype, head_dim, heads):
    gen = gen_for("ragged", device, dtype, head_dim, heads)
    for lens in (SHORT, PREFIX, FEWER_KEYS):
        case = make_ragged_case(*lens, *heads, head_dim, dtype, device, gen)
        run_ragged(case, dtype, f"causal {lens}")
    case = make_ragged_case(*PREFIX, *heads, head_dim, dtype, device, gen)
    run_ragged(case, dtype, "not causal", causal=False)


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"H{h[0]}_KH{h[1]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_ragged_reference(dtype, head_dim, heads):
    check_ragged_reference("cpu", dtype, head_dim, heads)


@cuda_only
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"H{h[0]}_KH{h[1]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_ragged_reference(dtype, head_dim, heads):
    check_ragged_reference("cuda", dtype, head_dim, heads)


def check_paged_reference(device, dtype, block_size):
    gen = gen_for("paged", device, dtype, block_size)
    for lens in (SHORT, PREFIX, FEWER_KEYS):
        case = make_paged_prefill_case(*lens, 8, 2, 128, block_size, dtype, device, gen)
        run_paged(case, dtype, f"causal {lens}")
    case = make_paged_prefill_case(*PREFIX, 16, 2, 64, block_size, dtype, device, gen)
    run_paged(case, dtype, "not causal", causal=False)


@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_paged_reference(dtype, block_size):
    check_paged_reference("cpu", dtype, block_size)


@cuda_only  # 24: cp.async at a size that tiles nothing; 32: the smallest pages that go by TMA boxes
@pytest.mark.parametrize("block_size", [1, 16, 24, 32, 64])
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_paged_reference(dtype, block_size):
    check_paged_reference("cuda", dtype, block_size)


def check_tree_mask(device, dtype, head_dim):
    gen = gen_for("tree", device, dtype, head_dim)
    lens_q, lens_k = [5, 1, 16, 9], [37, 1, 80, 9]  # the last request: a tree without a prefix
    case = make_paged_prefill_case(lens_q, lens_k, 8, 2, head_dim, 16, dtype, device, gen)
    run_paged(case, dtype, "tree", custom_masks=tree_masks(lens_q, lens_k, gen))
    # A random mask (not a tree), with rows that see nothing, and with a window on top.
    masks = [torch.rand(q, k, generator=gen) < 0.3 for q, k in zip(lens_q, lens_k)]
    run_paged(case, dtype, "random mask", custom_masks=masks)
    run_paged(case, dtype, "random mask + window", custom_masks=masks, sliding_window=6)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_tree_mask(dtype, head_dim):
    check_tree_mask("cpu", dtype, head_dim)


@cuda_only
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_tree_mask(dtype, head_dim):
    check_tree_mask("cuda", dtype, head_dim)


def check_sliding_window(device, dtype, window):
    gen = gen_for("window", device, dtype, window)
    case = make_ragged_case(*PREFIX, 8, 2, 64, dtype, device, gen)
    run_ragged(case, dtype, "causal", sliding_window=window)
    run_ragged(case, dtype, "not causal", sliding_window=window, causal=False)
    for block_size in (16, 32):  # CUDA: 32 goes by TMA boxes where a unit's first key starts a box
        paged = make_paged_prefill_case(*PREFIX, 8, 2, 64, block_size, dtype, device, gen)
        run_paged(paged, dtype, f"paged, block {block_size}", sliding_window=window)


@pytest.mark.parametrize("window", [1, 7, 64, 10**6])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_sliding_window(dtype, window):
    check_sliding_window("cpu", dtype, window)


@cuda_only
@pytest.mark.parametrize("window", [1, 7, 64, 10**6])
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_sliding_window(dtype, window):
    check_sliding_window("cuda", dtype, window)


def check_soft_cap_and_scale(device, dtype, cap):
    gen = gen_for("cap", device, dtype, cap)
    case = make_ragged_case(*SHORT, 8, 2, 128, dtype, device, gen, q_scale=4.0)
    run_ragged(case, dtype, "cap", logits_soft_cap=cap)
    run_ragged(case, dtype, "cap + scale", logits_soft_cap=cap, scale=0.3)


@pytest.mark.parametrize("cap", [1.0, 30.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_soft_cap_and_scale(dtype, cap):
    check_soft_cap_and_scale("cpu", dtype, cap)


@cuda_only
@pytest.mark.parametrize("cap", [1.0, 30.0])
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_soft_cap_and_scale(dtype, cap):
    check_soft_cap_and_scale("cuda", dtype, cap)


def check_logit_ranges(device, dtype, head_dim):
    """Logits far from N(0, 1), each request's keys in order:
    - rising by about 2.5 (natural log) per 128 keys in request 0 and 10 in request 1: a row's
      max then grows after its first tile by less and by more than the Hopper kernel's frame
      slack (2^8), which decides whether O is rescaled;
    - huge (2^33 and up): each query copies one key whose entries are +-2^15, so that its
      logit is exact in float32 and alone (others typically 40 * 2^27 below). An FFMA of the
      unrounded s * scale - frame is off by up to 512 (log2 units; 1024 at head_dim 128) there
      and would overflow exp2 (the Hopper kernel rounds first past 2^20)."""
    gen = gen_for("logit ranges", device, dtype, head_dim)
    lens_q, lens_k = [300, 200], [700, 600]
    heads = (8, 2)
    case = make_ragged_case(lens_q, lens_k, *heads, head_dim, dtype, "cpu", gen)
    q, k = case.q.float() * 0.5, case.k.float()
    q[..., 0] = 4.0
    per_key = (4.0 * head_dim ** -0.5) * 128  # logit (natural log) per unit of k[..., 0] and 128 keys
    ramps = [torch.arange(n) * (rate / per_key) for n, rate in zip(lens_k, (2.5, 10.0))]
    k[..., 0] += torch.cat(ramps).unsqueeze(1)
    rising = RaggedCase(q.to(dtype).to(device), k.to(dtype).to(device), case.v.to(device),
                        case.cu_seqlens_q.to(device), case.cu_seqlens_k.to(device))
    run_ragged(rising, dtype, "rising, causal")
    run_ragged(rising, dtype, "rising, not causal", causal=False)

    signs = torch.randint(0, 2, k.shape, generator=gen).float() * 2 - 1
    k_huge = signs * 2.0 ** 15
    # Query j of request i copies key 7 * j mod (len_k - 300) + 3 of the same KV head (visible to
    # it when causal).
    starts = case.cu_seqlens_k.tolist()
    copied = torch.cat([torch.arange(n) * 7 % (m - 300) + 3 + s for n, m, s in zip(lens_q, lens_k, starts)])
    q_huge = k_huge[copied].repeat_interleave(heads[0] // heads[1], dim=1)
    huge = RaggedCase(q_huge.to(dtype).to(device), k_huge.to(dtype).to(device), case.v.to(device),
                      case.cu_seqlens_q.to(device), case.cu_seqlens_k.to(device))
    run_ragged(huge, dtype, "huge")  # the reference: each query's output is its one key's V row


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_logit_ranges(dtype, head_dim):
    check_logit_ranges("cpu", dtype, head_dim)


@cuda_only
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_logit_ranges(dtype, head_dim):
    check_logit_ranges("cuda", dtype, head_dim)


def check_strided_inputs(device, dtype):
    gen = gen_for("strided", device, dtype)
    case = make_ragged_case(*PREFIX, 8, 2, 64, dtype, device, gen, token_pad=3)
    assert not case.q.is_contiguous() and not case.k.is_contiguous()
    run_ragged(case, dtype, "strided")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_strided_inputs(dtype):
    check_strided_inputs("cpu", dtype)


@cuda_only
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_strided_inputs(dtype):
    check_strided_inputs("cuda", dtype)


def check_paged_matches_ragged(device, dtype):
    gen = gen_for("paged=ragged", device, dtype)
    case = make_paged_prefill_case(*PREFIX, 16, 2, 128, 16, dtype, device, gen)
    for causal in (True, False):
        paged = paged_prefill_attention(*case.args(), causal=causal, return_lse=True)
        ragged = prefill_attention(*case.ragged().args(), causal=causal, return_lse=True)
        # Same keys in the same order: the same result up to the order of float operations.
        torch.testing.assert_close(paged[0], ragged[0])
        torch.testing.assert_close(paged[1], ragged[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_paged_matches_ragged(dtype):
    check_paged_matches_ragged("cpu", dtype)


@cuda_only
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_paged_matches_ragged(dtype):
    check_paged_matches_ragged("cuda", dtype)


def check_last_row_matches_decode(device, dtype):
    gen = gen_for("decode", device, dtype)
    lens_q, lens_k = [5, 1, 30], [40, 17, 30]
    case = make_paged_prefill_case(lens_q, lens_k, 16, 2, 128, 16, dtype, device, gen)
    out, lse = paged_prefill_attention(*case.args(), return_lse=True)
    last = case.cu_seqlens_q[1:].long() - 1
    want, want_lse = decode_attention(case.q[last], case.k_cache, case.v_cache, case.block_table, case.seq_lens,
                                      return_lse=True)
    atol, rtol = OUT_TOL[dtype]
    torch.testing.assert_close(out[last], want, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse[last], want_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cpu_last_row_matches_decode(dtype):
    check_last_row_matches_decode("cpu", dtype)


@cuda_only
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_last_row_matches_decode(dtype):
    check_last_row_matches_decode("cuda", dtype)


# The CUDA tests above run the automatic choice: on an H100/H200 the Hopper kernel (wgmma, warp
# specialization), the mma.sync kernel elsewhere (and for paged caches of pages TMA cannot copy
# whole, block size 1 here; forcing "sm90" takes them too). This one runs the same
# kinds of case through each kernel by name (MLLM_KERNEL_PREFILL_BACKEND), so both stay tested on
# a Hopper GPU; "sm90" must exist there (the wheel builds sm_90a).
def check_backend(dtype, head_dim, gen):
    heads = (16, 2)
    for lens in (SHORT, PREFIX, FEWER_KEYS, CUDA_LONG_PREFIX):
        case = make_ragged_case(*lens, *heads, head_dim, dtype, "cuda", gen)
        run_ragged(case, dtype, f"causal {lens}")
        run_ragged(case, dtype, f"not causal {lens}", causal=False)
    case = make_ragged_case(*CUDA_LONG, *heads, head_dim, dtype, "cuda", gen, q_scale=4.0)
    run_ragged(case, dtype, "long, cap", logits_soft_cap=30.0)
    run_ragged(case, dtype, "long, window", sliding_window=300)
    # 1, 16: cp.async; 32: whole pages by TMA boxes (two a tile at head_dim 256); 128: TMA boxes of a
    # page slice at head_dim 256, whole pages below
    for block_size in (1, 16, 32, 128):
        paged = make_paged_prefill_case(*CUDA_LONG_PREFIX, *heads, head_dim, block_size, dtype, "cuda", gen)
        run_paged(paged, dtype, f"paged, block {block_size}")
    lens_q, lens_k = [5, 1, 130, 9], [37, 1, 300, 9]
    paged = make_paged_prefill_case(lens_q, lens_k, *heads, head_dim, 16, dtype, "cuda", gen)
    run_paged(paged, dtype, "tree", custom_masks=tree_masks(lens_q, lens_k, gen))


@cuda_only
@pytest.mark.parametrize("backend", ["fa2", "sm90"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_backend(dtype, head_dim, backend, monkeypatch):
    if backend == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper kernel needs an sm_90 GPU")
    monkeypatch.setenv("MLLM_KERNEL_PREFILL_BACKEND", backend)
    check_backend(dtype, head_dim, gen_for("backend", dtype, head_dim, backend))


@cuda_only
def test_cuda_backend_name_is_checked(monkeypatch):
    monkeypatch.setenv("MLLM_KERNEL_PREFILL_BACKEND", "fa3")
    case = make_ragged_case(*SHORT, 8, 2, 64, torch.float16, "cuda", gen_for("backend name"))
    with pytest.raises(ValueError, match="MLLM_KERNEL_PREFILL_BACKEND must be auto, fa2 or sm90, got 'fa3'"):
        prefill_attention(*case.args())


def test_allowed_keys_rules():
    # The reference's masks themselves, written out by hand for one request of 3 queries, 5 keys.
    want = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(allowed_keys(3, 5), want)
    want_window = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(allowed_keys(3, 5, sliding_window=2), want_window)
    assert torch.equal(allowed_keys(3, 5, causal=False), torch.ones(3, 5, dtype=torch.bool))
    tree = tree_mask(2, 3, torch.Generator().manual_seed(0))
    assert tree[:, :2].all() and tree[:, 2:].diagonal().all() and not tree[:, 2:].triu(1).any()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda_only)])
def test_empty_and_zero_lengths(device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    case = make_ragged_case([0, 0], [0, 3], 8, 2, 64, dtype, device)
    out, lse = prefill_attention(*case.args(), return_lse=True)
    assert out.shape == (0, 8, 64) and lse.shape == (0, 8)
    # Queries without keys: 0 and -inf.
    case = make_ragged_case([4], [0], 8, 2, 64, dtype, device)
    out, lse = prefill_attention(*case.args(), causal=False, return_lse=True)
    assert torch.equal(out.cpu(), torch.zeros_like(out.cpu())) and torch.isneginf(lse).all()


# ----------------------------------------------------------------------------- bad inputs


def _ragged_bad_inputs(device):
    dtype = torch.float16 if device == "cuda" else torch.float32
    case = make_ragged_case([3, 5], [4, 5], 8, 2, 64, dtype, device)
    q, k, v, cq, ck = case.args()
    return {
        "q dtype": ((q.int(), k, v, cq, ck), "q"),
        "k dtype": ((q, k.double(), v, cq, ck), "k"),
        "v heads": ((q, k, v[:, :1], cq, ck), "v"),
        "q heads not a multiple": ((q[:, :7], k, v, cq, ck), "num_heads"),
        "head_dim 32": ((q[..., :32].contiguous(), k[..., :32].contiguous(), v[..., :32].contiguous(), cq, ck),
                        "head_dim"),
        "cu_seqlens dtype": ((q, k, v, cq.long(), ck), "cu_seqlens_q"),
        "cu_seqlens length": ((q, k, v, cq, ck[:2]), "cu_seqlens_k"),
        "k not contiguous dims": ((q, k.transpose(1, 2).contiguous().transpose(1, 2), v, cq, ck), "k"),
        "q on another device": ((q.cpu() if device == "cuda" else q, k, v, cq, ck), "device" if device == "cuda"
                                else None),
    }


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda_only)])
def test_bad_inputs_raise(device):
    for name, (args, word) in _ragged_bad_inputs(device).items():
        if word is None:
            continue
        with pytest.raises((ValueError, TypeError, RuntimeError), match=word):
            prefill_attention(*args)


@cuda_only
def test_cuda_misaligned_out_raises():
    # The kernels store 16 bytes at a time: an out= view 2 bytes past an allocation's start is refused
    # by name (it was a misaligned-address fault, which ends the CUDA context), and the call after it works.
    case = make_ragged_case([3, 5], [4, 5], 8, 2, 64, torch.bfloat16, "cuda")
    q = case.args()[0]
    out = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")[1:].view(q.shape)
    with pytest.raises(ValueError, match="out must be 16-byte aligned"):
        prefill_attention(*case.args(), out=out)
    assert torch.isfinite(prefill_attention(*case.args())).all()


@pytest.mark.parametrize("bad", ["start", "decreasing", "past_end", "short"])
def test_cpu_bad_cu_seqlens(bad):
    case = make_ragged_case([3, 5], [4, 5], 8, 2, 64)
    cq = case.cu_seqlens_q.clone()
    {"start": lambda: cq.__setitem__(0, 1), "decreasing": lambda: cq.__setitem__(1, 9),
     "past_end": lambda: cq.__setitem__(2, 99), "short": lambda: cq.__setitem__(2, 7)}[bad]()
    out = torch.full(case.q.shape, NAN)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        prefill_attention(case.q, case.k, case.v, cq, case.cu_seqlens_k, out=out)
    assert torch.isnan(out).all(), "nothing is written before the check"


def test_paged_block_over_2_31_elements_raises():
    # A block of 2^31 elements or more (4 GiB of bfloat16 K) is refused by name before anything is
    # read: the Hopper kernel addresses a row within a block in int elements.
    k_cache = torch.empty((1, 2**21, 8, 128), dtype=torch.bfloat16)  # never touched: virtual memory only
    q = torch.zeros(4, 8, 128, dtype=torch.bfloat16)
    table = torch.zeros(1, 1, dtype=torch.int32)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    lens = torch.tensor([4], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"block_size \* num_kv_heads \* head_dim must be < 2\^31"):
        paged_prefill_attention(q, k_cache, k_cache, table, cu, lens)


def test_cpu_bad_paged_indices():
    case = make_paged_prefill_case([3, 5], [20, 5], 8, 2, 64, 16)
    table = case.block_table.clone()
    table[0, 1] = 999
    with pytest.raises(ValueError, match=r"block_table\[0, 1\]"):
        paged_prefill_attention(case.q, case.k_cache, case.v_cache, table, case.cu_seqlens_q, case.seq_lens)
    lens = case.seq_lens.clone()
    lens[1] = 10**6
    with pytest.raises(ValueError, match=r"seq_lens\[1\]"):
        paged_prefill_attention(case.q, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q, lens)
    mask = torch.ones(3 * 20 + 5 * 5 - 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="custom_mask"):
        paged_prefill_attention(*case.args(), custom_mask=mask)
    with pytest.raises(TypeError, match="custom_mask"):
        paged_prefill_attention(*case.args(), custom_mask=mask.int())


# ----------------------------------------------------------------------------- CUDA only


@cuda_only
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"H{h[0]}_KH{h[1]}")
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_long(dtype, head_dim, heads):
    gen = gen_for("long", dtype, head_dim, heads)
    for lens in (CUDA_LONG, CUDA_LONG_PREFIX):
        case = make_ragged_case(*lens, *heads, head_dim, dtype, "cuda", gen)
        run_ragged(case, dtype, f"causal {lens}")
    case = make_ragged_case(*CUDA_LONG_PREFIX, *heads, head_dim, dtype, "cuda", gen)
    run_ragged(case, dtype, "not causal", causal=False)
    paged = make_paged_prefill_case(*CUDA_LONG_PREFIX, *heads, head_dim, 16, dtype, "cuda", gen)
    run_paged(paged, dtype, "paged")


@cuda_only
@pytest.mark.parametrize("heads", [(8, 2), (8, 8)], ids=lambda h: f"H{h[0]}_KH{h[1]}")
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_long_requests_head_dim_64(dtype, heads, monkeypatch):
    if torch.cuda.get_device_capability() == (9, 0):  # the Hopper kernel, where 192-row items exist
        monkeypatch.setenv("MLLM_KERNEL_PREFILL_BACKEND", "sm90")
    gen = gen_for("wide", dtype, heads)
    for lens in (CUDA_WIDE, CUDA_WIDE_PREFIX):
        case = make_ragged_case(*lens, *heads, 64, dtype, "cuda", gen)
        run_ragged(case, dtype, f"causal {lens}")
        run_ragged(case, dtype, f"not causal {lens}", causal=False)
    run_ragged(case, dtype, "window", sliding_window=700)


@cuda_only
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=dtype_id)
def test_cuda_graph_replay_with_new_lengths(dtype):
    gen = gen_for("graph", dtype)
    lens_q, lens_k = [30, 200, 7], [60, 200, 300]
    case = make_paged_prefill_case(lens_q, lens_k, 16, 2, 128, 16, dtype, "cuda", gen)
    out = torch.empty_like(case.q)
    paged_prefill_attention(*case.args(), out=out)  # allocates the error record before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_prefill_attention(*case.args(), out=out)
    # Same total_q (the graph's shapes), new splits; each request's keys stay within its blocks.
    for new_q, new_k in (([30, 200, 7], [60, 200, 300]), ([100, 100, 37], [64, 180, 37]), ([237, 0, 0], [60, 0, 5])):
        case.cu_seqlens_q.copy_(torch.tensor([0, *torch.tensor(new_q).cumsum(0).tolist()], dtype=torch.int32))
        case.seq_lens.copy_(torch.tensor(new_k, dtype=torch.int32))
        out.fill_(NAN)
        graph.replay()
        torch.cuda.synchronize()
        want, _ = case.ref()
        atol, rtol = OUT_TOL[dtype]
        torch.testing.assert_close(out.double().cpu(), want, atol=atol, rtol=rtol)


@cuda_only
def test_cuda_bad_indices_recorded():
    dtype = torch.bfloat16
    case = make_paged_prefill_case([3, 5], [20, 5], 8, 2, 64, 16, dtype, "cuda")
    assert pop_prefill_attention_error("cuda") is None
    table = case.block_table.clone()
    table[0, 1] = 999
    out = paged_prefill_attention(case.q, case.k_cache, case.v_cache, table, case.cu_seqlens_q, case.seq_lens)
    assert torch.isfinite(out).all()
    assert "block_table[0, 1] = 999" in pop_prefill_attention_error("cuda")
    lens = case.seq_lens.clone()
    lens[1] = 10**6
    with pytest.raises(ValueError, match=r"seq_lens\[1\]"):
        paged_prefill_attention(case.q, case.k_cache, case.v_cache, case.block_table, case.cu_seqlens_q, lens,
                                check=True)
    cq = case.cu_seqlens_q.clone()
    cq[1] = 99
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[1\] = 99"):
        paged_prefill_attention(case.q, case.k_cache, case.v_cache, case.block_table, cq, case.seq_lens, check=True)
    mask = torch.ones(3 * 20 + 5 * 5 - 1, dtype=torch.bool, device="cuda")
    with pytest.raises(ValueError, match="custom_mask holds 84"):
        paged_prefill_attention(*case.args(), custom_mask=mask, check=True)
    ragged = make_ragged_case([3, 5], [4, 5], 8, 2, 64, dtype, "cuda")
    ck = ragged.cu_seqlens_k.clone()
    ck[2] = 4
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[2\] = 4"):
        prefill_attention(ragged.q, ragged.k, ragged.v, ragged.cu_seqlens_q, ck, check=True)
    assert pop_prefill_attention_error("cuda") is None


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
