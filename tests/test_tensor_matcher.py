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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
