"""Building, publishing, verifying and loading a JitSpec's module.

build(): compile in a private temp directory, record size + sha256 there, publish with an atomic
rename (cache.py). load(): a verified prebuilt module, else a verified JIT-cache entry, else
build. A damaged JIT-cache entry is renamed aside (kept for inspection) and rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import cache, compile, config, integrity, prebuilt
from .spec import MODULE_FILE, ModuleLocation, render_wrapper, resolve_source

if TYPE_CHECKING:
    from .spec import JitSpec

DAMAGED_PREFIX = ".damaged-"

_loaded_modules: dict[Path, Any] = {}
_loaded_lock = threading.Lock()


def cache_problem(location: ModuleLocation) -> str | None:
    """None when the JIT-cache entry at `location` is complete and intact, else why not."""
    if not location.module_path.is_file():
        return "it is missing"
    return integrity.problem(location.module_path, integrity.read_record(location.module_path))


def _move_aside(location: ModuleLocation, problem: str) -> None:
    """Rename a damaged version directory out of the way (not deleted: a process may have the
    module mapped, and the file may tell what went wrong). Call with the module's lock held."""
    aside = cache.make_temp_dir(location.module_dir.parent, location.module_dir.name, prefix=DAMAGED_PREFIX)
    os.rename(location.module_dir, aside / location.module_dir.name)
    print(
        f"mllm_kernel: warning: cached module {location.module_dir.parent.name} at {location.module_path} "
        f"is damaged ({problem}); moved it to {aside} and rebuilding",
        file=sys.stderr,
        flush=True,
    )


def build(spec: JitSpec, location: ModuleLocation | None = None, *, serialized_wgmma: str = "warn") -> Path:
    """Compile into the cache (or a prebuilt tree) unless an intact module is there already;
    return the module path. serialized_wgmma: "error" or "warn" (check_wgmma_pipeline).

    Safe against concurrent builders (flock + double check) and against builders that die
    midway (private temp dir, atomic rename)."""
    if serialized_wgmma not in ("error", "warn"):
        raise ValueError(f"mllm_kernel: serialized_wgmma must be 'error' or 'warn', got {serialized_wgmma!r}")
    location = location or spec.location()
    if cache_problem(location) is None:
        return location.module_path
    parent = cache.ensure_private_dir(location.module_dir.parent, location.root)
    tag = location.module_dir.name
    with cache.file_lock(location.lock_path, spec.display_name):
        problem = cache_problem(location)  # another process may have published while we waited
        if problem is None:
            return location.module_path
        if location.module_dir.exists():
            _move_aside(location, problem)
        cache.remove_abandoned_temp_dirs(parent, tag)
        temp_dir = cache.make_temp_dir(parent, tag)
        try:
            _compile_into(spec, temp_dir, location, serialized_wgmma)
            integrity.write_record(temp_dir / MODULE_FILE)
            cache.publish_dir(temp_dir, location.module_dir)
        except BaseException:
            shutil.rmtree(temp_dir, ignore_errors=True)
            raise
    return location.module_path


def path_names(build_dir: Path, include_paths: list[Path], tvm_lib_dir: Path,
               compilers: dict[str, str]) -> list[tuple[str, str]]:  # fmt: skip
    """(path, fixed name) for every folder whose location could reach a module or its build.json:
    the build directory is ".", include path i is "include<i>-<its name>", tvm-ffi's library
    folder "tvm_ffi-lib", a compiler's folder "<cxx or nvcc>-bin". A folder inside another comes
    after it; otherwise the order is the names', so that it does not depend on where they are."""
    names = {str(build_dir): "."} | {str(path): f"include{i}-{path.name}" for i, path in enumerate(include_paths)}
    names[str(tvm_lib_dir)] = "tvm_ffi-lib"
    for role, compiler in sorted(compilers.items()):
        if os.path.isabs(compiler):
            names[os.path.dirname(compiler)] = f"{role}-bin"

    def depth(path: str) -> int:  # how many of the other folders hold this one
        return sum(1 for other in names if other != path and Path(path).is_relative_to(other))

    return sorted(names.items(), key=lambda item: (depth(item[0]), item[1]))


def reproducible_flags(names: list[tuple[str, str]], seed: str) -> list[str]:
    """Host-compiler flags that make a module's bytes independent of where its files live, so two
    checkouts (or Bazel sandboxes) build identical modules: every path the compiler may record
    (__FILE__ in headers' error messages) becomes its fixed name (GCC applies the last matching
    map: inner folders come last), and the names gcc would randomize are seeded
    from the module's key."""
    return [*(f"-ffile-prefix-map={path}={name}" for path, name in names), f"-frandom-seed={seed}"]


def _portable(value: Any, names: list[tuple[str, str]]) -> Any:
    """build.json's strings with the same fixed names (inner folders first), so it is as
    reproducible as the module."""
    if isinstance(value, str):
        for path, name in reversed(names):
            value = value.replace(path, name)
        return value
    if isinstance(value, dict):
        return {k: _portable(v, names) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_portable(v, names) for v in value]
    return value


def _wrapper_includes(files: list[str], include_paths: list[Path]) -> list[str]:
    """How the wrapper names its sources: by basename where that finds the same file through the
    include path (the source key hashes basenames too), else by absolute path."""
    sources = [resolve_source(f) for f in files]

    def found(name: str) -> Path | None:
        return next((path / name for path in include_paths if (path / name).is_file()), None)

    if all(found(source.name) == source for source in sources):
        return [source.name for source in sources]
    return [str(source) for source in sources]


def check_wgmma_pipeline(spec: JitSpec, outputs: list[str], serialized_wgmma: str) -> None:
    """ptxas's serialized-wgmma reports in the compile outputs: an error when `serialized_wgmma`
    is "error" (ahead-of-time builds: a prebuilt module must not ship 20-40% slow), else a
    warning (a JIT build with another nvcc still gives a correct module)."""
    reports = [report for output in outputs for report in compile.serialized_wgmma(output)]
    if not reports:
        return
    message = (f"mllm_kernel: {spec.display_name}: ptxas serialized the wgmma pipeline "
               f"(correct, but slow; benchmarks/TUNING.md):\n  " + "\n  ".join(reports))
    if serialized_wgmma == "error":
        raise RuntimeError(message)
    print(f"{message}\nmllm_kernel: warning: the module was built anyway", file=sys.stderr, flush=True)


def _compile_into(spec: JitSpec, build_dir: Path, location: ModuleLocation, serialized_wgmma: str) -> None:
    compilers = spec.compilers()
    cxx = compilers["cxx"]
    nvcc = compilers.get("nvcc")
    flags = spec.flags(location.archs)
    include_paths = spec.include_paths()
    _, tvm_lib = config.tvm_ffi_paths()
    names = path_names(build_dir, include_paths, tvm_lib.parent, compilers)
    host_flags = reproducible_flags(names, location.key[:16])
    cflags = [*flags["cflags"], *host_flags]

    # Commands run in build_dir and name its files relatively: no temp-dir name reaches the output.
    compile_commands: list[list[str]] = []
    objects: list[Path] = []
    for unit in spec.wrapper_units():
        wrapper = Path(f"wrapper{unit.suffix}")
        text = render_wrapper(_wrapper_includes(unit.files, include_paths), unit.exports, unit.simd_exports)
        (build_dir / wrapper).write_text(text)
        obj = Path(f"wrapper{unit.suffix}.o")
        if unit.suffix == ".cu":
            cuda_cflags = [*flags["cuda_cflags"], *(f"-Xcompiler={flag}" for flag in host_flags)]
            command = compile.nvcc_compile_command(nvcc, cxx, wrapper, obj, include_paths, cuda_cflags)
        else:
            command = compile.cxx_compile_command(cxx, wrapper, obj, include_paths, cflags)
        compile_commands.append(command)
        objects.append(obj)
    for index, source in enumerate(spec.extra_sources()):
        obj = Path(f"extra{index}_{source.stem}.o")
        compile_commands.append(compile.cxx_compile_command(cxx, source, obj, include_paths, cflags))
        objects.append(obj)

    output = Path(MODULE_FILE)
    if spec.device == "cuda":
        link_command = compile.nvcc_link_command(nvcc, cxx, objects, output, tvm_lib, flags["ldflags"])
    else:
        link_command = compile.cxx_link_command(cxx, objects, output, tvm_lib, flags["ldflags"])

    print(f"mllm_kernel: compiling {spec.display_name} ...", file=sys.stderr, flush=True)
    start = time.monotonic()
    try:
        outputs = compile.run_build(compile_commands, link_command, spec.display_name, build_dir)
        check_wgmma_pipeline(spec, outputs, serialized_wgmma)
    except BaseException:
        elapsed = time.monotonic() - start
        print(f"mllm_kernel: building {spec.display_name} failed after {elapsed:.1f}s", file=sys.stderr, flush=True)
        raise
    for obj in objects:
        (build_dir / obj).unlink(missing_ok=True)  # keep the cache small; wrappers + build.json stay for debugging
    commands = [[str(arg) for arg in command] for command in compile_commands + [link_command]]
    build_info = _portable({"spec": asdict(spec), "key": location.key, "commands": commands}, names)
    (build_dir / "build.json").write_text(json.dumps(build_info, indent=2))
    elapsed = time.monotonic() - start
    print(f"mllm_kernel: compiled {spec.display_name} in {elapsed:.1f}s", file=sys.stderr, flush=True)


def _not_available(spec: JitSpec, source_key: str, location: ModuleLocation | None, why: list[str]) -> RuntimeError:
    where = f", expected at {location.module_path}" if location else ""
    details = f" Found but not usable: {'; '.join(why)}." if why else ""
    return RuntimeError(
        f"mllm_kernel: module {spec.display_name} is neither prebuilt nor in the JIT cache, "
        f"and {config.ENV_DISABLE_JIT}=1 forbids compiling it (source key {source_key}{where}).{details} "
        f"Prebuild it: add it to its kernel's `prebuild` list and rebuild the wheel (bazel build //:wheel), "
        f"or run once without {config.ENV_DISABLE_JIT} using the same {config.ENV_CACHE_DIR}."
    )


def module_file(spec: JitSpec) -> Path:
    """The verified module file to load: prebuilt if its source key matches, else the JIT
    cache's, compiling it first unless MLLM_KERNEL_DISABLE_JIT is set."""
    source_key = spec.source_key()
    why: list[str] = []
    path = prebuilt.find_prebuilt(spec.display_name, spec.device, source_key, damaged=why)
    if path is not None:
        return path
    try:
        location = spec.location(source_key=source_key)
    except (FileNotFoundError, RuntimeError) as error:  # no compiler / no GPU to target here
        if not config.is_jit_disabled():
            raise
        raise _not_available(spec, source_key, None, why + [f"the JIT cache cannot be consulted either: {error}"])
    if not config.is_jit_disabled():
        return build(spec, location)
    problem = cache_problem(location)
    if problem is None:
        return location.module_path
    if problem != "it is missing":
        why.append(f"the JIT cache's module {location.module_path} is damaged: {problem}")
    raise _not_available(spec, source_key, location, why)


def load(spec: JitSpec) -> Any:
    """The loaded tvm_ffi Module of `spec` (once per module file and process)."""
    path = module_file(spec)
    with _loaded_lock:
        module = _loaded_modules.get(path)
        if module is None:
            import tvm_ffi

            module = _loaded_modules[path] = tvm_ffi.load_module(str(path))
    return module


def status(spec: JitSpec) -> str:
    """'prebuilt', 'jit-cached' or 'not built' on this machine (a damaged module is not built)."""
    source_key = spec.source_key()
    if prebuilt.find_prebuilt(spec.display_name, spec.device, source_key) is not None:
        return "prebuilt"
    if cache_problem(spec.location(source_key=source_key)) is None:
        return "jit-cached"
    return "not built"
