"""NVRTC, the compiler for machines with no CUDA toolkit: CUDA C++ text to a cubin in-process,
through libnvrtc (the `nvidia-cuda-nvrtc` wheel, or a system copy). ctypes is fine here: a
compile takes hundreds of milliseconds, the calls a few microseconds.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
from collections.abc import Sequence

from mllm_kernel.jit_utils import filememo

ENV_NVRTC = "MLLM_KERNEL_NVRTC"  # path of a libnvrtc.so to use


def _candidates() -> list[str]:
    configured = os.environ.get(ENV_NVRTC)
    if configured:
        return [configured]
    found: list[str] = []
    try:
        import nvidia  # namespace package of NVIDIA's wheels

        for root in nvidia.__path__:
            for pattern in ("cu13/lib/libnvrtc.so.*", "cuda_nvrtc/lib/libnvrtc.so.*"):
                found += sorted(p for p in glob.glob(os.path.join(root, pattern)) if "builtins" not in p and ".alt." not in p)
    except ImportError:
        pass
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        found += sorted(glob.glob(os.path.join(cuda_home, "lib64", "libnvrtc.so*")))
    return found + ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]  # the loader's search path


@functools.cache
def library() -> tuple[ctypes.CDLL, str]:
    """(the loaded libnvrtc, its path); FileNotFoundError naming where it looked."""
    errors = []
    for candidate in _candidates():
        try:
            # libnvrtc dlopens its builtins library by bare name, which a wheel's folder is not on
            # the search path for: load the copy beside it first.
            for builtins in glob.glob(os.path.join(os.path.dirname(candidate), "libnvrtc-builtins.so.*")):
                if ".alt." not in builtins:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            lib = ctypes.CDLL(candidate)
        except OSError as error:
            errors.append(str(error))
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        path = candidate
        if os.sep not in candidate:  # found through the loader: ask it where from
            info = _dl_path(lib)
            path = info or candidate
        return lib, os.path.realpath(path) if os.path.exists(path) else path
    raise FileNotFoundError(
        "no NVRTC library found (install the `nvidia-cuda-nvrtc` wheel, or set "
        f"{ENV_NVRTC} to a libnvrtc.so); tried: " + "; ".join(errors)
    )


def _dl_path(lib: ctypes.CDLL) -> str | None:
    class _DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]  # fmt: skip

    info = _DlInfo()
    libdl = ctypes.CDLL(None)
    if libdl.dladdr(ctypes.cast(lib.nvrtcVersion, ctypes.c_void_p), ctypes.byref(info)) and info.fname:
        return info.fname.decode()
    return None


def version() -> tuple[int, int]:
    lib, _ = library()
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
    return major.value, minor.value


def identity() -> str:
    """What the cache key records of this compiler: its version and the sha256 of libnvrtc and
    the builtins library beside it. Not their paths: the same wheel installed elsewhere (another
    virtual environment, another machine) gives the same keys. Memoized across processes by the
    library file's stat, as nvcc's identity is (jit_utils/filememo.py)."""
    _, path = library()
    major, minor = version()
    if not os.path.exists(path):  # loaded by bare name and the loader would not say from where
        return f"nvrtc {major}.{minor} {path}"

    def digest() -> str:
        sha = hashlib.sha256()
        folder = os.path.dirname(path)
        builtins = sorted(p for p in glob.glob(os.path.join(folder, "libnvrtc-builtins.so.*")) if ".alt." not in p)
        for name in [path, *builtins]:
            with open(name, "rb") as file:
                for chunk in iter(lambda: file.read(1 << 20), b""):
                    sha.update(chunk)
        return f"nvrtc {major}.{minor} sha256 {sha.hexdigest()}"

    return filememo.compiler_identity(path, digest)


def _check(lib: ctypes.CDLL, result: int, call: str) -> None:
    if result != 0:
        raise RuntimeError(f"{call} failed: {lib.nvrtcGetErrorString(result).decode()}")


def compile_to_cubin(source: str, filename: str, options: Sequence[str]) -> tuple[bytes, str]:
    """(cubin image, compile log). Raises RuntimeError with the log when the compile fails."""
    lib, _ = library()
    program = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), filename.encode(), 0, None, None),
           "nvrtcCreateProgram")  # fmt: skip
    try:
        encoded = [option.encode() for option in options]
        argv = (ctypes.c_char_p * len(encoded))(*encoded)
        status = lib.nvrtcCompileProgram(program, len(encoded), argv)
        log_size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetProgramLogSize(program, ctypes.byref(log_size)), "nvrtcGetProgramLogSize")
        log_buffer = ctypes.create_string_buffer(log_size.value)
        _check(lib, lib.nvrtcGetProgramLog(program, log_buffer), "nvrtcGetProgramLog")
        log = log_buffer.value.decode(errors="replace")
        if status != 0:
            raise RuntimeError(f"NVRTC: compiling {filename} failed ({lib.nvrtcGetErrorString(status).decode()})\n{log}")
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "nvrtcGetCUBINSize")
        image = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetCUBIN(program, image), "nvrtcGetCUBIN")
        return image.raw, log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
