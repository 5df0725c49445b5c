"""Test-wide setup for Bazel runs: point the JIT runtime at the Highway tree from the build,
and give every test session its own cache directory (never the user's ~/.cache)."""
import os
import tempfile

_header = os.environ.get("HIGHWAY_HEADER")  # $(rootpath @highway//:hwy/highway.h)
if _header and "MLLM_KERNEL_HIGHWAY_ROOT" not in os.environ:
    os.environ["MLLM_KERNEL_HIGHWAY_ROOT"] = os.path.dirname(os.path.dirname(os.path.abspath(_header)))
# The hermetic nvcc from the build (a runfiles-relative path): CUDA modules compile even here.
if os.environ.get("MLLM_KERNEL_NVCC"):
    os.environ["MLLM_KERNEL_NVCC"] = os.path.abspath(os.environ["MLLM_KERNEL_NVCC"])
if "MLLM_KERNEL_CACHE_DIR" not in os.environ:
    os.environ["MLLM_KERNEL_CACHE_DIR"] = os.path.join(
        os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp(prefix="mllm_kernel_test_"), "cache")
