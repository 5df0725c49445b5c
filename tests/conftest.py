"""Test-wide setup for Bazel runs: point the JIT runtime at the Highway tree from the build,
and give every test session its own cache directory (never the user's ~/.cache)."""
import os
import tempfile

# The hermetic nvcc from the build (a runfiles-relative path): CUDA modules compile even here.
if os.environ.get("MLLM_KERNEL_NVCC"):
    os.environ["MLLM_KERNEL_NVCC"] = os.path.abspath(os.environ["MLLM_KERNEL_NVCC"])
if "MLLM_KERNEL_CACHE_DIR" not in os.environ:
    os.environ["MLLM_KERNEL_CACHE_DIR"] = os.path.join(
        os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp(prefix="mllm_kernel_test_"), "cache")
