"""apply_rope against a float64 torch reference (kernels/rope)."""

from __future__ import annotations

import zlib

import pytest
import torch

from mllm_kernel.kernels.rope import apply_rope, pop_rope_error
from mllm_kernel.kernels.rope.cases import ref_rope

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 1e-3), torch.bfloat16: (2e-2, 1e-2)}  # atol, rtol
HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


def seed(*parts) -> None:
    """A per-test seed that does not depend on PYTHONHASHSEED."""
    torch.manual_seed(zlib.crc32(repr(parts).encode()))

# (tokens, heads, kv_heads, head_dim, rot_dim): awkward sizes, GQA, partial rotary.
SHAPES = [
    (1, 1, 1, 2, 2),
    (3, 4, 2, 64, 64),
    (17, 8, 2, 128, 64),  # partial rotary
    (127, 3, 1, 80, 80),  # half = 40: not a multiple of the vector width
    (1000, 5, 5, 36, 18),  # odd half (9) and partial
    (4099, 8, 2, 128, 128),  # large
]


def make_cache(max_pos: int, rot_dim: int, device="cpu") -> torch.Tensor:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float().to(device)


def reference(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor, is_neox: bool) -> torch.Tensor:
    return ref_rope(x.cpu(), positions.cpu().long(), cache.cpu(), cache.shape[1], is_neox)


def fused_qkv(tokens, heads, kv_heads, head_dim, dtype, device, offset=0):
    """q, k as token-strided views of one [tokens, (heads + 2 kv_heads) * head_dim] tensor."""
    width = (heads + 2 * kv_heads) * head_dim
    flat = torch.randn(tokens * width + offset, device=device).to(dtype)
    qkv = flat[offset:].view(tokens, width)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    return qkv, q, k


def check(q, k, q0, k0, positions, cache, is_neox, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(q.double().cpu(), reference(q0, positions, cache, is_neox).cpu(), atol=atol, rtol=rtol)
    torch.testing.assert_close(k.double().cpu(), reference(k0, positions, cache, is_neox).cpu(), atol=atol, rtol=rtol)


def run_case(shape, dtype, is_neox, device, strided=False, offset=0):
    tokens, heads, kv_heads, head_dim, rot_dim = shape
    max_pos = 4 * tokens + 7
    cache = make_cache(max_pos, rot_dim, device)
    positions = torch.randint(0, max_pos, (tokens,), device=device)
    if strided or offset:
        qkv, q, k = fused_qkv(tokens, heads, kv_heads, head_dim, dtype, device, offset)
        v0 = qkv[:, (heads + kv_heads) * head_dim :].clone()
    else:
        q = torch.randn(tokens, heads, head_dim, device=device).to(dtype)
        k = torch.randn(tokens, kv_heads, head_dim, device=device).to(dtype)
    q0, k0 = q.clone(), k.clone()
    apply_rope(q, k, positions, cache, is_neox)
    check(q, k, q0, k0, positions, cache, is_neox, dtype)
    if strided or offset:
        assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], v0), "v part of qkv was modified"
    return q, k


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_reference(shape, dtype, is_neox):
    seed(shape, dtype, is_neox)
    run_case(shape, dtype, is_neox, "cpu")


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_token_strided(dtype, is_neox):
    torch.manual_seed(1)
    run_case((33, 8, 2, 64, 48), dtype, is_neox, "cpu", strided=True)
    run_case((5, 4, 1, 32, 32), dtype, is_neox, "cpu", offset=1)


def test_cpu_empty():
    q, k = torch.randn(0, 2, 8), torch.randn(0, 1, 8)
    apply_rope(q, k, torch.zeros(0, dtype=torch.int64), make_cache(4, 8))


@pytest.mark.parametrize("bad", [-1, 10, 2**40])
def test_cpu_out_of_range_position(bad):
    torch.manual_seed(2)
    q, k = torch.randn(4, 2, 8), torch.randn(4, 1, 8)
    q0, k0 = q.clone(), k.clone()
    positions = torch.tensor([0, 3, bad, 9])
    with pytest.raises(ValueError, match=rf"positions\[2\] = {bad}"):
        apply_rope(q, k, positions, make_cache(10, 8))
    assert torch.equal(q, q0) and torch.equal(k, k0), "a rejected call must not modify q/k"


def test_cpu_bad_inputs():
    cache = make_cache(16, 8)
    q, k, pos = torch.randn(4, 2, 8), torch.randn(4, 1, 8), torch.arange(4)
    with pytest.raises(TypeError):
        apply_rope(q, k.half(), pos, cache)  # q/k dtype mismatch
    with pytest.raises(TypeError):
        apply_rope(q, k, pos.int(), cache)  # positions must be int64
    with pytest.raises(TypeError):
        apply_rope(q, k, pos, cache.half())  # cache must be float32
    with pytest.raises(TypeError):
        apply_rope(q.double(), k.double(), pos, cache)
    with pytest.raises(ValueError):
        apply_rope(q, torch.randn(3, 1, 8), pos, cache)  # token count mismatch
    with pytest.raises(ValueError):
        apply_rope(q, torch.randn(4, 1, 16), pos, cache)  # head_dim mismatch
    with pytest.raises(ValueError):
        apply_rope(q, k, pos, make_cache(16, 16))  # rot_dim > head_dim
    with pytest.raises(ValueError):
        apply_rope(q, k, pos, torch.randn(16, 7))  # odd rot_dim
    with pytest.raises(ValueError):
        apply_rope(torch.randn(4, 8, 2).transpose(1, 2), k, pos, cache)  # head dim not contiguous
    with pytest.raises(ValueError):
        apply_rope(torch.randn(4, 2, 16)[:, :, ::2], k, pos, cache)  # strided head_dim
    with pytest.raises(ValueError):
        apply_rope(q, k, pos, cache.t().contiguous().t())  # non-contiguous cache
    with pytest.raises(ValueError):
        apply_rope(q.view(4, 16), k, pos, cache)  # wrong rank


def test_cpu_torch_compile():
    torch.manual_seed(3)
    cache = make_cache(64, 32)
    q, k, pos = torch.randn(9, 4, 48), torch.randn(9, 2, 48), torch.randint(0, 64, (9,))

    def fn(q, k, pos, cache):
        apply_rope(q, k, pos, cache, False)
        return q * 1, k * 1

    q1, k1 = q.clone(), k.clone()
    apply_rope(q1, k1, pos, cache, False)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    q2, k2 = compiled(q.clone(), k.clone(), pos, cache)
    torch.testing.assert_close(q2, q1, atol=0, rtol=0)
    torch.testing.assert_close(k2, k1, atol=0, rtol=0)


# ----------------------------------------------------------------------------- CUDA


@cuda_only
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_reference(shape, dtype, is_neox):
    seed(shape, dtype, is_neox)
    run_case(shape, dtype, is_neox, "cuda")


@cuda_only
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_strided_and_unaligned(dtype, is_neox):
    torch.manual_seed(4)
    run_case((33, 8, 2, 64, 48), dtype, is_neox, "cuda", strided=True)
    run_case((65, 4, 1, 128, 128), dtype, is_neox, "cuda", offset=1)  # unaligned: scalar path


@cuda_only
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(dtype, is_neox):
    torch.manual_seed(5)
    cache = make_cache(300, 64)
    q, k, pos = torch.randn(77, 6, 96).to(dtype), torch.randn(77, 2, 96).to(dtype), torch.randint(0, 300, (77,))
    qc, kc = q.cuda(), k.cuda()
    apply_rope(q, k, pos, cache, is_neox)
    apply_rope(qc, kc, pos.cuda(), cache.cuda(), is_neox)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(qc.cpu().float(), q.float(), atol=atol, rtol=rtol)
    torch.testing.assert_close(kc.cpu().float(), k.float(), atol=atol, rtol=rtol)


@cuda_only
def test_cuda_out_of_range_position():
    torch.manual_seed(6)
    cache = make_cache(10, 8, "cuda")
    q, k = torch.randn(4, 2, 8, device="cuda"), torch.randn(4, 1, 8, device="cuda")
    pop_rope_error()  # start clean
    positions = torch.tensor([0, 3, 10, 9], device="cuda")
    q0, k0 = q.clone(), k.clone()
    with pytest.raises(ValueError, match=r"positions\[2\] = 10"):
        apply_rope(q, k, positions, cache, check_positions=True)
    assert torch.equal(q[2], q0[2]) and torch.equal(k[2], k0[2]), "bad token must stay untouched"
    good = torch.tensor([0, 1, 3])
    check(q[good], k[good], q0[good], k0[good], positions[good], cache, True, torch.float32)
    # Unchecked (default): no raise, the record waits for pop_rope_error().
    apply_rope(q, k, torch.tensor([-5, 0, 0, 0], device="cuda"), cache)
    assert pop_rope_error() == (0, -5)
    assert pop_rope_error() is None


@cuda_only
def test_cuda_bad_device():
    q, k = torch.randn(4, 2, 8, device="cuda"), torch.randn(4, 1, 8, device="cuda")
    with pytest.raises(ValueError):
        apply_rope(q, k, torch.arange(4), make_cache(10, 8, "cuda"))  # positions on CPU


@cuda_only
def test_cuda_graph():
    torch.manual_seed(7)
    cache = make_cache(128, 64, "cuda")
    q = torch.randn(31, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(31, 2, 128, device="cuda", dtype=torch.bfloat16)
    pos = torch.randint(0, 128, (31,), device="cuda")
    apply_rope(q.clone(), k.clone(), pos, cache)  # warm-up: builds the module, allocates the flag
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        apply_rope(q, k, pos, cache, check_positions=True)  # the check is skipped while capturing
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        pos.copy_(torch.randint(0, 128, (31,), device="cuda"))
        q0, k0 = q.clone(), k.clone()
        graph.replay()
        torch.cuda.synchronize()
        check(q, k, q0, k0, pos, cache, True, torch.bfloat16)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
