"""store_kv_cache against a torch index_copy reference (kernels/kv_cache)."""

from __future__ import annotations

import zlib

import pytest
import torch

from mllm_kernel.kernels.kv_cache import pop_kv_cache_error, store_kv_cache

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")

# (tokens, kv_heads, head_dim, num_blocks, block_size)
SHAPES = [
    (1, 1, 1, 1, 1),
    (3, 2, 64, 4, 16),
    (17, 1, 3, 5, 7),  # 3-element rows: only 2/4-byte copy units
    (127, 8, 128, 16, 16),
    (1000, 3, 17, 300, 8),
    (4099, 8, 128, 260, 16),  # large
]


def seed(*parts) -> None:
    """A per-test seed that does not depend on PYTHONHASHSEED."""
    torch.manual_seed(zlib.crc32(repr(parts).encode()))


def make_slots(tokens: int, num_slots: int, device, skip_every: int = 5) -> torch.Tensor:
    """Distinct slots (a permutation prefix), every skip_every-th token padded with -1."""
    assert tokens <= num_slots
    slots = torch.randperm(num_slots)[:tokens]
    slots[::skip_every] = -1
    return slots.to(device)


def reference(k, v, k_cache, v_cache, slots):
    kc, vc = k_cache.clone(), v_cache.clone()
    keep = slots >= 0
    kc.view(-1, *k.shape[1:])[slots[keep]] = k[keep]
    vc.view(-1, *v.shape[1:])[slots[keep]] = v[keep]
    return kc, vc


def run_case(shape, dtype, device, strided=False, offset=0):
    tokens, kv_heads, head_dim, num_blocks, block_size = shape
    if strided or offset:
        # k, v as token-strided views of a fused [tokens, (1 + 2) * row] qkv-like tensor.
        row = kv_heads * head_dim
        flat = torch.randn(tokens * 3 * row + offset, device=device).to(dtype)
        qkv = flat[offset:].view(tokens, 3 * row)
        k = qkv[:, row : 2 * row].view(tokens, kv_heads, head_dim)
        v = qkv[:, 2 * row :].view(tokens, kv_heads, head_dim)
    else:
        k = torch.randn(tokens, kv_heads, head_dim, device=device).to(dtype)
        v = torch.randn(tokens, kv_heads, head_dim, device=device).to(dtype)
    cache_shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.full(cache_shape, float("nan"), device=device, dtype=dtype)  # poisoned
    v_cache = torch.full(cache_shape, float("nan"), device=device, dtype=dtype)
    slots = make_slots(tokens, num_blocks * block_size, device)
    ref_k, ref_v = reference(k, v, k_cache, v_cache, slots)
    store_kv_cache(k, v, k_cache, v_cache, slots)
    # A copy: bit-exact, and untouched slots keep their NaN poison (equal_nan).
    torch.testing.assert_close(k_cache, ref_k, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, ref_v, atol=0, rtol=0, equal_nan=True)
    return k, v, k_cache, v_cache, slots


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_reference(shape, dtype):
    seed(shape, dtype)
    run_case(shape, dtype, "cpu")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_token_strided(dtype):
    seed(dtype)
    run_case((33, 2, 64, 8, 16), dtype, "cpu", strided=True)
    run_case((9, 1, 5, 3, 4), dtype, "cpu", offset=1)


def test_cpu_all_skipped_and_empty():
    k = torch.randn(3, 2, 4)
    k_cache = torch.zeros(2, 2, 2, 4)
    v_cache = torch.zeros(2, 2, 2, 4)
    store_kv_cache(k, k, k_cache, v_cache, torch.full((3,), -1))
    assert not k_cache.any() and not v_cache.any()
    store_kv_cache(k[:0], k[:0], k_cache, v_cache, torch.zeros(0, dtype=torch.int64))


@pytest.mark.parametrize("bad", [-2, 8, 2**40])
def test_cpu_out_of_range_slot(bad):
    k, v = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    k_cache, v_cache = torch.zeros(2, 4, 2, 4), torch.zeros(2, 4, 2, 4)
    with pytest.raises(ValueError, match=rf"slot_mapping\[1\] = {bad}"):
        store_kv_cache(k, v, k_cache, v_cache, torch.tensor([0, bad, 3]))
    assert not k_cache.any() and not v_cache.any(), "a rejected call must not write the caches"


def test_cpu_bad_inputs():
    k, v = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    kc, vc = torch.zeros(2, 4, 2, 4), torch.zeros(2, 4, 2, 4)
    slots = torch.tensor([0, 1, 2])
    with pytest.raises(TypeError):
        store_kv_cache(k, v.half(), kc, vc, slots)
    with pytest.raises(TypeError):
        store_kv_cache(k, v, kc.half(), vc.half(), slots)  # cache dtype must equal k's
    with pytest.raises(TypeError):
        store_kv_cache(k, v, kc, vc, slots.int())  # slots must be int64
    with pytest.raises(ValueError):
        store_kv_cache(k, v, kc, torch.zeros(2, 4, 2, 5), slots)  # cache shape mismatch
    with pytest.raises(ValueError):
        store_kv_cache(k, v, torch.zeros(2, 4, 3, 4), vc, slots)  # kv_heads mismatch
    with pytest.raises(ValueError):
        store_kv_cache(k, v, kc, vc, torch.tensor([0, 1]))  # token count mismatch
    with pytest.raises(ValueError):
        store_kv_cache(torch.randn(3, 4, 2).transpose(1, 2), v, kc, vc, slots)  # heads not contiguous
    with pytest.raises(ValueError):
        store_kv_cache(k, v, kc.transpose(0, 1), vc, slots)  # non-contiguous cache
    with pytest.raises(ValueError):
        store_kv_cache(k.view(3, 8), v, kc, vc, slots)  # wrong rank


def test_cpu_torch_compile():
    seed("compile")
    k, v = torch.randn(7, 2, 16), torch.randn(7, 2, 16)
    slots = make_slots(7, 32, "cpu", skip_every=3)

    def fn(k, v, k_cache, v_cache, slots):
        store_kv_cache(k, v, k_cache, v_cache, slots)
        return k_cache + 0, v_cache + 0

    kc1, vc1 = torch.zeros(4, 8, 2, 16), torch.zeros(4, 8, 2, 16)
    store_kv_cache(k, v, kc1, vc1, slots)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    kc2, vc2 = compiled(k, v, torch.zeros(4, 8, 2, 16), torch.zeros(4, 8, 2, 16), slots)
    assert torch.equal(kc2, kc1) and torch.equal(vc2, vc1)


# ----------------------------------------------------------------------------- CUDA


@cuda_only
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_reference(shape, dtype):
    seed(shape, dtype)
    run_case(shape, dtype, "cuda")


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_strided_and_unaligned(dtype):
    seed(dtype)
    run_case((33, 2, 64, 8, 16), dtype, "cuda", strided=True)
    run_case((65, 4, 128, 8, 16), dtype, "cuda", offset=1)  # unaligned: narrower copy units
    run_case((9, 1, 5, 3, 4), dtype, "cuda", offset=1)


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(dtype):
    seed("agree", dtype)
    k, v = torch.randn(50, 4, 64).to(dtype), torch.randn(50, 4, 64).to(dtype)
    slots = make_slots(50, 64, "cpu")
    kc, vc = torch.zeros(4, 16, 4, 64, dtype=dtype), torch.zeros(4, 16, 4, 64, dtype=dtype)
    kcg, vcg = kc.cuda(), vc.cuda()
    store_kv_cache(k, v, kc, vc, slots)
    store_kv_cache(k.cuda(), v.cuda(), kcg, vcg, slots.cuda())
    assert torch.equal(kcg.cpu(), kc) and torch.equal(vcg.cpu(), vc)


@cuda_only
def test_cuda_out_of_range_slot():
    k, v = torch.randn(3, 2, 4, device="cuda"), torch.randn(3, 2, 4, device="cuda")
    kc, vc = torch.zeros(2, 4, 2, 4, device="cuda"), torch.zeros(2, 4, 2, 4, device="cuda")
    pop_kv_cache_error()  # start clean
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 8"):
        store_kv_cache(k, v, kc, vc, torch.tensor([0, 8, 3], device="cuda"), check_slots=True)
    assert torch.equal(kc.view(-1, 2, 4)[[0, 3]], k[[0, 2]]), "good tokens are still stored"
    assert torch.count_nonzero(kc.view(-1, 8).abs().sum(1)) == 2
    # Unchecked (default): no raise; the record waits for pop_kv_cache_error().
    store_kv_cache(k, v, kc, vc, torch.tensor([-1, -7, 1], device="cuda"))
    assert pop_kv_cache_error() == (1, -7)
    assert pop_kv_cache_error() is None


@cuda_only
def test_cuda_bad_device():
    k = torch.randn(3, 2, 4, device="cuda")
    kc = torch.zeros(2, 4, 2, 4, device="cuda")
    with pytest.raises(ValueError):
        store_kv_cache(k, k, kc, kc.clone(), torch.tensor([0, 1, 2]))  # slots on CPU
    with pytest.raises(ValueError):
        store_kv_cache(k, k, kc, torch.zeros(2, 4, 2, 4), torch.tensor([0, 1, 2], device="cuda"))


@cuda_only
def test_cuda_graph():
    seed("graph")
    k = torch.randn(31, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(31, 8, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.zeros(8, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    slots = make_slots(31, 128, "cuda")
    store_kv_cache(k, v, kc.clone(), vc.clone(), slots)  # warm-up: module + flag buffer
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        store_kv_cache(k, v, kc, vc, slots)
    for _ in range(2):
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
        slots.copy_(make_slots(31, 128, "cuda"))
        kc.zero_()
        vc.zero_()
        ref_k, ref_v = reference(k, v, kc, vc, slots)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(kc, ref_k) and torch.equal(vc, ref_v)



# ----------------------------------------------------------------------------- float8 caches

F8 = torch.float8_e4m3fn
SPECIALS = [float("inf"), float("-inf"), float("nan"), 1e6, -1e6, 448.0, 460.0, 470.0, -463.9, 2.0 ** -10,
            3 * 2.0 ** -10, 2.0 ** -6 - 2.0 ** -11, 1.0 + 1 / 16, 1.0 + 3 / 16, -0.0, 0.0, 2.0 ** -20]


def quantize_reference(x: torch.Tensor, scale_per_head: torch.Tensor) -> torch.Tensor:
    """x [T, KH, D] / scale of each kv head, saturated to +-448 (inf too) and rounded by torch:
    the bytes a float8 cache must hold."""
    y = x.float().cpu() / scale_per_head.float().view(1, -1, 1)
    return y.clamp(-448, 448).to(F8).view(torch.uint8)


def same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal e4m3 bytes, any NaN (0x7F / 0xFF) matching any NaN."""
    nan_got, nan_want = (got & 0x7F) == 0x7F, (want & 0x7F) == 0x7F
    return bool(torch.equal(nan_got, nan_want) and torch.equal(got[~nan_got], want[~nan_want]))


def run_fp8_case(device, dtype, kv_heads, head_dim, mode, strided=False):
    seed("fp8", device, dtype, kv_heads, head_dim, mode, strided)
    tokens, num_blocks, block_size = 45, 9, 7
    row = kv_heads * head_dim
    if strided:  # token-strided views of a fused qkv-like tensor
        qkv = torch.randn(tokens, 3 * row, device=device).to(dtype)
        k, v = qkv[:, row:2 * row].view(tokens, kv_heads, head_dim), qkv[:, 2 * row:].view(tokens, kv_heads, head_dim)
    else:
        k = (torch.randn(tokens, kv_heads, head_dim, device=device) * 30).to(dtype)
        v = torch.randn(tokens, kv_heads, head_dim, device=device).to(dtype)
    specials = torch.tensor(SPECIALS)[: head_dim].to(dtype)
    k[1, 0, : specials.numel()] = specials.to(device)
    if mode == "none":
        k_scale = v_scale = None
        ks = vs = torch.ones(kv_heads)
    elif mode == "float":
        k_scale, v_scale = 0.37, 2.5
        ks, vs = torch.full((kv_heads,), 0.37), torch.full((kv_heads,), 2.5)
    elif mode == "tensor1":
        k_scale, v_scale = torch.tensor(0.5, device=device), torch.tensor([3.0], device=device)
        ks, vs = torch.full((kv_heads,), 0.5), torch.full((kv_heads,), 3.0)
    else:
        k_scale = torch.rand(kv_heads, device=device) + 0.1
        v_scale = torch.rand(kv_heads * 2, device=device)[::2] + 0.1  # a strided per-head tensor
        ks, vs = k_scale.cpu(), v_scale.cpu()
    poison = 0x5A
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), poison, dtype=torch.uint8, device=device).view(F8)
    v_cache = k_cache.clone()
    slots = make_slots(tokens, num_blocks * block_size, device)
    store_kv_cache(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
    want_k, want_v = quantize_reference(k, ks), quantize_reference(v, vs)
    got_k = k_cache.view(torch.uint8).view(-1, kv_heads, head_dim).cpu()
    got_v = v_cache.view(torch.uint8).view(-1, kv_heads, head_dim).cpu()
    s = slots.cpu()
    keep = s >= 0
    assert same_bytes(got_k[s[keep]], want_k[keep]) and same_bytes(got_v[s[keep]], want_v[keep])
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool)
    untouched[s[keep]] = False
    assert (got_k[untouched] == poison).all() and (got_v[untouched] == poison).all()


@pytest.mark.parametrize("mode", ["none", "float", "tensor1", "per_head"])
@pytest.mark.parametrize("kv_heads, head_dim", [(1, 1), (2, 64), (3, 17), (8, 128)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_fp8(dtype, kv_heads, head_dim, mode):
    run_fp8_case("cpu", dtype, kv_heads, head_dim, mode)
    run_fp8_case("cpu", dtype, kv_heads, head_dim, mode, strided=True)


def test_cpu_fp8_every_value():
    # Every float32 that rounds to each e4m3 value, its neighbours and midpoints: the CPU's own
    # conversion against torch's (RNE) after saturation.
    base = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(F8).float()
    base = base[~torch.isnan(base)]
    ulp = torch.nextafter(base, torch.full_like(base, float("inf"))) - base
    x = torch.cat([base, base + ulp, base - ulp, (base[1:] + base[:-1]) / 2, torch.randn(4096) * 100])
    x = x[: x.numel() // 16 * 16].view(-1, 1, 16)
    cache = torch.zeros(x.shape[0], 1, 1, 16, dtype=F8)
    slots = torch.arange(x.shape[0])
    store_kv_cache(x, x, cache, cache.clone(), slots)
    assert same_bytes(cache.view(torch.uint8).view(-1, 1, 16), quantize_reference(x, torch.ones(1)))


def test_cpu_fp8_bad_slot_writes_nothing():
    k = torch.randn(4, 2, 8)
    cache = torch.zeros(2, 2, 2, 8, dtype=F8)
    with pytest.raises(ValueError, match="slot_mapping"):
        store_kv_cache(k, k, cache, cache.clone(), torch.tensor([0, 1, 99, 2]), k_scale=0.5)
    assert not cache.view(torch.uint8).any()


def test_fp8_scale_arguments():
    k = torch.randn(3, 2, 8)
    kc, k8 = torch.zeros(2, 2, 2, 8), torch.zeros(2, 2, 2, 8, dtype=F8)
    slots = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match="k_scale applies to float8_e4m3fn caches only"):
        store_kv_cache(k, k, kc, kc.clone(), slots, k_scale=2.0)
    with pytest.raises((ValueError, TypeError), match="v_cache"):
        store_kv_cache(k, k, k8, kc, slots)
    for bad in (float("nan"), float("inf"), 0.0, -2.0, 1e-46, torch.ones(3), torch.ones(2, dtype=torch.float16)):
        with pytest.raises((ValueError, TypeError), match="v_scale"):
            store_kv_cache(k, k, k8, k8.clone(), slots, v_scale=bad)
    with pytest.raises(TypeError, match="k_scale"):
        store_kv_cache(k, k, k8, k8.clone(), slots, k_scale=[1.0])
    assert not k8.view(torch.uint8).any()


@cuda_only
@pytest.mark.parametrize("mode", ["none", "float", "tensor1", "per_head"])
@pytest.mark.parametrize("kv_heads, head_dim", [(1, 1), (2, 64), (3, 17), (8, 128)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_fp8(dtype, kv_heads, head_dim, mode):
    run_fp8_case("cuda", dtype, kv_heads, head_dim, mode)
    run_fp8_case("cuda", dtype, kv_heads, head_dim, mode, strided=True)


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_fp8_matches_cpu(dtype):
    seed("fp8 cpu/cuda", dtype)
    k = (torch.randn(300, 4, 64) * 50).to(dtype)
    caches = []
    for device in ("cpu", "cuda"):
        kc = torch.zeros(40, 8, 4, 64, dtype=F8, device=device)
        store_kv_cache(k.to(device), k.to(device), kc, kc.clone(), torch.arange(300, device=device),
                       k_scale=torch.tensor([0.1, 0.2, 0.3, 0.4], device=device))
        caches.append(kc.view(torch.uint8).cpu())
    assert same_bytes(caches[1], caches[0])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
