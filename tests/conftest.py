"""Test-wide setup for Bazel runs: point the JIT runtime at the Highway tree from the build,
and give every test session its own cache directory (never the user's ~/.cache)."""
import os
import tempfile

# The hermetic nvcc from the build (a runfiles-relative path): CUDA modules compile even here.
# Tools and trees from the build are runfiles-relative paths: absolute, they survive a chdir.
for _name in ("MLLM_KERNEL_NVCC", "MLLM_KERNEL_HIGHWAY_HEADER"):
    if os.environ.get(_name):
        os.environ[_name] = os.path.abspath(os.environ[_name])
if "MLLM_KERNEL_CACHE_DIR" not in os.environ:
    os.environ["MLLM_KERNEL_CACHE_DIR"] = os.path.join(
        os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp(prefix="mllm_kernel_test_"), "cache")
