"""silu_and_mul and gelu_and_mul (CPU always, CUDA when available) against a float64 reference."""

import sys
from pathlib import Path

import pytest

try:
    import mllm_kernel  # noqa: F401
except ImportError:  # run as a plain script from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import mllm_kernel.kernels.activation as activation_module
from mllm_kernel.kernels.activation import gelu_and_mul, silu_and_mul
from mllm_kernel.kernels.activation.cases import ref_gelu_and_mul, ref_silu_and_mul

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}  # rtol = atol
WIDTHS = (1, 3, 17, 127, 1000, 4099)  # d; x has 2 * d columns
# (public callable, float64 reference of the op (shared: activation/cases.py), export name)
ACTS = {
    "silu": (silu_and_mul, ref_silu_and_mul, "silu_and_mul"),
    "gelu": (lambda x: gelu_and_mul(x, "none"), ref_gelu_and_mul, "gelu_and_mul"),
    "gelu_tanh": (lambda x: gelu_and_mul(x, approximate="tanh"), lambda x: ref_gelu_and_mul(x, "tanh"),
                  "gelu_tanh_and_mul"),
}
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def make(shape, dtype, device="cpu", seed=0, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(dtype).to(device)


def reference(act, x):
    return ACTS[act][1](x)


def check(actual, expected, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected.double().to(actual.device), rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", WIDTHS)
def test_matches_reference(d, dtype, act):
    x = make((5, 2 * d), dtype, seed=d)
    out = ACTS[act][0](x)
    assert out.shape == (5, d) and out.dtype == dtype and out.is_contiguous()
    check(out, reference(act, x), dtype)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_large(dtype, act):
    x = make((64, 2 * 4096), dtype, seed=1)
    check(ACTS[act][0](x), reference(act, x), dtype)


@pytest.mark.parametrize("device", ("cpu", pytest.param("cuda", marks=requires_cuda)))
@pytest.mark.parametrize("act", ACTS)
def test_extreme_inputs(act, device):
    # Tails (exp overflow in silu, erf cancellation in gelu) and zero.
    gate = torch.tensor([-1e4, -200.0, -90.0, -87.5, -30.0, -12.0, -5.0, -1e-3, 0.0, 1e-3, 5.0, 30.0, 200.0])
    x = torch.cat([gate, torch.ones_like(gate)]).unsqueeze(0)
    out = ACTS[act][0](x.to(device)).cpu()
    assert torch.isfinite(out).all()
    check(out, reference(act, x), torch.float32)
    # Relative accuracy in the negative tail, where the result is tiny.
    if act != "gelu_tanh":
        tail = torch.tensor([-12.0, -8.0, -5.0, -3.0])
        xt = torch.cat([tail, torch.ones_like(tail)]).unsqueeze(0)
        out = ACTS[act][0](xt.to(device)).cpu()
        torch.testing.assert_close(out.double(), reference(act, xt), rtol=1e-5, atol=0)


def test_module_writes_every_element_of_a_poisoned_output():
    x = make((7, 2 * 1000), torch.bfloat16, seed=2)
    for act, (_, _, export) in ACTS.items():
        out = torch.full((7, 1000), float("nan"), dtype=torch.bfloat16)
        getattr(activation_module._modules["cpu"], export)(out, x)
        check(out, reference(act, x), torch.bfloat16)


def test_leading_dims_and_row_strides():
    dtype = torch.float16
    x = make((2, 3, 300), dtype, seed=3)[..., 10:264]  # row stride 300, offset 10, d = 127
    for act in ACTS:
        out = ACTS[act][0](x)
        assert out.shape == (2, 3, 127)
        check(out, reference(act, x), dtype)
    x1 = make(2 * 17, dtype, seed=4)  # 1-D input: one row
    check(silu_and_mul(x1), reference("silu", x1), dtype)


def test_empty():
    assert silu_and_mul(torch.empty(0, 8)).shape == (0, 4)
    assert gelu_and_mul(torch.empty(3, 0)).shape == (3, 0)


def test_bad_inputs_raise():
    x = make((4, 8), torch.float32)
    with pytest.raises(ValueError, match="approximate"):
        gelu_and_mul(x, approximate="sigmoid")
    with pytest.raises(ValueError, match="approximate"):
        gelu_and_mul(x, "Tanh")
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(make((4, 7), torch.float32))
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.tensor(1.0))
    with pytest.raises(TypeError, match="dtype"):
        silu_and_mul(x.double())
    with pytest.raises(TypeError, match="dtype"):
        gelu_and_mul(x.to(torch.int32))
    with pytest.raises(ValueError, match="stride"):
        silu_and_mul(make((8, 4), torch.float32).t())  # last dim not contiguous
    with pytest.raises(ValueError, match="without a copy"):
        silu_and_mul(make((3, 4, 8), torch.float32).transpose(0, 1))
    with pytest.raises(ValueError, match="meta"):
        silu_and_mul(torch.empty(4, 8, device="meta"))
    # Module level: out of the wrong shape or dtype.
    mod = activation_module._modules["cpu"]
    with pytest.raises(ValueError, match="x"):
        mod.silu_and_mul(torch.empty(4, 3), x)
    with pytest.raises(TypeError, match="x"):
        mod.silu_and_mul(torch.empty(4, 4, dtype=torch.float16), x)


def test_torch_compile_fullgraph():
    x = make((6, 2 * 100), torch.bfloat16, seed=5)

    def fn(x):
        return silu_and_mul(x) + gelu_and_mul(x) * gelu_and_mul(x, approximate="tanh")

    expected = fn(x)
    actual = torch.compile(fn, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


# ----------------------------------------------------------------------------- CUDA


@requires_cuda
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", WIDTHS + (8, 64, 4096, 14336))
def test_cuda_matches_reference_and_cpu(d, dtype, act):
    x = make((7, 2 * d), dtype, seed=d)
    out = ACTS[act][0](x.cuda())
    check(out, reference(act, x), dtype)
    check(out.cpu(), ACTS[act][0](x), dtype)


@requires_cuda
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_unaligned_strided_and_many_rows(dtype, act):
    d, rows = 512, 9
    # One element past a 16-byte boundary: the scalar path.
    x = make(rows * 2 * d + 1, dtype, seed=6).cuda()[1:].view(rows, 2 * d)
    check(ACTS[act][0](x), reference(act, x.cpu()), dtype)
    # Aligned row stride with padding: the vector path with a row stride.
    xs = make((rows, 2 * d + 64), dtype, seed=7).cuda()[:, : 2 * d]
    check(ACTS[act][0](xs), reference(act, xs.cpu()), dtype)
    # More rows than gridDim.y allows (65535): the row grid-stride loop.
    xl = make((70000, 16), dtype, seed=8).cuda()
    check(ACTS[act][0](xl), reference(act, xl.cpu()), dtype)


@requires_cuda
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ((300, 2 * 1000), (129, 2 * 4096)))
def test_cuda_large_inputs(shape, dtype, act):
    # Over 2^16 vectors: float32 takes 4 vectors per thread, with a partial last group.
    x = make(shape, dtype, seed=shape[0])
    out = torch.full((shape[0], shape[1] // 2), float("nan"), dtype=dtype, device="cuda")
    getattr(activation_module._modules["cuda"], ACTS[act][2])(out, x.cuda())
    check(out, reference(act, x), dtype)


@requires_cuda
def test_cuda_gelu_16bit_tails():
    # 16-bit GELU takes a polynomial unless an element of its 8-element vector is below -6;
    # consecutive gates here put vectors on both sides of that edge and across it.
    gate = torch.linspace(-14.0, 8.0, 8 * 64 + 3)
    x = torch.cat([gate, torch.ones_like(gate)]).unsqueeze(0)
    for dtype in (torch.float16, torch.bfloat16):
        xd = x.to(dtype)
        check(gelu_and_mul(xd.cuda()), reference("gelu", xd), dtype)
    # bfloat16 keeps float32's range: the deep tail is still checked relative to its size.
    xb = x.to(torch.bfloat16)
    out = gelu_and_mul(xb.cuda()).cpu().double()
    torch.testing.assert_close(out, reference("gelu", xb).to(torch.bfloat16).double(), rtol=8e-3, atol=0)


@requires_cuda
def test_cuda_poisoned_output():
    x = make((33, 2 * 1000), torch.bfloat16, seed=9).cuda()
    for act, (_, _, export) in ACTS.items():
        out = torch.full((33, 1000), float("nan"), dtype=torch.bfloat16, device="cuda")
        getattr(activation_module._modules["cuda"], export)(out, x)
        check(out, reference(act, x.cpu()), torch.bfloat16)


@requires_cuda
def test_cuda_graph_capture_replay():
    x = make((64, 2 * 2048), torch.bfloat16, seed=10).cuda()
    silu_and_mul(x), gelu_and_mul(x)  # warm up (module load) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_silu = silu_and_mul(x)
        out_gelu = gelu_and_mul(x, approximate="tanh")
    for seed in (11, 12):
        x.copy_(make((64, 2 * 2048), torch.bfloat16, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        check(out_silu, reference("silu", x.cpu()), torch.bfloat16)
        check(out_gelu, reference("gelu_tanh", x.cpu()), torch.bfloat16)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
