"""add_constant through the JIT runtime, against torch (CPU always, CUDA when available)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

try:
    import mllm_kernel
except ImportError:  # run as a plain script from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import mllm_kernel

import torch

import mllm_kernel.cpu.jit as cpu_jit
import mllm_kernel.cuda.jit as cuda_jit
from mllm_kernel.kernels.add_constant import ALLOWED_CONSTANTS, _KERNELS
from mllm_kernel.jit_utils import config, registered_specs

SIZES = (0, 1, 7, 1024, 2**20)
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module", autouse=True)
def isolated_cache(tmp_path_factory):
    # Module scope: the wrappers load each module once per process (cache_once), so the
    # cache dir must not change under them between tests.
    patch = pytest.MonkeyPatch()
    patch.setenv("MLLM_KERNEL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    # MLLM_KERNEL_DISABLE_JIT stays as the caller set it: Bazel sets it, with the prebuilt
    # modules, so that these tests prove nothing is compiled at run time.
    yield
    patch.undo()


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("c", ALLOWED_CONSTANTS)
@pytest.mark.parametrize("size", SIZES)
def test_cpu_add_constant_matches_torch(size, c):
    x = torch.randn(size, dtype=torch.float32)
    out = cpu_jit.add_constant(x, c)
    assert out.shape == x.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, x + c, rtol=0, atol=0)


@pytest.mark.parametrize("c", ALLOWED_CONSTANTS)
def test_cpu_add_constant_writes_every_element(c):
    x = torch.randn(4099)
    out = torch.full_like(x, float("nan"))
    _KERNELS[c].load_module().add_constant(out, x)
    torch.testing.assert_close(out, x + c, rtol=0, atol=0)


@pytest.mark.parametrize("c", [0, 3, -1, 32, 1.5])
def test_cpu_add_constant_rejects_other_constants(c):
    with pytest.raises(ValueError, match=r"\(1, 2, 4, 8, 16\)"):
        cpu_jit.add_constant(torch.randn(4), c)


@pytest.mark.parametrize("size", SIZES)
def test_cpu_add_constant_runtime_matches_torch(size):
    x = torch.randn(size, dtype=torch.float32)
    c = float(torch.randn(()).item() * 100)
    out = cpu_jit.add_constant_runtime(x, c)
    torch.testing.assert_close(out, x + torch.tensor(c, dtype=torch.float32), rtol=0, atol=0)


def test_cpu_add_constant_rejects_non_contiguous():
    x = torch.randn(64)[::2]
    with pytest.raises(ValueError, match="contiguous"):
        cpu_jit.add_constant(x, 2)
    with pytest.raises(ValueError, match="contiguous"):
        cpu_jit.add_constant_runtime(x, 2.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.int32])
def test_cpu_add_constant_rejects_wrong_dtype(dtype):
    x = torch.ones(8, dtype=dtype)
    with pytest.raises(TypeError):
        cpu_jit.add_constant(x, 4)
    with pytest.raises(TypeError):
        cpu_jit.add_constant_runtime(x, 4.0)


def test_cpu_add_constant_rejects_2d():
    with pytest.raises(ValueError):
        cpu_jit.add_constant(torch.randn(4, 4), 1)


def test_cpu_specs_are_registered():
    names = {spec.display_name for spec in registered_specs()}
    assert {f"cpu_add_constant_{c}" for c in ALLOWED_CONSTANTS} <= names
    assert "cpu_add_constant_runtime" in names


# ----------------------------------------------------------------------------- CUDA


def skip_unless_cuda_module_available(c: int) -> None:
    """Each CUDA constant is its own module and only c = 1 is prebuilt: under
    MLLM_KERNEL_DISABLE_JIT=1 (Bazel's tests, an installed wheel) the others cannot be built.
    Check that they fail with the documented error, then skip."""
    if not config.is_jit_disabled():
        return
    from mllm_kernel.kernels.add_constant import cuda_spec

    spec = cuda_spec(c)
    try:
        if spec.status() != "not built":
            return
    except (OSError, RuntimeError, ValueError):
        pass  # no nvcc / archs to key the JIT cache with: cannot be cached either
    with pytest.raises(RuntimeError, match=rf"{re.escape(spec.display_name)} is neither prebuilt.*MLLM_KERNEL_DISABLE_JIT=1 forbids"):
        cuda_jit.add_constant(torch.zeros(4, dtype=torch.int32, device="cuda"), c)
    pytest.skip(f"{spec.display_name} is not prebuilt and MLLM_KERNEL_DISABLE_JIT=1 forbids compiling it")


@requires_cuda
@pytest.mark.parametrize("c", [0, 1, 16, -7, 123456, 2**31 - 1, -(2**31)])
@pytest.mark.parametrize("size", SIZES)
def test_cuda_add_constant_matches_torch(size, c):
    skip_unless_cuda_module_available(c)
    x = torch.randint(-(2**31), 2**31 - 1, (size,), dtype=torch.int32, device="cuda")
    out = cuda_jit.add_constant(x, c)
    torch.cuda.synchronize()
    # int32 overflow wraps in the kernel; compute the reference in int64 and wrap the same way.
    expected = ((x.to(torch.int64) + c + 2**31) % 2**32 - 2**31).to(torch.int32)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@requires_cuda
def test_cuda_add_constant_misaligned_view():
    skip_unless_cuda_module_available(5)
    base = torch.randint(-1000, 1000, (1025,), dtype=torch.int32, device="cuda")
    x = base[1:]  # 4-byte offset: the kernel's scalar path
    out = cuda_jit.add_constant(x, 5)
    torch.testing.assert_close(out, x + 5, rtol=0, atol=0)


@requires_cuda
def test_cuda_add_constant_rejects_bad_inputs():
    with pytest.raises(ValueError, match="contiguous"):
        cuda_jit.add_constant(torch.zeros(64, dtype=torch.int32, device="cuda")[::2], 1)
    with pytest.raises(TypeError):
        cuda_jit.add_constant(torch.zeros(8, dtype=torch.float32, device="cuda"), 1)
    with pytest.raises(ValueError):
        cuda_jit.add_constant(torch.zeros(8, dtype=torch.int32), 1)  # a CPU tensor


@pytest.mark.parametrize("c, error", [(2**31, ValueError), (-(2**31) - 1, ValueError), (1.0, TypeError), (True, TypeError)])
def test_cuda_add_constant_checks_constant_before_building(c, error):
    # Python picks the module from c, so c is checked before any compile (no GPU needed).
    with pytest.raises(error):
        cuda_jit.add_constant(torch.zeros(4, dtype=torch.int32), c)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
