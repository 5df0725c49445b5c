"""CUDA source -> cubin (or fatbin), content-addressed in the library's cache.

Cache layout, under the cache root (MLLM_KERNEL_CACHE_DIR, or the `cache_dir` a caller names):
    <root>/cubin/<key[:16]>/kernel.cubin   (+ integrity.json, build.json: command, compiler, ptxas log)
    <root>/cubin/<key[:16]>.lock
Built and published like the JIT's modules (jit_utils/cache.py: flock, private temp directory,
atomic rename), so concurrent processes compile once and a killed compile leaves nothing behind.

The key covers the source text (and every header it reaches through the include path), the
options, the target archs and the compiler's identity (the sha256 of nvcc's file and its
--version, or of NVRTC's library and its version; never their paths). Kernel names are not in it: one source's kernels share one cubin.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mllm_kernel.jit_utils import cache, compile, config, filememo, integrity
from mllm_kernel.jit_utils.key import RUNTIME_FORMAT_VERSION, hash_sources

from . import nvrtc

CUBIN_DIR = "cubin"
CUBIN_FILE = "kernel.cubin"
BUILD_FILE = "build.json"
KEY_DIR_LEN = 16
COMPILERS = ("auto", "nvcc", "nvrtc")
# Always asked of ptxas: its resource report (registers, shared memory, spills) is kept in
# build.json, and printed when verbose, for cached kernels too.
_PTXAS_VERBOSE = {"nvcc": ["-Xptxas", "-v"], "nvrtc": ["-Xptxas=-v"]}


@dataclass(frozen=True)
class Cubin:
    image: bytes
    path: Path
    key: str
    compiler: str  # "nvcc" or "nvrtc"
    log: str  # the compiler's output (ptxas resource usage)
    cached: bool  # found in the cache, not compiled now


def resource_usage(log: str) -> str:
    """The lines of a ptxas log that say what each function uses."""
    keep = ("Compiling entry", "Used ", "spill", "bytes stack", "smem")
    return "\n".join(line for line in log.splitlines() if any(word in line for word in keep))


def read_source(source: str | os.PathLike) -> tuple[str, Path | None]:
    """(text, path) of `source`: CUDA C++ text, or the path of a file holding it."""
    if isinstance(source, os.PathLike):
        path = Path(source)
    elif isinstance(source, str):
        if "\n" in source or "__global__" in source:
            return source, None
        path = Path(source)
    else:
        raise TypeError(f"source must be CUDA C++ text or a path, got {type(source).__name__}")
    if not path.is_file():
        raise FileNotFoundError(f"source {str(source)!r} is neither CUDA source text (no __global__ in it) nor an existing file")
    return path.read_text(), Path(os.path.abspath(path))


def resolve_archs(arch: str | Sequence[str] | None) -> list[compile.CudaArch]:
    """`arch` ("sm_90a", "9.0a", "sm_80 sm_90a", a list...), else MLLM_KERNEL_CUDA_ARCH_LIST,
    else the visible GPUs (the JIT's rule)."""
    if arch is None:
        return compile.cuda_arch_list()
    text = arch if isinstance(arch, str) else " ".join(arch)
    try:
        return compile.parse_cuda_arch_list(text)
    except ValueError:
        raise ValueError(f"arch={arch!r}: use forms like 'sm_90a', '9.0a', 'sm_80 sm_90a', 'compute_90'") from None


def pick_compiler(compiler: str) -> str:
    """"nvcc" when one is found (MLLM_KERNEL_NVCC, CUDA_HOME, PATH), else "nvrtc"."""
    if compiler not in COMPILERS:
        raise ValueError(f"compiler must be one of {COMPILERS}, got {compiler!r}")
    if compiler != "auto":
        return compiler
    try:
        nvcc = config.nvcc_compiler()
        if shutil.which(nvcc) is None:
            raise FileNotFoundError(f"nvcc {nvcc!r} does not exist or is not executable")
        return "nvcc"
    except FileNotFoundError as nvcc_missing:
        try:
            nvrtc.library()
        except FileNotFoundError as nvrtc_missing:
            raise FileNotFoundError(f"no CUDA compiler: {nvcc_missing}; and {nvrtc_missing}") from None
        return "nvrtc"


def _include_dirs(options: Sequence[str], source_path: Path | None) -> list[Path]:
    dirs = [source_path.parent] if source_path else []
    for index, option in enumerate(options):
        for prefix in ("-I", "--include-path=", "-isystem"):
            if option.startswith(prefix):
                value = option[len(prefix) :] or (options[index + 1] if index + 1 < len(options) else "")
                if value:
                    dirs.append(Path(os.path.abspath(value)))
    dirs.append(config.include_root())  # our device headers (mllm_kernel/cuda/*.cuh) are includable
    return dirs


def _nvrtc_header_dirs() -> list[Path]:
    """CUDA's headers (cuda_fp16.h, ...) for NVRTC, which has none built in: the NVIDIA wheels'
    include folder beside libnvrtc, $CUDA_HOME/include, or an nvcc's toolkit when there is one."""
    _, library = nvrtc.library()
    dirs = [Path(library).parent.parent / "include"]
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        dirs.append(Path(cuda_home) / "include")
    try:
        nvcc = config.nvcc_compiler()
        if shutil.which(nvcc):
            dirs += compile.cuda_toolkit_includes(nvcc)
    except FileNotFoundError:
        pass
    return [d for d in dirs if (d / "cuda_fp16.h").is_file()]


def _compiler_identity(compiler: str) -> str:
    if compiler == "nvcc":
        return compile.compiler_identity(config.nvcc_compiler())
    return nvrtc.identity()


def cubin_key(text: str, archs: Sequence[compile.CudaArch], options: Sequence[str], compiler: str,
              include_dirs: Sequence[Path]) -> str:  # fmt: skip
    hasher = hashlib.sha256()
    hasher.update(f"mllm_kernel-runtime-cubin {RUNTIME_FORMAT_VERSION}\n".encode())
    parts = [("source", text), ("archs", " ".join(compile.gencode_flags(archs))),
             ("options", json.dumps(list(options))), ("compiler", _compiler_identity(compiler))]  # fmt: skip
    for label, value in parts:
        encoded = value.encode()
        hasher.update(f"{label} {len(encoded)}\n".encode())
        hasher.update(encoded)
    # Headers the text includes, found on the include path (toolkit headers: the compiler's identity).
    headers = []
    for _, name in filememo._INCLUDE_LINE.findall(text.encode()):
        for directory in include_dirs:
            candidate = directory / name.decode()
            if candidate.is_file():
                headers.append(Path(os.path.normpath(candidate)))
                break
    hash_sources(hasher, headers, include_dirs)
    filememo.flush()
    return hasher.hexdigest()


def _nvcc_command(source_file: Path, output: Path, archs: Sequence[compile.CudaArch], options: Sequence[str],
                  include_dirs: Sequence[Path]) -> list[str]:  # fmt: skip
    if len(archs) == 1 and not archs[0].embed_ptx and not archs[0].ptx_only:
        target = ["-cubin", f"-arch={archs[0].names()[0]}"]
    else:
        target = ["-fatbin", *compile.gencode_flags(archs)]  # several targets: the driver picks
    return [config.nvcc_compiler(), "-ccbin", config.cxx_compiler(), *target, "-O3", *_PTXAS_VERBOSE["nvcc"],
            *[f"-I{d}" for d in include_dirs], *options, "-o", str(output), str(source_file)]  # fmt: skip


def _compile(text: str, source_path: Path | None, build_dir: Path, archs: Sequence[compile.CudaArch],
             options: Sequence[str], compiler: str, include_dirs: Sequence[Path], verbose: bool) -> tuple[str, list[str]]:  # fmt: skip
    """Compile into build_dir/kernel.cubin; return (log, command)."""
    output = build_dir / CUBIN_FILE
    if compiler == "nvcc":
        source_file = source_path or build_dir / "kernel.cu"
        if source_path is None:
            source_file.write_text(text)
        command = _nvcc_command(source_file, output, archs, options, include_dirs)
        if verbose:
            print(f"mllm_kernel.runtime: {shlex.join(command)}", file=sys.stderr, flush=True)
        result = subprocess.run(command, cwd=build_dir, capture_output=True, text=True)
        log = result.stderr + result.stdout
        if result.returncode != 0:
            raise RuntimeError(f"mllm_kernel.runtime: nvcc failed (exit code {result.returncode})\ncommand: {shlex.join(command)}\n{log}")
        return log, command
    if len(archs) != 1 or archs[0].ptx_only or archs[0].embed_ptx:
        names = " ".join(n for a in archs for n in a.names())
        raise ValueError(f"NVRTC compiles for one sm_XX target at a time, got {names!r}; pass one arch")
    header_dirs = _nvrtc_header_dirs()
    command = [f"--gpu-architecture={archs[0].names()[0]}", *_PTXAS_VERBOSE["nvrtc"],
               *[f"-I{d}" for d in [*include_dirs, *header_dirs]], *options]  # fmt: skip
    if verbose:
        print(f"mllm_kernel.runtime: NVRTC ({nvrtc.identity()}) {shlex.join(command)}", file=sys.stderr, flush=True)
    image, log = nvrtc.compile_to_cubin(text, source_path.name if source_path else "kernel.cu", command)
    output.write_bytes(image)
    return log, ["nvrtc", *command]


def _move_aside(version_dir: Path, problem: str) -> None:
    aside = cache.make_temp_dir(version_dir.parent, version_dir.name, prefix=".damaged-")
    os.rename(version_dir, aside / version_dir.name)
    print(f"mllm_kernel.runtime: warning: cached cubin {version_dir} is damaged ({problem}); moved it to {aside}, "
          "recompiling", file=sys.stderr, flush=True)  # fmt: skip


def build_cubin(text: str, source_path: Path | None = None, *, arch=None, options: Sequence[str] = (), cache_dir=None,
                compiler: str = "auto", verbose: bool = False, label: str = "kernel") -> Cubin:  # fmt: skip
    """The cubin of CUDA source `text` (read from `source_path`, if it came from a file) for
    `arch`: from the cache, else compiled into it."""
    options = [str(option) for option in options]
    archs = resolve_archs(arch)
    compiler = pick_compiler(compiler)
    include_dirs = _include_dirs(options, source_path)
    key = cubin_key(text, archs, options, compiler, include_dirs)
    root = Path(cache_dir).expanduser().resolve() if cache_dir is not None else config.cache_root()
    version_dir = root / CUBIN_DIR / key[:KEY_DIR_LEN]
    cubin_path = version_dir / CUBIN_FILE

    def cached() -> Cubin | None:
        if integrity.problem(cubin_path, integrity.read_record(cubin_path)) is not None:
            return None
        info = json.loads((version_dir / BUILD_FILE).read_text())
        if verbose:
            print(f"mllm_kernel.runtime: {label}: cached {cubin_path} (compiled by {info['compiler']})\n"
                  f"{resource_usage(info['log'])}", file=sys.stderr, flush=True)  # fmt: skip
        return Cubin(cubin_path.read_bytes(), cubin_path, key, info["compiler"], info["log"], True)

    found = cached()
    if found is not None:
        return found
    parent = cache.ensure_private_dir(version_dir.parent, root)
    with cache.file_lock(cache.lock_path_for(version_dir), f"cubin {label}"):
        found = cached()  # another process may have published it while we waited
        if found is not None:
            return found
        if version_dir.exists():
            _move_aside(version_dir, integrity.problem(cubin_path, integrity.read_record(cubin_path)) or "unreadable")
        cache.remove_abandoned_temp_dirs(parent, version_dir.name)
        temp_dir = cache.make_temp_dir(parent, version_dir.name)
        try:
            print(f"mllm_kernel.runtime: compiling {label} with {compiler} ...", file=sys.stderr, flush=True)
            start = time.monotonic()
            log, command = _compile(text, source_path, temp_dir, archs, options, compiler, include_dirs, verbose)
            elapsed = time.monotonic() - start
            print(f"mllm_kernel.runtime: compiled {label} in {elapsed:.1f}s", file=sys.stderr, flush=True)
            if verbose:
                print(resource_usage(log), file=sys.stderr, flush=True)
            build_info = {"compiler": compiler, "command": command, "log": log, "label": label,
                          "archs": [n for a in archs for n in a.names()], "seconds": round(elapsed, 3)}  # fmt: skip
            (temp_dir / BUILD_FILE).write_text(json.dumps(build_info, indent=1))
            integrity.write_record(temp_dir / CUBIN_FILE)
            cache.publish_dir(temp_dir, version_dir)
        except BaseException:
            shutil.rmtree(temp_dir, ignore_errors=True)
            raise
    image = cubin_path.read_bytes()
    return Cubin(image, cubin_path, key, compiler, log, False)

