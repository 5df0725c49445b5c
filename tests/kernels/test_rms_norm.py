"""rms_norm and fused_add_rms_norm (CPU always, CUDA when available) against a float64 reference."""

import sys
from pathlib import Path

import pytest

try:
    import mllm_kernel  # noqa: F401
except ImportError:  # run as a plain script from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import mllm_kernel.kernels.rms_norm as rms_norm_module
from mllm_kernel.kernels.rms_norm import fused_add_rms_norm, rms_norm

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}  # rtol = atol
HIDDEN = (1, 3, 17, 127, 1000, 4099)
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def make(shape, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype).to(device)


from mllm_kernel.kernels.rms_norm.cases import ref_fused, ref_rms_norm  # noqa: E402 (shared references)


def check(actual, expected, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected.double().to(actual.device), rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", (1, 5))
def test_rms_norm_matches_reference(rows, hidden, dtype):
    x, w = make((rows, hidden), dtype, seed=hidden), make(hidden, dtype, seed=hidden + 1)
    out = rms_norm(x, w, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    check(out, ref_rms_norm(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_large(dtype):
    x, w = make((33, 16384), dtype, seed=1), make(16384, dtype, seed=2)
    check(rms_norm(x, w), ref_rms_norm(x, w, 1e-6), dtype)


def test_rms_norm_eps_and_scale():
    # Small values: eps is not negligible, so a wrong eps shows.
    x, w = make((4, 64), torch.float32, seed=3) * 1e-3, make(64, torch.float32, seed=4)
    for eps in (1e-6, 1e-2):
        check(rms_norm(x, w, eps), ref_rms_norm(x, w, eps), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_fused_add_rms_norm_matches_reference(hidden, dtype):
    x, r, w = (make((5, hidden), dtype, seed=hidden + k) for k in range(3))
    w = w[0]
    ref_x, ref_r = ref_fused(x, r, w, 1e-6)
    fused_add_rms_norm(x, r, w, 1e-6)
    torch.testing.assert_close(r, ref_r, rtol=0, atol=0)  # same f32 add and rounding
    check(x, ref_x, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_large(dtype):
    x, r = make((17, 16384), dtype, seed=5), make((17, 16384), dtype, seed=6)
    w = make(16384, dtype, seed=7)
    ref_x, ref_r = ref_fused(x, r, w, 1e-6)
    fused_add_rms_norm(x, r, w)
    torch.testing.assert_close(r, ref_r, rtol=0, atol=0)
    check(x, ref_x, dtype)


def test_module_writes_every_element_of_a_poisoned_output():
    x, w = make((7, 1000), torch.bfloat16, seed=8), make(1000, torch.bfloat16, seed=9)
    out = torch.full((7, 1000), float("nan"), dtype=torch.bfloat16)
    rms_norm_module._modules["cpu"].rms_norm(out, x, w, 1e-6)
    check(out, ref_rms_norm(x, w, 1e-6), torch.bfloat16)


def test_leading_dims_and_row_strides():
    dtype = torch.float16
    base = make((2, 3, 200), dtype, seed=10)
    x = base[..., :127]  # row stride 200, last dim contiguous: passed as a view, no copy
    w = make(127, dtype, seed=11)
    out = rms_norm(x, w)
    assert out.shape == (2, 3, 127)
    check(out, ref_rms_norm(x, w, 1e-6), dtype)
    # 1-D input: a single row.
    check(rms_norm(x[0, 0], w), ref_rms_norm(x[0, 0], w, 1e-6), dtype)

    xs = make((4, 300), dtype, seed=12)[:, 5:132]  # also at an element offset
    rs_base = make((4, 256), dtype, seed=13)
    rs = rs_base[:, :127]
    ref_x, ref_r = ref_fused(xs, rs, w, 1e-6)
    untouched = rs_base[:, 127:].clone()
    fused_add_rms_norm(xs, rs, w)
    torch.testing.assert_close(rs, ref_r, rtol=0, atol=0)
    check(xs, ref_x, dtype)
    torch.testing.assert_close(rs_base[:, 127:], untouched, rtol=0, atol=0)  # padding untouched


def test_empty_rows():
    w = make(16, torch.float32)
    assert rms_norm(torch.empty(0, 16), w).shape == (0, 16)
    fused_add_rms_norm(torch.empty(0, 16), torch.empty(0, 16), w)


def test_bad_inputs_raise():
    x, w = make((4, 8), torch.float32), make(8, torch.float32)
    with pytest.raises(TypeError, match="weight"):
        rms_norm(x, w.half())
    with pytest.raises(TypeError, match="x"):
        rms_norm(x.double(), w.double())
    with pytest.raises(TypeError):
        rms_norm(x.to(torch.int32), w.to(torch.int32))
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, make(9, torch.float32))
    with pytest.raises(ValueError, match="stride"):
        rms_norm(make((8, 4), torch.float32).t(), w)  # last dim not contiguous
    with pytest.raises(ValueError, match="without a copy"):
        rms_norm(make((3, 4, 8), torch.float32).transpose(0, 1), w)
    with pytest.raises(ValueError, match="meta"):
        rms_norm(torch.empty(4, 8, device="meta"), torch.empty(8, device="meta"))
    with pytest.raises(ValueError, match="scalar"):
        rms_norm(torch.tensor(1.0), w)

    r = make((4, 8), torch.float32)
    with pytest.raises(ValueError, match="residual"):
        fused_add_rms_norm(x, make((4, 9), torch.float32), w)
    with pytest.raises(TypeError, match="residual"):
        fused_add_rms_norm(x, r.half(), w)
    with pytest.raises(TypeError, match="weight"):
        fused_add_rms_norm(x, r, w.half())
    with pytest.raises(ValueError, match="stride"):
        fused_add_rms_norm(x, make((8, 4), torch.float32).t(), w)
    with pytest.raises(ValueError, match="overlap"):
        fused_add_rms_norm(x, make((1, 8), torch.float32).expand(4, 8), w)


def test_torch_compile_fullgraph():
    x, w = make((6, 100), torch.bfloat16, seed=14), make(100, torch.bfloat16, seed=15)
    r = make((6, 100), torch.bfloat16, seed=16)

    def fn(x, r, w):
        y = rms_norm(x, w, 1e-5) * 2
        x2, r2 = x.clone(), r.clone()
        fused_add_rms_norm(x2, r2, w, 1e-5)
        return y, x2, r2

    expected = fn(x, r, w)
    actual = torch.compile(fn, fullgraph=True, backend="aot_eager")(x, r, w)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


# -------------------------------------------------------- eager fast path (op_modules.CustomOp)
# Plain eager calls skip torch.library's dispatcher; these check what that must not lose.


def test_eager_call_bumps_versions_of_mutated_args():
    x, r, w = make((3, 64), torch.float32), make((3, 64), torch.float32, seed=1), make(64, torch.float32)
    versions = x._version, r._version
    fused_add_rms_norm(x, r, w)
    assert x._version > versions[0] and r._version > versions[1]


def test_autograd_sees_an_in_place_update_of_a_saved_tensor():
    a = torch.randn(4, 8, requires_grad=True)
    saved = a.exp()  # exp saves its output for backward
    fused_add_rms_norm(saved.detach(), torch.randn(4, 8), torch.ones(8))  # detach shares the version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()


def test_fake_tensors_and_dispatch_modes_take_the_registered_op():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    with FakeTensorMode():
        out = rms_norm(torch.empty(3, 5, 16), torch.empty(16))
        assert out.shape == (3, 5, 16)

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x, w = make((2, 32), torch.float32), make(32, torch.float32)
    with Record() as record:
        out = rms_norm(x, w)
    assert any("mllm_kernel.rms_norm" in op for op in record.ops), record.ops
    check(out, ref_rms_norm(x, w, 1e-6), torch.float32)


# ----------------------------------------------------------------------------- CUDA

# Every launch shape: 1, 2, 4 and 8 vectors per thread, several rows per block, scalar.
CUDA_HIDDEN = (1, 3, 8, 64, 127, 1000, 2048, 2056, 4096, 4099, 8192, 16384, 20480, 32768, 65536 + 8)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", CUDA_HIDDEN)
def test_cuda_matches_reference_and_cpu(hidden, dtype):
    rows = 7
    x, w = make((rows, hidden), dtype, seed=hidden), make(hidden, dtype, seed=hidden + 1)
    r = make((rows, hidden), dtype, seed=hidden + 2)
    out = rms_norm(x.cuda(), w.cuda())
    check(out, ref_rms_norm(x, w, 1e-6), dtype)
    check(out.cpu(), rms_norm(x, w), dtype)

    xc, rc = x.cuda(), r.cuda()
    ref_x, ref_r = ref_fused(x, r, w, 1e-6)
    fused_add_rms_norm(xc, rc, w.cuda())
    torch.testing.assert_close(rc.cpu(), ref_r, rtol=0, atol=0)
    check(xc, ref_x, dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", (1000, 2056, 8192, 16384, 20480))
@pytest.mark.parametrize("rows", (600, 1100))
def test_cuda_many_rows(rows, hidden, dtype):
    # Grids within 1024 threads an SM (1000 wide at both counts, 2056 at 600 rows) take 2 or 4
    # vectors a thread with their weights; the others plan for bandwidth (1, 4 or 8 vectors).
    x, w = make((rows, hidden), dtype, seed=hidden + 3), make(hidden, dtype, seed=hidden + 4)
    r = make((rows, hidden), dtype, seed=hidden + 5)
    out = torch.full((rows, hidden), float("nan"), dtype=dtype, device="cuda")
    rms_norm_module._modules["cuda"].rms_norm(out, x.cuda(), w.cuda(), 1e-6)
    check(out, ref_rms_norm(x, w, 1e-6), dtype)
    xc, rc = x.cuda(), r.cuda()
    ref_x, ref_r = ref_fused(x, r, w, 1e-6)
    fused_add_rms_norm(xc, rc, w.cuda())
    torch.testing.assert_close(rc.cpu(), ref_r, rtol=0, atol=0)
    check(xc, ref_x, dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_unaligned_and_strided(dtype):
    hidden, rows = 1024, 9
    w = make(hidden, dtype, seed=20).cuda()
    # One element past a 16-byte boundary: the scalar path.
    buf = make(rows * hidden + 1, dtype, seed=21).cuda()
    x = buf[1:].view(rows, hidden)
    check(rms_norm(x, w), ref_rms_norm(x.cpu(), w.cpu(), 1e-6), dtype)
    # Aligned row stride with padding: the vector path with a row stride.
    xs = make((rows, hidden + 64), dtype, seed=22).cuda()[:, :hidden]
    rs_base = make((rows, hidden + 8), dtype, seed=23).cuda()
    rs = rs_base[:, :hidden]
    ref_x, ref_r = ref_fused(xs.cpu(), rs.cpu(), w.cpu(), 1e-6)
    fused_add_rms_norm(xs, rs, w)
    torch.testing.assert_close(rs.cpu(), ref_r, rtol=0, atol=0)
    check(xs, ref_x, dtype)
    # Unaligned residual: fused scalar path.
    xb = make(rows * hidden + 3, dtype, seed=24).cuda()[3:].view(rows, hidden)
    rb = make((rows, hidden), dtype, seed=25).cuda()
    ref_x, ref_r = ref_fused(xb.cpu(), rb.cpu(), w.cpu(), 1e-6)
    fused_add_rms_norm(xb, rb, w)
    torch.testing.assert_close(rb.cpu(), ref_r, rtol=0, atol=0)
    check(xb, ref_x, dtype)


@requires_cuda
def test_cuda_poisoned_output_and_many_rows():
    x, w = make((5000, 256), torch.bfloat16, seed=26).cuda(), make(256, torch.bfloat16).cuda()
    out = torch.full_like(x, float("nan"))
    rms_norm_module._modules["cuda"].rms_norm(out, x, w, 1e-6)
    check(out, ref_rms_norm(x.cpu(), w.cpu(), 1e-6), torch.bfloat16)


@requires_cuda
def test_cuda_graph_capture_replay():
    x = make((64, 4096), torch.bfloat16, seed=27).cuda()
    r = make((64, 4096), torch.bfloat16, seed=28).cuda()
    w = make(4096, torch.bfloat16, seed=29).cuda()
    xg, rg = x.clone(), r.clone()
    rms_norm(x, w)
    fused_add_rms_norm(xg.clone(), rg.clone(), w)  # warm up (module load) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rms_norm(x, w)
        fused_add_rms_norm(xg, rg, w)
    for seed in (30, 31):
        x.copy_(make((64, 4096), torch.bfloat16, seed=seed))
        xg.copy_(make((64, 4096), torch.bfloat16, seed=seed + 10))
        rg.copy_(r)
        x0, r0 = xg.cpu(), rg.cpu()
        graph.replay()
        torch.cuda.synchronize()
        check(out, ref_rms_norm(x.cpu(), w.cpu(), 1e-6), torch.bfloat16)
        ref_x, ref_r = ref_fused(x0, r0, w.cpu(), 1e-6)
        torch.testing.assert_close(rg.cpu(), ref_r, rtol=0, atol=0)
        check(xg, ref_x, torch.bfloat16)


@requires_cuda
def test_cuda_bad_devices_raise():
    x, w = make((4, 8), torch.float32).cuda(), make(8, torch.float32)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, w)  # weight on the CPU
    with pytest.raises(ValueError, match="residual"):
        fused_add_rms_norm(x, make((4, 8), torch.float32), w.cuda())


def test_cpu_float16_inf_and_nan_stay_non_finite():
    # Runs on every SIMD target (conftest.py). x86 targets without F16C promote float16 in
    # software; Highway's portable promotion read inf and NaN as finite numbers near 2^16
    # (mllm_kernel/cpu/simd_io-inl.h PromoteToF32 fixes it up for every CPU op).
    x = torch.randn(3, 40, dtype=torch.float16)
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    y = rms_norm(x, torch.ones(40, dtype=torch.float16))
    assert torch.isnan(y[0]).all(), "a NaN in the row makes every output of the row NaN"
    assert torch.isnan(y[1, 5]) and (y[1, torch.arange(40) != 5] == 0).all(), "inf: sum of squares inf, scale 0"
    assert torch.isfinite(y[2]).all()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
