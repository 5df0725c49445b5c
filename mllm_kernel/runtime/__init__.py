"""mllm_kernel.runtime: CUDA source -> cubin -> launch from Python, through the driver API.

    from mllm_kernel.runtime import compile_kernel
    kernel = compile_kernel(SOURCE, "scale", grid=(64,), block=(256,))
    kernel(x, y, 2.0, n)            # torch CUDA tensors, NumPy arrays, Python scalars

For kernels that are not tvm-ffi modules: generated code, experiments, code that must run where
only the driver exists. Cubins share the library's cache (content-addressed keys, per-entry
locks, atomic publication: see compiler.py). `load_cubin` launches precompiled cubins (the Bazel
rule `cuda_cubin`) with no compiler at all. `mllm_kernel.runtime.language` is a small Python
kernel language on top.

Modules: signature.py (parameter types from the declaration), compiler.py (nvcc / NVRTC and the
cache), kernel.py (CompiledKernel: argument conversion, launch), driver.py + driver.cpp (the
driver calls, in C++).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .compiler import build_cubin, read_source
from .signature import Param, SignatureError, parse_signature

__all__ = [
    "CompiledKernel",
    "KernelArgumentError",
    "Param",
    "SignatureError",
    "compile_kernel",
    "load_cubin",
    "parse_signature",
]


def compile_kernel(
    source: str | os.PathLike,
    name: str,
    *,
    grid=(1, 1, 1),
    block=(1, 1, 1),
    shared_mem_bytes: int = 0,
    arch: str | Sequence[str] | None = None,
    options: Sequence[str] = (),
    cache_dir: str | os.PathLike | None = None,
    verbose: bool = False,
    cluster=None,
    compiler: str = "auto",
):
    """Compile kernel `name` of `source` (CUDA C++ text, or a path) to a cubin and return a
    launchable CompiledKernel. grid/block/shared_mem_bytes/cluster are the launch defaults (each
    call may override them).

    arch: "sm_90a", "9.0a", several ("sm_80 sm_90a": a fatbin); default MLLM_KERNEL_CUDA_ARCH_LIST,
      else the visible GPUs. With arch given, no GPU is needed to compile.
    options: extra compiler flags common to nvcc and NVRTC (-I, -D, -std=, --use_fast_math,
      -lineinfo, --maxrregcount=N, -Xptxas=...).
    compiler: "auto" (nvcc if found: MLLM_KERNEL_NVCC, CUDA_HOME, PATH; else NVRTC), "nvcc", "nvrtc".
    verbose: print the command, which compiler ran and ptxas's resource usage (for cached cubins too).
    """
    from .kernel import CompiledKernel

    text, source_path = read_source(source)
    params = parse_signature(text, name)  # a bad declaration is reported before any compile
    cubin = build_cubin(text, source_path, arch=arch, options=options, cache_dir=cache_dir, compiler=compiler,
                        verbose=verbose, label=name)  # fmt: skip
    return CompiledKernel(cubin.image, name, params, grid=grid, block=block, shared_mem_bytes=shared_mem_bytes,
                          cluster=cluster, source=text, path=cubin.path, log=cubin.log, compiler=cubin.compiler)  # fmt: skip


def load_cubin(cubin: bytes | str | os.PathLike, name: str, signature: str | None = None, *, grid=(1, 1, 1),
               block=(1, 1, 1), shared_mem_bytes: int = 0, cluster=None):  # fmt: skip
    """Launch kernel `name` of a precompiled cubin or fatbin (bytes or a path): no compiler needed.

    signature: the kernel's declaration, or the whole source it was compiled from: a cubin does
    not record its parameters' types (the driver only knows their sizes, which are checked).
    Default: the source beside a cubin path, same name with .cu (as the cuda_cubin rule and the
    wheel lay them out).
    """
    from .kernel import CompiledKernel

    if isinstance(cubin, (str, os.PathLike)):
        path = Path(cubin)
        image = path.read_bytes()
    elif isinstance(cubin, (bytes, bytearray, memoryview)):
        path, image = None, bytes(cubin)
    else:
        raise TypeError(f"cubin must be bytes or a path, got {type(cubin).__name__}")
    if signature is None:
        source = path.with_suffix(".cu") if path is not None else None
        if source is None or not source.is_file():
            raise ValueError(
                f"load_cubin({name!r}): a cubin records no parameter types; pass signature= (the kernel's "
                f"declaration or its source){f', or keep {source.name} beside {path.name}' if path else ''}"
            )
        signature = source.read_text()
    params = parse_signature(signature, name)
    return CompiledKernel(image, name, params, grid=grid, block=block, shared_mem_bytes=shared_mem_bytes,
                          cluster=cluster, source=signature, path=path)  # fmt: skip


def __getattr__(attribute: str):
    # torch is imported only when a kernel is made (kernel.py), not with the package.
    if attribute in ("CompiledKernel", "KernelArgumentError"):
        from . import kernel

        return getattr(kernel, attribute)
    if attribute == "language":
        from . import language

        return language
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")

