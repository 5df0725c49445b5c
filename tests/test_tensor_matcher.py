"""Tests for mllm_kernel::host::TensorMatcher and the check helpers in utils.hpp.

Loads the probe module built from tests/cpp/matcher_probe.cc; its path comes from the
MLLM_KERNEL_MATCHER_PROBE environment variable (absolute, or relative to the cwd).
"""

import os
import re
import sys

import pytest
import torch
import tvm_ffi


@pytest.fixture(scope="module")
def probe():
    path = os.environ.get("MLLM_KERNEL_MATCHER_PROBE")
    if not path:
        pytest.skip("MLLM_KERNEL_MATCHER_PROBE is not set")
    return tvm_ffi.load_module(os.path.abspath(path))


def raises(exc_type, *fragments):
    """pytest.raises that also requires every fragment to appear verbatim in the message."""
    return pytest.raises(exc_type, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments))


# ---------------------------------------------------------------- successful paths
def test_literal_ok_returns_bound_size(probe):
    assert probe.probe_literal(torch.empty(5, 4)) == 5


def test_symbolic_ok_returns_bound_size(probe):
    assert probe.probe_symbolic(torch.empty(1024), torch.empty(1024)) == 1024


def test_empty_tensors_ok(probe):
    assert probe.probe_symbolic(torch.empty(0), torch.empty(0)) == 0
    assert probe.probe_contiguous(torch.empty(0, 3)) == 0


def test_square_ok(probe):
    assert probe.probe_square(torch.empty(3, 3)) == 3


def test_wildcard_dims_accept_anything(probe):
    assert probe.probe_wildcard(torch.empty(1, 3, 9)) == 3
    assert probe.probe_wildcard(torch.empty(100, 3, 0)) == 3


def test_set_value_ok(probe):
    assert probe.probe_set_value(torch.empty(6), 6) == 6


def test_two_matchers_share_symbols(probe):
    assert tuple(probe.probe_two_matchers(torch.empty(2, 3), torch.empty(5, 3))) == (2, 5, 3)


def test_contiguous_ok_size_one_dims_ignore_strides(probe):
    # Size-1 dims carry no meaningful stride (torch may report anything there).
    assert probe.probe_contiguous(torch.empty(4, 8)[:1]) == 8
    assert probe.probe_contiguous(torch.empty(4, 8)[:1, :3]) == 3  # strides (8, 1)
    assert probe.probe_contiguous(torch.empty(4, 8)[1:2, 2:]) == 6  # offset view


def test_column_slice_is_not_contiguous(probe):
    with raises(ValueError, "expected a contiguous tensor with strides [1, 1]", "got strides [4, 1]", "shape [8, 1]"):
        probe.probe_contiguous(torch.empty(8, 4)[:, :1])


def test_strides_bind_symbolic_stride(probe):
    padded = torch.empty(4, 8)[:, :3]
    assert tuple(probe.probe_strides(padded)) == (4, 3, 8)
    assert tuple(probe.probe_strides(torch.empty(4, 3))) == (4, 3, 3)


def test_shared_stride_ok_with_wildcard(probe):
    a = torch.empty(4, 10)[:, ::2]  # strides (10, 2): column stride is a wildcard
    b = torch.empty(6, 10)[:, :7]
    assert probe.probe_shared_stride(a, b) == 10


def test_dtype_ok(probe):
    probe.probe_dtype(torch.empty(3))
    probe.probe_dtype(torch.empty(3, dtype=torch.bfloat16))
    assert probe.probe_dtype_symbolic(torch.empty(3, dtype=torch.int32), torch.empty(2, dtype=torch.int32)) == "int32"


@pytest.mark.parametrize(
    "dtype, index",
    [
        (torch.float32, 0),
        (torch.float64, 1),
        (torch.int8, 2),
        (torch.int16, 3),
        (torch.int32, 4),
        (torch.int64, 5),
        (torch.uint8, 6),
        (torch.bool, 7),
        (torch.float16, 8),
        (torch.bfloat16, 9),
        (torch.float8_e4m3fn, 10),
        (torch.float8_e5m2, 11),
    ],
)
def test_cpp_type_to_dlpack_dtype_mapping(probe, dtype, index):
    assert probe.probe_dtype_index(torch.zeros(2, dtype=dtype)) == index


def test_device_symbolic_ok(probe):
    assert probe.probe_device_symbolic(torch.empty(2), torch.empty(3)) == "cpu"


# ---------------------------------------------------------------- mismatches
def test_wrong_ndim(probe):
    with raises(ValueError, "probe_literal", "argument 'x'", "expected 2 dims", "[rows, 4]", "got 1 dims", "[3]"):
        probe.probe_literal(torch.empty(3))


def test_literal_dim_mismatch(probe):
    with raises(ValueError, "probe_literal: argument 'x': dim 1 expected 4, got 3", "shape [5, 3]"):
        probe.probe_literal(torch.empty(5, 3))


def test_symbolic_dim_inconsistent_across_tensors(probe):
    msg = "add_constant: argument 'src': dim 0 ('num_elements') expected 1024 (bound by argument 'dst'), got 7"
    with raises(ValueError, msg):
        probe.probe_symbolic(torch.empty(1024), torch.empty(7))


def test_unnamed_arguments_use_position(probe):
    with raises(ValueError, "argument #1: dim 0 ('n') expected 3 (bound by argument #0), got 4"):
        probe.probe_unnamed(torch.empty(3, 2), torch.empty(4, 2))


def test_symbol_reused_within_one_tensor(probe):
    with raises(ValueError, "argument 'x': dim 1 ('n') expected 3 (bound by argument 'x'), got 4"):
        probe.probe_square(torch.empty(3, 4))


def test_wildcard_keeps_literal_check(probe):
    with raises(ValueError, "probe_wildcard: argument 'x': dim 1 expected 3, got 4"):
        probe.probe_wildcard(torch.empty(2, 4, 2))
    with raises(ValueError, "expected 3 dims [*, 3, *], got 2 dims"):
        probe.probe_wildcard(torch.empty(2, 3))


def test_set_value_mismatch(probe):
    with raises(ValueError, "argument 'x': dim 0 ('size') expected 6 (bound by set_value()), got 5"):
        probe.probe_set_value(torch.empty(5), 6)


def test_second_matcher_dim_mismatch(probe):
    with raises(ValueError, "linear: argument 'w': dim 1 ('K') expected 3 (bound by argument 'x'), got 4"):
        probe.probe_two_matchers(torch.empty(2, 3), torch.empty(5, 4))


def test_wrong_dtype(probe):
    with raises(TypeError, "probe_dtype: argument 'x'", "expected dtype in {float32, bfloat16}", "got int32"):
        probe.probe_dtype(torch.empty(3, dtype=torch.int32))


def test_dtype_outside_allowed_set(probe):
    with raises(TypeError, "argument 'a'", "{float32, float64, int32}", "got float16"):
        probe.probe_dtype_symbolic(torch.empty(3, dtype=torch.float16), torch.empty(3, dtype=torch.float16))


def test_symbolic_dtype_inconsistent_across_tensors(probe):
    with raises(TypeError, "argument 'b': expected dtype float32 (bound by argument 'a'), got float64"):
        probe.probe_dtype_symbolic(torch.empty(3), torch.empty(3, dtype=torch.float64))


def test_symbolic_dtype_across_matchers(probe):
    with raises(TypeError, "linear: argument 'w': expected dtype float32 (bound by argument 'x'), got float64"):
        probe.probe_two_matchers(torch.empty(2, 3), torch.empty(5, 3, dtype=torch.float64))


def test_wrong_device_type(probe):
    with raises(ValueError, "probe_device: argument 'x'", "expected device type in {cuda}", "got cpu"):
        probe.probe_device_cuda(torch.empty(3))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_device_id_mismatch_across_tensors(probe):
    a = torch.empty(3, device="cuda:0")
    b = torch.empty(3, device="cuda:1")
    with raises(ValueError, "argument 'b': expected device cuda:0 (bound by argument 'a'), got cuda:1"):
        probe.probe_device_symbolic(a, b)


def test_non_contiguous(probe):
    with raises(ValueError, "probe_contiguous: argument 'x'", "expected a contiguous tensor with strides [4, 1]",
                "got strides [1, 3]", "shape [3, 4]"):
        probe.probe_contiguous(torch.empty(4, 3).t())


def test_explicit_literal_stride_mismatch(probe):
    x = torch.empty(4, 6)[:, ::2]  # strides (6, 2); the spec wants column stride 1
    with raises(ValueError, "probe_strides: argument 'x': stride 1 expected 1, got 2", "strides [6, 2]"):
        probe.probe_strides(x)


def test_symbolic_stride_inconsistent_across_tensors(probe):
    a = torch.empty(4, 8)[:, :3]
    b = torch.empty(4, 5)[:, :3]
    with raises(ValueError, "argument 'b': stride 0 ('row_stride') expected 8 (bound by argument 'a'), got 5"):
        probe.probe_shared_stride(a, b)


def test_unwrap_unbound_symbol(probe):
    with raises(RuntimeError, "symbol 'never_bound' was never bound"):
        probe.probe_unwrap_unbound()


# ---------------------------------------------------------------- utils.hpp
def test_checks_pass(probe):
    probe.probe_runtime_check(True, 1)
    probe.probe_value_check(True, 1)
    probe.probe_type_check(True, 1)


def test_runtime_check(probe):
    with raises(RuntimeError, "runtime check failed, value=7"):
        probe.probe_runtime_check(False, 7)


def test_value_check(probe):
    with raises(ValueError, "value check failed, value=-3"):
        probe.probe_value_check(False, -3)


def test_type_check(probe):
    with raises(TypeError, "type check failed, value=11"):
        probe.probe_type_check(False, 11)


def test_panic(probe):
    with raises(RuntimeError, "panic: boom #42"):
        probe.probe_panic("boom")


@pytest.mark.parametrize(
    "a, b, expected",
    [(0, 4, 0), (1, 4, 1), (7, 4, 2), (8, 4, 2), (9, 4, 3), (2**62 + 1, 2, 2**61 + 1)],
)
def test_div_ceil(probe, a, b, expected):
    assert probe.probe_div_ceil(a, b) == expected


@pytest.mark.parametrize(
    "code, bits, lanes, expected",
    [(2, 32, 1, 4), (4, 16, 1, 2), (0, 8, 1, 1), (2, 32, 4, 16), (6, 8, 1, 1)],
)
def test_dtype_bytes(probe, code, bits, lanes, expected):
    assert probe.probe_dtype_bytes(code, bits, lanes) == expected


def test_dtype_bytes_sub_byte(probe):
    with raises(ValueError, "sub-byte dtype", "bits=4"):
        probe.probe_dtype_bytes(0, 4, 2)


def test_export_of_template_id_with_comma(probe):
    # TVM_FFI_DLL_EXPORT_TYPED_FUNC(probe_template, (ProbeTemplate<1, true>))
    assert probe.probe_template(5) == -6


# ---------------------------------------------------------------- overlap.hpp
def element_offsets(t: torch.Tensor) -> list[int]:
    """Storage offsets (in elements) of every element of t."""
    index = torch.arange(t.untyped_storage().nbytes() // t.element_size())
    return index.as_strided(t.shape, t.stride(), t.storage_offset()).reshape(-1).tolist()


def shares_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Ground truth: whether any byte of an element of a is a byte of an element of b."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    bytes_a = {o * a.element_size() + i for o in element_offsets(a) for i in range(a.element_size())}
    return any(o * b.element_size() + i in bytes_a for o in element_offsets(b) for i in range(b.element_size()))


def overlaps_itself(t: torch.Tensor) -> bool:
    offsets = element_offsets(t)
    return len(set(offsets)) != len(offsets)


def test_overlap_fused_qkv_slices_are_disjoint(probe):
    T, H, KH, D = 5, 4, 2, 8
    fused = torch.empty(T, (H + 2 * KH) * D)
    q = fused[:, : H * D].view(T, H, D)
    k = fused[:, H * D: (H + KH) * D].view(T, KH, D)
    v = fused[:, (H + KH) * D:].view(T, KH, D)
    for a, b in ((q, k), (k, v), (q, v), (k, q)):
        assert probe.probe_overlap_kind(a, b) == 0
    probe.probe_no_aliasing(q, k, v)
    assert probe.probe_overlap_kind(q, q) == 1
    assert probe.probe_overlap_kind(q, fused[2:3, H * D - 1:H * D + 1]) == 1  # straddles q | k
    assert probe.probe_overlap_kind(k, fused[:, :H * D + 1]) == 1  # first element of k's row 0


def test_overlap_trivial_cases(probe):
    a, b = torch.empty(4, 8), torch.empty(4, 8)
    assert probe.probe_overlap_kind(a, b) == 0  # different storages
    assert probe.probe_overlap_kind(a, a[:0]) == 0  # no elements
    assert probe.probe_overlap_kind(a[:2], a[2:]) == 0  # adjacent halves
    assert probe.probe_overlap_kind(a[:3], a[2:]) == 1
    assert probe.probe_overlap_kind(a, a.view(torch.int32)[1, 3:4]) == 1  # another dtype
    assert probe.probe_overlap_kind(a.view(torch.int64)[:, :2], a[:, 4:]) == 0  # bytes 0-15 vs 16-31 per row
    assert probe.probe_overlap_kind(a[:, ::2], a[:, 1::2]) == 0  # interleaved columns: one step of 8 bytes
    assert probe.probe_overlap_kind(a[:, ::2], a[:, 1::3]) == 2  # column 4 is in both (not one step: conservative)
    # Rows with different steps whose byte ranges intersect: reported, although disjoint.
    assert probe.probe_overlap_kind(a[:, :2], a[::2, 4:]) == 2


@pytest.mark.parametrize("seed", range(4))
def test_overlap_is_exact_for_strided_rows(probe, seed):
    """Two 'rows of contiguous blocks' views of one buffer, with one row stride or a single
    block: the answer must equal the ground truth."""
    import random

    rng = random.Random(seed)
    base = torch.empty(4096)
    for _ in range(150):
        step = rng.randint(1, 40)
        views = []
        for _ in range(2):
            if rng.random() < 0.25:  # a single contiguous block
                n = rng.randint(1, 60)
                views.append(base[rng.randint(0, 400): ][:n])
            else:
                block = rng.randint(1, step)
                rows = rng.randint(1, 12)
                views.append(base.as_strided((rows, block), (step, 1), rng.randint(0, 400)))
        a, b = views
        assert probe.probe_overlap_kind(a, b) == int(shares_bytes(a, b)), (a.shape, a.stride(), a.storage_offset(),
                                                                      b.shape, b.stride(), b.storage_offset())


@pytest.mark.parametrize("seed", range(4))
def test_overlap_never_misses_an_overlap(probe, seed):
    """Any layouts (as_strided, stride 0, different strides): 0 only when no byte is shared."""
    import random

    rng = random.Random(100 + seed)
    base = torch.empty(2048)
    for _ in range(150):
        views = []
        for _ in range(2):
            ndim = rng.randint(1, 3)
            shape = [rng.randint(1, 5) for _ in range(ndim)]
            strides = [rng.choice([0, 1, 2, 3, 5, 7, 16, 33]) for _ in range(ndim)]
            views.append(base.as_strided(shape, strides, rng.randint(0, 200)))
        a, b = views
        kind = probe.probe_overlap_kind(a, b)
        truth = shares_bytes(a, b)
        assert (kind != 0) == truth or (kind == 2 and not truth), (a.shape, a.stride(), b.shape, b.stride(), kind)


def test_internal_overlap_exact_for_views(probe):
    x = torch.empty(6, 4, 8)
    for ok in (x, x[1:4], x[:, 1:3], x.transpose(0, 1), x[:, :, ::2], x.permute(2, 0, 1), x[::2, ::3],
               torch.empty(5)[:0].expand(3, 0), x[:1].expand(1, 4, 8), torch.empty(1)):
        probe.probe_internal_overlap(ok)
    with raises(ValueError, "probe_overlap: argument 't' overlaps itself", "stride 0", "expanded"):
        probe.probe_internal_overlap(x[:1].expand(6, 4, 8))
    with raises(ValueError, "argument 't' overlaps itself", "stride 16 of a dim of size 3",
                "smaller than the 32 elements spanned by the dims inside it"):
        probe.probe_internal_overlap(x.view(-1).as_strided((3, 4, 8), (16, 8, 1)))  # token stride < H * D


@pytest.mark.parametrize("seed", range(3))
def test_internal_overlap_never_missed(probe, seed):
    import random

    rng = random.Random(200 + seed)
    base = torch.empty(1024)
    for _ in range(200):
        ndim = rng.randint(1, 3)
        shape = [rng.randint(1, 5) for _ in range(ndim)]
        strides = [rng.choice([0, 1, 2, 3, 4, 6, 8, 12, 20]) for _ in range(ndim)]
        t = base.as_strided(shape, strides, rng.randint(0, 50))
        nested = all(s > 0 for s, n in zip(t.stride(), t.shape) if n > 1)
        try:
            probe.probe_internal_overlap(t)
            raised = False
        except ValueError:
            raised = True
        if overlaps_itself(t):
            assert raised, (t.shape, t.stride())
        elif nested and sorted_nested(t):
            assert not raised, (t.shape, t.stride())


def sorted_nested(t: torch.Tensor) -> bool:
    """Each stride (by increasing stride) exceeds the extent of the dims inside it."""
    extent = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1):
        if stride < extent:
            return False
        extent += stride * (size - 1)
    return True


def test_no_aliasing_names_both_arguments(probe):
    x = torch.empty(4, 16)
    w = torch.empty(16)
    probe.probe_no_aliasing(x[:, :8], x[:, 8:], w)
    probe.probe_no_aliasing(x[:2], x[2:], x[1, :8].clone())
    with raises(ValueError, "probe_aliasing: arguments 'w0'", "and 'w1'", "overlap in memory"):
        probe.probe_no_aliasing(x[:3], x[2:], w)
    with raises(ValueError, "arguments 'w1'", "and 'r0'", "overlap in memory"):
        probe.probe_no_aliasing(x[:2], x[2:], x[3, 4:])
    with raises(ValueError, "argument 'w0' overlaps itself"):
        probe.probe_no_aliasing(w.expand(4, 16), x, w[:0])
    # Read arguments may alias each other and themselves.
    probe.probe_no_aliasing(x[:2], x[2:], torch.empty(1).expand(8))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
