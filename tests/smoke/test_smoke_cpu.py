"""The C++ chain end to end: a Bazel-built tvm-ffi module, loaded and called on torch tensors."""
import os
import sys

import pytest
import torch
import tvm_ffi

MODULE = os.path.abspath(os.environ["SMOKE_CPU_MODULE"])


@pytest.mark.parametrize("n", [0, 1, 7, 4099])
def test_scale_add_one_matches_torch(n):
    mod = tvm_ffi.load_module(MODULE)
    x = torch.randn(n, dtype=torch.float32)
    out = torch.full_like(x, float("nan"))  # poison: every element must be written
    mod.scale_add_one(out, x, 2.5)
    expected = (x.double() * 2.5 + 1.0).float()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_bad_dtype_raises_type_error():
    mod = tvm_ffi.load_module(MODULE)
    x = torch.ones(4, dtype=torch.float64)
    with pytest.raises(TypeError, match="float32"):
        mod.scale_add_one(torch.empty_like(x), x, 1.0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
