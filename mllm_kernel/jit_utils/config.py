"""Environment switches and the roots where sources, headers and tools are found.

Everything is read from the environment at call time (not import time) so that tests and
users can change a switch without re-importing the package.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

# Not resolve(): under Bazel the package is a tree of symlinks, and the runfiles are what we mean.
PACKAGE_DIR = Path(os.path.abspath(__file__)).parent.parent  # .../mllm_kernel
REPO_DIR = PACKAGE_DIR.parent  # only meaningful in a dev checkout

ENV_CACHE_DIR = "MLLM_KERNEL_CACHE_DIR"
ENV_SOURCE_ROOT = "MLLM_KERNEL_SOURCE_ROOT"
ENV_INCLUDE_ROOT = "MLLM_KERNEL_INCLUDE_ROOT"
ENV_HIGHWAY_ROOT = "MLLM_KERNEL_HIGHWAY_ROOT"
ENV_HIGHWAY_HEADER = "MLLM_KERNEL_HIGHWAY_HEADER"
ENV_CUDA_ARCH_LIST = "MLLM_KERNEL_CUDA_ARCH_LIST"
ENV_DISABLE_JIT = "MLLM_KERNEL_DISABLE_JIT"
ENV_VERBOSE = "MLLM_KERNEL_VERBOSE"
ENV_NVCC = "MLLM_KERNEL_NVCC"
ENV_PREBUILT = "MLLM_KERNEL_PREBUILT"

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


def source_roots() -> list[Path]:
    """Where relative kernel source paths resolve: [$MLLM_KERNEL_SOURCE_ROOT] if set, else [the
    current working directory]. Kernels shipped with the package pass absolute paths instead;
    this runtime never looks into the kernels package."""
    if os.environ.get(ENV_SOURCE_ROOT):
        return [_find_root("kernel source", ENV_SOURCE_ROOT, [])]
    return [Path.cwd()]


def include_root() -> Path:
    return _find_root(
        "mllm_kernel include", ENV_INCLUDE_ROOT, [PACKAGE_DIR / "include", REPO_DIR / "include"]
    )


def highway_root() -> Path:
    """The directory that contains `hwy/` (Highway's headers and its runtime sources).
    Bazel targets name files, not folders, so they may give $MLLM_KERNEL_HIGHWAY_HEADER
    (the path of hwy/highway.h) instead of $MLLM_KERNEL_HIGHWAY_ROOT."""
    header = os.environ.get(ENV_HIGHWAY_HEADER)
    if header and not os.environ.get(ENV_HIGHWAY_ROOT):
        return Path(os.path.dirname(os.path.dirname(os.path.abspath(header))))
    return _find_root(
        "Highway", ENV_HIGHWAY_ROOT, [PACKAGE_DIR / "_vendor" / "highway"], marker="hwy/highway.h"
    )


def prebuilt_manifests() -> list[Path]:
    """Manifests of prebuilt modules: $MLLM_KERNEL_PREBUILT (manifest files or the folders holding
    them, os.pathsep-separated; Bazel sets it for tests and `bazel run`), then the wheel's."""
    manifests = []
    for item in filter(None, os.environ.get(ENV_PREBUILT, "").split(os.pathsep)):
        path = Path(os.path.abspath(item))
        path = path / "manifest.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"{ENV_PREBUILT} names {item!r}, which holds no manifest.json")
        manifests.append(path)
    packaged = PACKAGE_DIR / "_prebuilt" / "manifest.json"
    if packaged.is_file():
        manifests.append(packaged)
    return manifests


def _absolute_if_path(command: str) -> str:
    # Builds run in their own working directory: a relative path to a compiler must not change
    # meaning there. Bare names ("g++") are looked up on PATH as usual.
    return os.path.abspath(command) if os.sep in command else command


def cxx_compiler() -> str:
    return _absolute_if_path(os.environ.get("CXX") or "c++")


def nvcc_compiler() -> str:
    configured = os.environ.get(ENV_NVCC)
    if configured:
        return _absolute_if_path(configured)
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
        return str(Path(cuda_home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    raise FileNotFoundError(f"cannot find nvcc; set {ENV_NVCC}, or CUDA_HOME, or put nvcc on PATH")


def tvm_ffi_paths() -> tuple[list[Path], Path]:
    """(include dirs, libtvm_ffi.so) of the installed apache-tvm-ffi."""
    includes, library = _tvm_ffi_paths()
    return list(includes), library


@functools.cache  # fixed for a process; the lookups cost about 1 ms
def _tvm_ffi_paths() -> tuple[tuple[Path, ...], Path]:
    from tvm_ffi import libinfo

    includes: list[Path] = []
    for path in (libinfo.find_include_path(), libinfo.find_dlpack_include_path()):
        resolved = Path(path).resolve()
        if resolved not in includes:
            includes.append(resolved)
    return tuple(includes), Path(libinfo.find_libtvm_ffi()).resolve()


def tvm_ffi_version() -> str:
    import tvm_ffi

    return str(tvm_ffi.__version__)
