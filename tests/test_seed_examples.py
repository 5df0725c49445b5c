"""The documented custom-kernel examples (the seed README's "Writing Custom JIT Kernels" and the
kernel guide's @jit wrappers) run exactly as written, as a new user would run them: the example
text in a file in a folder outside the package, next to its my_kernel.cpp / my_kernel.cuh, run
with that folder as the working directory (relative sources resolve against it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import mllm_kernel
except ImportError:  # run as a plain script from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import mllm_kernel

import torch

PACKAGE_PARENT = str(Path(mllm_kernel.__file__).resolve().parents[1])

# ----------------------------------------------------------------------------- the examples, verbatim

# Seed 000 (README), "Writing Custom JIT Kernels".
README_EXAMPLE = '''\
import torch
from mllm_kernel.jit_utils import cache_once, load_cpu_jit, make_cpp_args

@cache_once
def _jit_my_kernel_module(param: int):
    args = make_cpp_args(param)
    return load_cpu_jit(
        "my_kernel",
        *args,
        cpp_files=["my_kernel.cpp"],
        cpp_wrappers=[("my_kernel", f"my_namespace::my_kernel<{args}>")],
    )

def my_kernel(src: torch.Tensor, param: int) -> torch.Tensor:
    dst = torch.empty_like(src)
    module = _jit_my_kernel_module(param)
    module.my_kernel(dst, src)
    return dst
'''

# Seed 001 (kernel guide), the CPU Python wrapper mllm_kernel/cpu/jit/my_kernel.py.
GUIDE_CPU_EXAMPLE = '''\
import torch
from mllm_kernel.jit_utils import jit

@jit(
    args=1,
    device="cpu",
    cpp_files=["my_kernel.cpp"],
    cpp_wrappers=[("my_kernel", "mllm_kernel::cpu::my_kernel<1>")],
    func_name="my_kernel",
)
def _kernel_1(compiled_module, dst, src):
    compiled_module.my_kernel(dst, src)

def my_kernel(src: torch.Tensor) -> torch.Tensor:
    dst = torch.empty_like(src)
    _kernel_1(dst, src)
    return dst
'''

# Seed 001, the CUDA Python wrapper mllm_kernel/cuda/jit/my_kernel.py.
GUIDE_CUDA_EXAMPLE = '''\
"""JIT wrapper for my_kernel CUDA kernel."""
import torch
from mllm_kernel.jit_utils import jit

@jit(
    args=[],
    device="cuda",
    cuda_files=["my_kernel.cuh"],
    cpp_wrappers=[],
    cuda_wrappers=[("my_kernel", "MyKernel::run")],
    func_name="my_kernel",
)
def _kernel(compiled_module, input: torch.Tensor, output: torch.Tensor) -> None:
    compiled_module.my_kernel(input, output)

def my_kernel(input: torch.Tensor) -> torch.Tensor:
    """Double every element in *input*.

    Parameters
    ----------
    input : torch.Tensor
        1-D float32 tensor on CUDA.

    Returns
    -------
    torch.Tensor
        Same shape and dtype as *input*.
    """
    output = torch.empty_like(input)
    _kernel(input, output)
    return output
'''

# Seed 001, compile-time constants through make_cpp_args (CUDA).
GUIDE_CUDA_ARGS_EXAMPLE = '''\
from mllm_kernel.jit_utils import jit, make_cpp_args

def _make_kernel(block_size: int, use_pdl: bool):
    cpp_args = make_cpp_args(block_size, use_pdl)  # -> "256, true"

    @jit(
        args=[block_size, use_pdl],
        device="cuda",
        cuda_files=["my_kernel.cuh"],
        cpp_wrappers=[],
        cuda_wrappers=[("my_kernel", f"MyKernel<{cpp_args}>::run")],
        func_name="my_kernel",
    )
    def _kernel(compiled_module, input, output):
        compiled_module.my_kernel(input, output)

    return _kernel
'''

# ----------------------------------------------------------------------------- the user's kernels

# my_namespace::my_kernel<P> adds P (an int) or, given a type name, doubles (fp32_t, as
# make_cpp_args(torch.float32) renders it); mllm_kernel::cpu::my_kernel<C> adds C.
CPU_KERNEL = """\
#include <cstdint>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

using fp32_t = float;

namespace my_namespace {
inline void check(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  TVM_FFI_CHECK(src.dtype().code == kDLFloat && src.dtype().bits == 32, TypeError) << "float32 only";
  TVM_FFI_CHECK(dst.numel() == src.numel() && src.IsContiguous() && dst.IsContiguous(), ValueError) << "shape";
}

template <int P>
void my_kernel(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  check(dst, src);
  auto* out = static_cast<float*>(dst.data_ptr());
  const auto* in = static_cast<const float*>(src.data_ptr());
  for (int64_t i = 0; i < src.numel(); ++i) out[i] = in[i] + P;
}

template <class T>
void my_kernel(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  check(dst, src);
  auto* out = static_cast<T*>(dst.data_ptr());
  const auto* in = static_cast<const T*>(src.data_ptr());
  for (int64_t i = 0; i < src.numel(); ++i) out[i] = in[i] * T(2);
}
}  // namespace my_namespace

namespace mllm_kernel::cpu {
template <int C>
void my_kernel(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) { my_namespace::my_kernel<C>(dst, src); }
}  // namespace mllm_kernel::cpu
"""

CUDA_BODY = """\
#include <cstdint>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

namespace {
__global__ void my_kernel_double(const float* in, float* out, int64_t n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = in[i] * 2.0f;
}

inline void launch(tvm::ffi::TensorView input, tvm::ffi::TensorView output, int block) {
  TVM_FFI_CHECK(input.dtype().code == kDLFloat && input.dtype().bits == 32, TypeError) << "float32 only";
  const int64_t n = input.numel();
  if (n == 0) return;
  my_kernel_double<<<(n + block - 1) / block, block>>>(static_cast<const float*>(input.data_ptr()),
                                                      static_cast<float*>(output.data_ptr()), n);
  TVM_FFI_ICHECK(cudaGetLastError() == cudaSuccess);
}
"""

CUDA_KERNEL = CUDA_BODY + """\
struct MyKernel {
  static void run(tvm::ffi::TensorView input, tvm::ffi::TensorView output) { launch(input, output, 256); }
};
}  // namespace
"""

CUDA_ARGS_KERNEL = CUDA_BODY + """\
template <int kBlock, bool kUsePdl>
struct MyKernel {
  static void run(tvm::ffi::TensorView input, tvm::ffi::TensorView output) { launch(input, output, kBlock); }
};
}  // namespace
"""


def run_example(folder: Path, example: str, kernel_name: str, kernel: str, check: str) -> str:
    """Write the example and the kernel into `folder` (outside the package), then run the example
    with runpy in a child whose working directory is `folder`, followed by `check`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "example.py").write_text(example)
    (folder / kernel_name).write_text(kernel)
    driver = "import runpy, torch\nns = runpy.run_path('example.py')\n" + textwrap.dedent(check) + "\nprint('ok')\n"
    env = {k: v for k, v in os.environ.items() if k not in ("MLLM_KERNEL_SOURCE_ROOT", "MLLM_KERNEL_DISABLE_JIT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_PARENT, env.get("PYTHONPATH")]))
    env["MLLM_KERNEL_CACHE_DIR"] = str(folder.parent / "cache")
    result = subprocess.run([sys.executable, "-c", driver], cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert result.stdout.strip().endswith("ok"), result.stdout
    return result.stderr


def test_readme_example_with_int_and_dtype_params(tmp_path):
    stderr = run_example(tmp_path / "user", README_EXAMPLE, "my_kernel.cpp", CPU_KERNEL, """
        x = torch.randn(1000)
        torch.testing.assert_close(ns["my_kernel"](x, 3), x + 3, rtol=0, atol=0)
        torch.testing.assert_close(ns["my_kernel"](x, 3), x + 3, rtol=0, atol=0)  # cached
        torch.testing.assert_close(ns["my_kernel"](x, torch.float32), x * 2, rtol=0, atol=0)
        """)
    assert stderr.count("compiling cpu_my_kernel_3 ...") == 1
    assert stderr.count("compiling cpu_my_kernel_fp32_t ...") == 1


def test_guide_cpu_jit_example(tmp_path):
    run_example(tmp_path / "user", GUIDE_CPU_EXAMPLE, "my_kernel.cpp", CPU_KERNEL, """
        for n in (1, 128, 1024, 65536):
            x = torch.randn(n)
            torch.testing.assert_close(ns["my_kernel"](x), x + 1, rtol=0, atol=0)
        """)


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@requires_cuda
def test_guide_cuda_jit_example(tmp_path):
    run_example(tmp_path / "user", GUIDE_CUDA_EXAMPLE, "my_kernel.cuh", CUDA_KERNEL, """
        for n in (1, 128, 1024, 65536):
            x = torch.randn(n, dtype=torch.float32, device="cuda")
            result = ns["my_kernel"](x)
            torch.cuda.synchronize()
            torch.testing.assert_close(result, x * 2.0)
        """)


@requires_cuda
def test_guide_cuda_make_cpp_args_example(tmp_path):
    run_example(tmp_path / "user", GUIDE_CUDA_ARGS_EXAMPLE, "my_kernel.cuh", CUDA_ARGS_KERNEL, """
        kernel = ns["_make_kernel"](256, True)
        assert kernel.spec.display_name == "cuda_my_kernel_256_true"
        x = torch.randn(4099, dtype=torch.float32, device="cuda")
        out = torch.empty_like(x)
        kernel(x, out)
        torch.cuda.synchronize()
        torch.testing.assert_close(out, x * 2.0)
        """)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
