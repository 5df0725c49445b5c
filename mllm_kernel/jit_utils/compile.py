"""Compiler drivers: flags, CUDA arch handling, command lines, running them."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import config, filememo

# -fno-math-errno: sqrt & co. become instructions instead of libm calls, whose symbol versions
# would tie prebuilt modules to the build machine's glibc (sqrtf@GLIBC_2.43 on Debian sid).
CPU_CFLAGS = ("-std=c++20", "-O3", "-fPIC", "-fvisibility=hidden", "-fno-math-errno")
CUDA_CFLAGS = ("-std=c++20", "-O3", "-Xcompiler", "-fPIC,-fvisibility=hidden")


@functools.cache
def compiler_identity(compiler: str) -> str:
    """sha256 of the compiler's file plus its `--version` output; part of every key. Not its path:
    the same compiler at another place (a second checkout's or Bazel output base's hermetic nvcc)
    must give the same key, so that prebuilt trees are identical across machines. Cached per
    process, and across processes by the stat of the compiler's real file (filememo), so a warm
    load runs nothing."""
    resolved = shutil.which(compiler)
    if resolved is None:
        raise FileNotFoundError(f"mllm_kernel: compiler {compiler!r} not found (set CXX / MLLM_KERNEL_NVCC)")

    def ask() -> str:
        result = subprocess.run([resolved, "--version"], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"mllm_kernel: `{resolved} --version` failed:\n{result.stderr}")
        digest = hashlib.sha256()
        with open(os.path.realpath(resolved), "rb") as binary:
            for chunk in iter(lambda: binary.read(1 << 20), b""):
                digest.update(chunk)
        return f"sha256 {digest.hexdigest()}\n{result.stdout}"

    return filememo.compiler_identity(resolved, ask)


# ----------------------------------------------------------------------------- CUDA archs


@dataclass(frozen=True)
class CudaArch:
    code: str  # "80", "90a", "100f"
    embed_ptx: bool = False  # also embed PTX of this virtual arch, so newer GPUs can JIT it
    ptx_only: bool = False  # "compute_90": PTX alone, no machine code

    def gencode_flags(self) -> list[str]:
        flags = [] if self.ptx_only else [f"-gencode=arch=compute_{self.code},code=sm_{self.code}"]
        if self.embed_ptx or self.ptx_only:
            flags.append(f"-gencode=arch=compute_{self.code},code=compute_{self.code}")
        return flags

    def names(self) -> list[str]:
        """nvcc-style names of what gets embedded: ["sm_90a"], ["sm_90", "compute_90"], ..."""
        return ([] if self.ptx_only else [f"sm_{self.code}"]) + (
            [f"compute_{self.code}"] if self.embed_ptx or self.ptx_only else []
        )


def runs_on(embedded: Sequence[str], capability: tuple[int, int]) -> bool:
    """Whether a module with these embedded targets (nvcc names) runs on a GPU of this compute
    capability: machine code for exactly that capability ("a"/"f" variants included), or PTX of
    an older or equal virtual arch (not arch-specific "a" PTX) that the driver can JIT."""
    cc = capability[0] * 10 + capability[1]
    for name in embedded:
        match = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", name)
        if match is None:
            continue
        kind, digits, suffix = match.groups()
        if kind == "sm" and int(digits) == cc:
            return True
        if kind == "compute" and not suffix and int(digits) <= cc:
            return True
    return False


# "8.6" / "9.0a" (torch style) or "sm_86" / "sm_90a" / "compute_90" (nvcc style), then an
# optional "+PTX".
_ARCH_TOKEN = re.compile(r"^(?:(sm_|compute_)(\d{2,3})|(\d{1,2})\.(\d))([af]?)(\+ptx)?$", re.IGNORECASE)


def parse_cuda_arch_list(text: str) -> list[CudaArch]:
    """Parse "8.0 9.0a", "sm_80;sm_90a", "9.0+PTX" (separators: space, ';' or ',')."""
    archs: list[CudaArch] = []
    for token in re.split(r"[\s;,]+", text.strip()):
        if not token:
            continue
        match = _ARCH_TOKEN.match(token)
        if match is None:
            raise ValueError(
                f"bad CUDA arch {token!r} in {config.ENV_CUDA_ARCH_LIST}; "
                "use forms like '8.0', '9.0a', 'sm_90a', '9.0+PTX'"
            )
        prefix, sm_digits, major, minor, suffix, ptx = match.groups()
        code = (sm_digits or major + minor) + suffix.lower()
        ptx_only = (prefix or "").lower() == "compute_"
        arch = CudaArch(code, embed_ptx=ptx is not None and not ptx_only, ptx_only=ptx_only)
        if arch not in archs:
            archs.append(arch)
    if not archs:
        raise ValueError(f"{config.ENV_CUDA_ARCH_LIST} is set but names no architecture")
    return archs


def cuda_arch_list() -> list[CudaArch]:
    configured = os.environ.get(config.ENV_CUDA_ARCH_LIST)
    if configured is not None:
        return parse_cuda_arch_list(configured)
    try:
        import torch

        if torch.cuda.is_available():
            capabilities = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
            return [CudaArch(f"{major}{minor}") for major, minor in capabilities]
    except ImportError:
        pass
    raise RuntimeError(
        "mllm_kernel: no visible CUDA GPU to pick target architectures from; set "
        f"{config.ENV_CUDA_ARCH_LIST} (e.g. '8.0 9.0a' or 'sm_80;sm_90a', '+PTX' to embed PTX)"
    )


def gencode_flags(archs: Sequence[CudaArch]) -> list[str]:
    return [flag for arch in archs for flag in arch.gencode_flags()]


# ----------------------------------------------------------------------------- commands


def _include_flags(include_paths: Sequence[Path]) -> list[str]:
    return [f"-I{path}" for path in include_paths]


def cxx_compile_command(
    cxx: str, source: Path, obj: Path, include_paths: Sequence[Path], cflags: Sequence[str]
) -> list[str]:
    return [cxx, *cflags, *_include_flags(include_paths), "-c", str(source), "-o", str(obj)]


def nvcc_compile_command(
    nvcc: str, cxx: str, source: Path, obj: Path, include_paths: Sequence[Path], cuda_cflags: Sequence[str]
) -> list[str]:
    return [nvcc, "-ccbin", cxx, *cuda_cflags, *_include_flags(include_paths), "-c", str(source), "-o", str(obj)]


def cxx_link_command(cxx: str, objs: Sequence[Path], output: Path, tvm_lib: Path, ldflags: Sequence[str]) -> list[str]:
    libdir = tvm_lib.parent
    return [
        cxx, "-shared", *map(str, objs), "-o", str(output),
        "-Wl,--no-undefined", f"-L{libdir}", "-ltvm_ffi", *ldflags,
    ]  # fmt: skip (no rpath: tvm_ffi has loaded libtvm_ffi.so, soname libtvm_ffi.so, before any module)


def nvcc_link_command(
    nvcc: str, cxx: str, objs: Sequence[Path], output: Path, tvm_lib: Path, ldflags: Sequence[str]
) -> list[str]:
    libdir = tvm_lib.parent
    return [
        # No device-link step: no module is compiled as relocatable device code, and nvlink would
        # record its command line (absolute -L paths) in the module. Local symbols carry nvcc's
        # temp-file name (tmpxft_<pid>_...): dropped. Both keep the bytes independent of where
        # and when the module is built.
        nvcc, "-ccbin", cxx, "-shared", "-cudart=static", "--no-device-link", *map(str, objs), "-o", str(output),
        "-Xlinker", "--no-undefined", f"-L{libdir}", "-ltvm_ffi", *ldflags, "-Xlinker", "--discard-all",
    ]  # fmt: skip


@functools.cache
def cuda_toolkit_includes(nvcc: str) -> tuple[Path, ...]:
    """nvcc's own include dirs, so plain C++ wrapper TUs can include cuda_runtime.h.

    Asked from `nvcc --dryrun` because nvcc may be a wrapper script outside the toolkit."""
    result = subprocess.run(
        [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull], capture_output=True, text=True
    )
    for line in (result.stderr + result.stdout).splitlines():
        if line.startswith("#$ INCLUDES="):
            paths = re.findall(r'-I"?([^"\s]+)"?', line)
            return tuple(Path(p).resolve() for p in paths if Path(p).is_dir())
    return ()


def _run(command: list[str], module_name: str, cwd: Path) -> str:
    """Run one compiler command; return what it printed (stderr, then stdout)."""
    if config.is_verbose():
        print(f"mllm_kernel: [{module_name}] {shlex.join(command)}", file=sys.stderr, flush=True)
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"mllm_kernel: building {module_name} failed (exit code {result.returncode})\n"
            f"command: {shlex.join(command)}\n"
            f"{result.stderr}{result.stdout}"
        )
    if config.is_verbose() and (result.stderr or result.stdout):
        print(result.stderr + result.stdout, file=sys.stderr, end="", flush=True)
    return result.stderr + result.stdout


def run_build(compile_commands: Sequence[list[str]], link_command: list[str], module_name: str, cwd: Path) -> list[str]:
    """Compile the translation units in parallel, then link; return each compile's output."""
    workers = max(1, min(len(compile_commands), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_run, command, module_name, cwd) for command in compile_commands]
        outputs = [future.result() for future in futures]  # re-raises the first failure
    _run(link_command, module_name, cwd)
    return outputs


# ptxas says so (an "info" line, printed without -v) when it had to make every wgmma of a kernel
# wait for the one before: the code stays correct and runs 20-40% slower (benchmarks/TUNING.md,
# "ptxas and the wgmma pipeline"). C7511/C7512: too few registers; C7514/C7515: a non-wgmma
# instruction reads / writes an accumulator while a product may be in flight.
_SERIALIZED_WGMMA = re.compile(
    r"\((C75\d\d)\) Potential Performance Loss: wgmma\.mma_async instructions are serialized (.*?)"
    r" in the function '([^']+)'"
)


def serialized_wgmma(output: str) -> list[str]:
    """ptxas's reports of serialized wgmma in a compiler's output, one "CODE function: reason"
    line each (each function once per code)."""
    reports = dict.fromkeys(f"{code} {function}: {reason.strip()}"
                            for code, reason, function in _SERIALIZED_WGMMA.findall(output))
    return list(reports)
