"""softmax / log_softmax (kernels/softmax) against a float64 torch reference, CPU and CUDA."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

try:
    import mllm_kernel  # noqa: F401
except ImportError:  # run as a plain script from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mllm_kernel.kernels.softmax import _modules, log_softmax, softmax

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (rows, vocab): 1, odd, not a multiple of any vector width, and a larger row.
SHAPES = ((1, 1), (3, 17), (2, 127), (5, 1000), (2, 4099), (4, 32768))
# (rtol, atol) against float64, for probabilities and for log-probabilities.
TOL = {torch.float32: (1e-5, 1e-6), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1e-2, 1e-4)}
LOG_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 1e-2)}


def make_logits(shape, dtype, device="cpu", seed=0, scale=4.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype=dtype, device=device)


from mllm_kernel.kernels.softmax.cases import ref_log_softmax, ref_softmax  # noqa: E402 (shared references)


def check(out, ref, dtype, tol):
    assert out.dtype == dtype and out.shape == ref.shape
    rtol, atol = tol[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_cpu(shape, dtype):
    x = make_logits(shape, dtype, seed=shape[1])
    check(softmax(x), ref_softmax(x), dtype, TOL)
    check(log_softmax(x), ref_log_softmax(x), dtype, LOG_TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", (0.3, 1.0, 2.5))
def test_softmax_temperature_cpu(temperature, dtype):
    x = make_logits((3, 1000), dtype, seed=1)
    check(softmax(x, temperature), ref_softmax(x, temperature), dtype, TOL)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_writes_every_element_cpu(dtype):
    x = make_logits((3, 4099), dtype, seed=2)
    out = torch.full_like(x, float("nan"))
    _modules["cpu"].softmax(out, x, 1.0, 1)
    check(out, ref_softmax(x), dtype, TOL)
    out.fill_(float("nan"))
    _modules["cpu"].log_softmax(out, x, 1)
    check(out, ref_log_softmax(x), dtype, LOG_TOL)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_softmax_row_lengths_in_turn_cpu(dtype):
    # 16-bit outputs keep a row of float32 exps in a per-thread buffer between calls: rows that
    # grow, shrink and pass the kept size (2^20 elements: a buffer for that call alone) in turn.
    for i, vocab in enumerate((4099, 17, 150001, 3, (1 << 20) + 5, 1000)):
        x = make_logits((2, vocab), dtype, seed=40 + i)
        out = torch.full_like(x, float("nan"))
        _modules["cpu"].softmax(out, x, 1.0, 2)
        check(out, ref_softmax(x), dtype, TOL)


def test_softmax_stable_for_large_and_masked_logits_cpu():
    x = make_logits((4, 517), torch.float32, seed=3, scale=1000.0)  # exp would overflow unshifted
    x[1, ::3] = float("-inf")  # masked tokens
    out = softmax(x)
    assert torch.isfinite(out).all()
    assert (out[1, ::3] == 0).all()
    check(out, ref_softmax(x), torch.float32, TOL)
    check(log_softmax(x[:, 1::3].contiguous()), ref_log_softmax(x[:, 1::3]), torch.float32, LOG_TOL)


def test_softmax_leading_dims_and_row_stride_cpu():
    x = make_logits((2, 3, 257), torch.float32, seed=4)
    check(softmax(x), ref_softmax(x), torch.float32, TOL)
    check(log_softmax(x), ref_log_softmax(x), torch.float32, LOG_TOL)
    wide = make_logits((5, 300), torch.bfloat16, seed=5)
    view = wide[:, 7:260]  # row stride 300, unit last stride: no copy needed
    check(softmax(view, 0.7), ref_softmax(view, 0.7), torch.bfloat16, TOL)
    check(softmax(wide[0]), ref_softmax(wide[0]), torch.bfloat16, TOL)  # 1-D


def test_softmax_empty_cpu():
    assert softmax(torch.empty(0, 16)).shape == (0, 16)
    assert log_softmax(torch.empty(3, 0)).shape == (3, 0)


def test_softmax_bad_inputs_cpu():
    with pytest.raises(TypeError, match="dtype"):
        softmax(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="dtype"):
        log_softmax(torch.ones(2, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="stride"):
        softmax(torch.randn(8, 4).t())  # last dim not contiguous
    with pytest.raises(ValueError, match="without a copy"):
        softmax(torch.randn(4, 6, 8).transpose(0, 1))
    with pytest.raises(ValueError, match="temperature"):
        softmax(torch.randn(2, 8), 0.0)
    with pytest.raises(ValueError, match="temperature"):
        softmax(torch.randn(2, 8), -1.0)
    with pytest.raises(ValueError, match="device"):
        softmax(torch.randn(2, 8, device="meta"))
    # The C++ matcher, called directly: mismatched out.
    with pytest.raises(ValueError, match="vocab"):
        _modules["cpu"].softmax(torch.empty(2, 7), torch.randn(2, 8), 1.0, 1)
    with pytest.raises(TypeError, match="dtype"):
        _modules["cpu"].softmax(torch.empty(2, 8, dtype=torch.float16), torch.randn(2, 8), 1.0, 1)


def test_softmax_torch_compile_cpu():
    x = make_logits((3, 1000), torch.float32, seed=6)

    def fn(t):
        return softmax(t * 2.0, temperature=0.5) + log_softmax(t)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), fn(x), rtol=0, atol=0)


# ----------------------------------------------------------------------------- extreme temperatures
# The limit T -> 0 of softmax(x / T) is the one-hot of the row max, ties split evenly; the kernels
# reach it for every positive temperature (down to the smallest double) and never return NaN for
# finite logits. Reference: (x - max) / T in float64 (dividing first overflows to inf - inf).


def ref_softmax_limit(x: torch.Tensor, temperature: float) -> torch.Tensor:
    x = x.double().cpu()
    return torch.softmax((x - x.amax(-1, keepdim=True)) / temperature, -1)


TINY_TEMPERATURES = (1e-9, 1e-30, 1e-38, 1e-39, 1e-45, 5e-324)


def check_small_temperatures(device: str, shape: tuple[int, int], dtype: torch.dtype) -> None:
    x = make_logits(shape, dtype, device=device, seed=21, scale=20.0)
    for temperature in TINY_TEMPERATURES:
        out = softmax(x, temperature)
        assert not out.isnan().any(), temperature
        one_hot = torch.zeros(shape, dtype=torch.float64)
        one_hot.scatter_(1, x.double().cpu().argmax(-1, keepdim=True), 1.0)
        torch.testing.assert_close(ref_softmax_limit(x, temperature), one_hot)  # the limit is reached
        check(out.cpu(), one_hot, dtype, TOL)


def check_ties_and_extremes(device: str) -> None:
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.0], [-2.0, -2.0, -2.0, -2.0]], device=device)
    for temperature in (1e-30, 5e-324):
        expected = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
        check(softmax(ties, temperature).cpu(), expected, torch.float32, TOL)
    # Finite logits at float32's extremes, any temperature: finite probabilities summing to 1.
    x = torch.tensor([[3.4e38, -3.4e38, 0.0, 3.3e38], [-3.4e38, -3.4e38, -3.39e38, 1e-45]], device=device)
    for temperature in (5e-324, 1e-30, 1.0, 1e30, 1.7e308):
        out = softmax(x, temperature)
        assert out.isfinite().all(), (temperature, out)
        check(out.cpu(), ref_softmax_limit(x, temperature), torch.float32, TOL)
    # A huge temperature: uniform.
    x = make_logits((2, 4), torch.float32, device=device, seed=22, scale=1e6)
    check(softmax(x, 1e30).cpu(), torch.full((2, 4), 0.25, dtype=torch.float64), torch.float32, TOL)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_small_temperature_reaches_one_hot_cpu(dtype):
    check_small_temperatures("cpu", (4, 1000), dtype)


def test_softmax_ties_and_extreme_logits_cpu():
    check_ties_and_extremes("cpu")


# ----------------------------------------------------------------------------- CUDA


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ((4, 1000), (2, 151936)))  # row-block path, one block per row
def test_softmax_small_temperature_reaches_one_hot_cuda(shape, dtype):
    check_small_temperatures("cuda", shape, dtype)


@requires_cuda
def test_softmax_ties_and_extreme_logits_cuda():
    check_ties_and_extremes("cuda")
    long_ties = torch.full((2, 151936), -5.0, device="cuda")  # one block per row (online max/sum)
    long_ties[:, 7] = long_ties[:, 100000] = 4.0
    out = softmax(long_ties, 1e-40).cpu()
    assert out[:, 7].eq(0.5).all() and out[:, 100000].eq(0.5).all() and out.sum().item() == 2.0

# ----------------------------------------------------------------------------- CUDA


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
# (160, 40000): more rows than SMs, so the slices shrink to share SMs (and 40001: the scalar path).
@pytest.mark.parametrize("shape", SHAPES + ((3, 128256), (2, 151936), (160, 40000), (160, 40001)))
def test_softmax_cuda(shape, dtype):
    x = make_logits(shape, dtype, device="cuda", seed=shape[1])
    check(softmax(x), ref_softmax(x), dtype, TOL)
    check(log_softmax(x), ref_log_softmax(x), dtype, LOG_TOL)
    check(softmax(x, 0.6), ref_softmax(x, 0.6), dtype, TOL)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_cpu_vs_cuda(dtype):
    x = make_logits((7, 4099), dtype, seed=7)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(softmax(x.cuda(), 1.3).cpu().double(), softmax(x, 1.3).double(),
                               rtol=rtol, atol=atol)
    rtol, atol = LOG_TOL[dtype]
    torch.testing.assert_close(log_softmax(x.cuda()).cpu().double(), log_softmax(x).double(),
                               rtol=rtol, atol=atol)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_writes_every_element_cuda(dtype):
    x = make_logits((3, 4096), dtype, device="cuda", seed=8)
    out = torch.full_like(x, float("nan"))
    _modules["cuda"].softmax(out, x, 1.0)
    check(out, ref_softmax(x), dtype, TOL)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_unaligned_and_strided_cuda(dtype):
    base = make_logits((4 * 1024 + 1,), dtype, device="cuda", seed=9)
    x = base[1:].view(4, 1024)  # pointer off 16-byte alignment: scalar path
    check(softmax(x), ref_softmax(x), dtype, TOL)
    wide = make_logits((5, 1030), dtype, device="cuda", seed=10)
    view = wide[:, :1024]  # odd row stride: scalar path
    check(log_softmax(view), ref_log_softmax(view), dtype, LOG_TOL)
    # Longer than shared memory holds: the scalar path caches part of the row.
    long_base = make_logits((2 * 151936 + 1,), dtype, device="cuda", seed=14)
    long_rows = long_base[1:].view(2, 151936)
    check(softmax(long_rows), ref_softmax(long_rows), dtype, TOL)
    check(log_softmax(long_rows), ref_log_softmax(long_rows), dtype, LOG_TOL)
    masked = make_logits((3, 2048), dtype, device="cuda", seed=11)
    masked[:, 5::2] = float("-inf")
    check(softmax(masked), ref_softmax(masked), dtype, TOL)


@requires_cuda
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("shape", ((1, 128256), (1, 151936), (2, 1_000_003), (8, 32000), (300, 32768)))
def test_softmax_row_split_over_blocks_cuda(shape, dtype):
    # Few rows: each row is split over a cluster of blocks on sm_90 (their (max, sum) combined);
    # a million-element row does not fit shared memory; 300 rows take one block each.
    x = make_logits(shape, dtype, device="cuda", seed=shape[0] + shape[1])
    x[0, : shape[1] // 3] = float("-inf")  # whole blocks of the first row see only -inf
    out = torch.full_like(x, float("nan"))
    _modules["cuda"].softmax(out, x, 1.0)
    check(out, ref_softmax(x), dtype, TOL)
    check(log_softmax(x[:, 1:]), ref_log_softmax(x[:, 1:]), dtype, LOG_TOL)  # unaligned rows


@requires_cuda
def test_softmax_cuda_graph():
    x = make_logits((4, 32000), torch.bfloat16, device="cuda", seed=12)
    softmax(x)  # build and load outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        softmax(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = softmax(x, 0.8)
    x.copy_(make_logits((4, 32000), torch.bfloat16, device="cuda", seed=13))
    graph.replay()
    torch.cuda.synchronize()
    check(out, ref_softmax(x, 0.8), torch.bfloat16, TOL)


@requires_cuda
def test_softmax_bad_inputs_cuda():
    with pytest.raises(ValueError, match="device"):
        _modules["cuda"].softmax(torch.empty(2, 8, device="cuda"), torch.randn(2, 8), 1.0)
    with pytest.raises(TypeError, match="dtype"):
        softmax(torch.randn(2, 8, dtype=torch.float64, device="cuda"))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_thread_counts_give_the_same_results(dtype):
    """num_threads splits the rows over threads (at least 2^16 elements each): the same values
    for any thread count, strided rows and 3-D inputs included, into poisoned outputs."""
    x = make_logits((37, 9000), dtype, seed=9)[:, 5:8990]  # a row stride; several workers' worth
    for fn, ref, tol in ((lambda t, n: softmax(t, 0.8, num_threads=n), lambda t: ref_softmax(t, 0.8), TOL),
                         (lambda t, n: log_softmax(t, num_threads=n), ref_log_softmax, LOG_TOL)):  # fmt: skip
        one = fn(x, 1)
        check(one, ref(x), dtype, tol)
        for n in (2, 3, 64):
            assert torch.equal(fn(x, n), one), n
        x3 = x[:36].reshape(4, 9, -1)
        assert torch.equal(fn(x3, 3), fn(x3, 1))
    out = torch.full((37, 8985), float("nan"), dtype=dtype)
    _modules["cpu"].softmax(out, x, 1.0, 4)
    check(out, ref_softmax(x), dtype, TOL)
    with pytest.raises(ValueError, match="softmax: num_threads must be >= 1, got 0"):
        softmax(x, num_threads=0)
    with pytest.raises(TypeError, match="log_softmax: num_threads must be an int >= 1, got str"):
        log_softmax(x, num_threads="2")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_bad_num_threads_refused_on_every_device(device):
    # CUDA ignores the thread count, but a bad one is refused there as on the CPU.
    x = torch.randn(2, 100, device=device)
    for name, fn in (("softmax", softmax), ("log_softmax", log_softmax)):
        fn(x, num_threads=3)  # any count >= 1 runs
        for bad in (0, -1):
            with pytest.raises(ValueError, match=f"{name}: num_threads must be >= 1, got {bad}"):
                fn(x, num_threads=bad)
        with pytest.raises(TypeError, match=f"{name}: num_threads must be an int >= 1, got NoneType"):
            fn(x, num_threads=None)
