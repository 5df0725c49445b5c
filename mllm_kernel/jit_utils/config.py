"""Environment switches and the roots where sources, headers and tools are found.

Everything is read from the environment at call time (not import time) so that tests and
users can change a switch without re-importing the package.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # .../mllm_kernel
REPO_DIR = PACKAGE_DIR.parent  # only meaningful in a dev checkout

ENV_CACHE_DIR = "MLLM_KERNEL_CACHE_DIR"
ENV_SOURCE_ROOT = "MLLM_KERNEL_SOURCE_ROOT"
ENV_INCLUDE_ROOT = "MLLM_KERNEL_INCLUDE_ROOT"
ENV_HIGHWAY_ROOT = "MLLM_KERNEL_HIGHWAY_ROOT"
ENV_CUDA_ARCH_LIST = "MLLM_KERNEL_CUDA_ARCH_LIST"
ENV_DISABLE_JIT = "MLLM_KERNEL_DISABLE_JIT"
ENV_VERBOSE = "MLLM_KERNEL_VERBOSE"
ENV_NVCC = "MLLM_KERNEL_NVCC"

_TRUE_VALUES = {"1", "true", "yes", "on"}


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE_VALUES


def is_verbose() -> bool:
    return _env_flag(ENV_VERBOSE)


def is_jit_disabled() -> bool:
    return _env_flag(ENV_DISABLE_JIT)


def cache_root() -> Path:
    configured = os.environ.get(ENV_CACHE_DIR)
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "mllm_kernel"


def _find_root(what: str, env_name: str, candidates: list[Path], marker: str | None = None) -> Path:
    """Env override first, then the wheel layout, then the dev-tree layout."""
    configured = os.environ.get(env_name)
    if configured:
        root = Path(configured).expanduser().resolve()
        if not root.is_dir() or (marker and not (root / marker).exists()):
            raise FileNotFoundError(
                f"{env_name}={configured!r} does not point to a {what} directory"
                + (f" (expected {marker!r} inside it)" if marker else "")
            )
        return root
    for candidate in candidates:
        if candidate.is_dir() and (marker is None or (candidate / marker).exists()):
            return candidate
    looked = ", ".join(str(c) for c in candidates) or "(no default location)"
    raise FileNotFoundError(f"cannot find the {what} directory; looked in {looked}; set {env_name}")


def source_root() -> Path:
    return _find_root("kernel source", ENV_SOURCE_ROOT, [PACKAGE_DIR / "_kernels", REPO_DIR / "kernels"])


def include_root() -> Path:
    return _find_root(
        "mllm_kernel include", ENV_INCLUDE_ROOT, [PACKAGE_DIR / "include", REPO_DIR / "include"]
    )


def highway_root() -> Path:
    """The directory that contains `hwy/` (Highway's headers and its runtime sources)."""
    return _find_root(
        "Highway", ENV_HIGHWAY_ROOT, [PACKAGE_DIR / "_vendor" / "highway"], marker="hwy/highway.h"
    )


def cxx_compiler() -> str:
    return os.environ.get("CXX") or "c++"


def nvcc_compiler() -> str:
    configured = os.environ.get(ENV_NVCC)
    if configured:
        return configured
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
        return str(Path(cuda_home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    raise FileNotFoundError(f"cannot find nvcc; set {ENV_NVCC}, or CUDA_HOME, or put nvcc on PATH")


def tvm_ffi_paths() -> tuple[list[Path], Path]:
    """(include dirs, libtvm_ffi.so) of the installed apache-tvm-ffi."""
    from tvm_ffi import libinfo

    includes: list[Path] = []
    for path in (libinfo.find_include_path(), libinfo.find_dlpack_include_path()):
        resolved = Path(path).resolve()
        if resolved not in includes:
            includes.append(resolved)
    return includes, Path(libinfo.find_libtvm_ffi()).resolve()


def tvm_ffi_version() -> str:
    import tvm_ffi

    return str(tvm_ffi.__version__)
