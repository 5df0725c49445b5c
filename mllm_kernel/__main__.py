"""python -m mllm_kernel show-env | show-config | show-clangd-recommend-config [--output PATH] [--force]

show-env: the environment report (as `bazel run //tools:show_env`, without the Bazel-only rows).
show-config: that report, the runtime's configuration, and every kernel module this process
  knows of (registered by the wrappers, declared in the op packages' SPECS, or listed
  in a prebuilt manifest) with its status here: prebuilt, jit-cached or not built.
show-clangd-recommend-config: write a .clangd with the include paths and flags our kernels need.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_CUDA_ARCH = "sm_90"


# ---------------------------------------------------------------------------------- show-env


def _env_rows(hermetic_nvcc: str | None = None, simd_target: str | None = None) -> list[tuple[str, str]]:
    from mllm_kernel import env_info

    return env_info.collect(hermetic_nvcc=hermetic_nvcc, simd_target=simd_target)


def show_env(args: argparse.Namespace) -> int:
    from mllm_kernel import env_info

    print(env_info.format_rows(_env_rows()))
    return 0


# ---------------------------------------------------------------------------------- show-config


def _kernel_modules() -> list[str]:
    """mllm_kernel.kernels.<op> for every op package in the registry."""
    import mllm_kernel.kernels as kernels

    return [f"mllm_kernel.kernels.{name}" for name in kernels.names()]


def collect_specs() -> tuple[list, list[str]]:
    """(specs, problems): every JitSpec the wrappers declare, deduplicated by display name."""
    from mllm_kernel.jit_utils import JitSpec, registered_specs

    problems: list[str] = []
    declared: list = []
    for module_name in ["mllm_kernel.cpu.jit", "mllm_kernel.cuda.jit"] + _kernel_modules():
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # one broken kernel must not hide the others
            problems.append(f"cannot import {module_name}: {type(error).__name__}: {error}")
            continue
        specs = getattr(module, "SPECS", ())
        declared += list(specs.values()) if isinstance(specs, dict) else list(specs)
    by_name: dict[str, JitSpec] = {}
    for spec in registered_specs() + declared:
        if isinstance(spec, JitSpec):
            by_name.setdefault(spec.display_name, spec)
    return list(by_name.values()), problems


def _try(fn) -> str:
    try:
        value = fn()
    except Exception as error:
        return f"unavailable ({type(error).__name__}: {error})"
    return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _config_rows() -> list[tuple[str, str]]:
    from mllm_kernel.jit_utils import compile, config

    return [
        ("JIT cache", _try(config.cache_root)),
        ("JIT disabled", str(config.is_jit_disabled())),
        ("kernel source roots", _try(config.source_roots)),
        ("include root", _try(config.include_root)),
        ("Highway root", _try(config.highway_root)),
        ("prebuilt manifests", _try(config.prebuilt_manifests) or "none"),
        ("C++ compiler", _try(config.cxx_compiler)),
        ("nvcc", _try(config.nvcc_compiler)),
        ("CUDA archs (JIT)", _try(lambda: [n for a in compile.cuda_arch_list() for n in a.names()])),
    ]


def _status(spec) -> str:
    try:
        return spec.status()
    except Exception as error:  # no compiler, no GPU to choose archs for, no Highway, ...
        return f"unknown: {type(error).__name__}: {error}"


def show_config(args: argparse.Namespace, hermetic_nvcc: str | None = None, simd_target: str | None = None) -> int:
    from mllm_kernel import env_info
    from mllm_kernel.jit_utils import prebuilt

    print("Environment")
    print(env_info.format_rows(_env_rows(hermetic_nvcc, simd_target)))
    print()
    print("Runtime configuration")
    print(env_info.format_rows(_config_rows()))
    print()

    specs, problems = collect_specs()
    rows: dict[str, list[tuple[str, str]]] = {}
    for spec in specs:
        rows.setdefault(spec.device, []).append((spec.display_name, _status(spec)))
    # Manifest entries no wrapper declares: listed, but their source key cannot be checked here.
    known = {spec.display_name for spec in specs}
    try:
        manifest_entries = prebuilt.entries()
    except Exception as error:
        manifest_entries = []
        problems.append(f"cannot read the prebuilt manifests: {type(error).__name__}: {error}")
    for entry in manifest_entries:
        if entry["display_name"] not in known:
            known.add(entry["display_name"])
            rows.setdefault(entry.get("device", "?"), []).append(
                (entry["display_name"], f"in a prebuilt manifest ({entry['path']}); no wrapper declares it"))

    print(f"Kernels ({sum(map(len, rows.values()))} modules; status on this machine)")
    for device in sorted(rows):
        print(f"{device}:")
        width = max(len(name) for name, _ in rows[device])
        # Natural order: cpu_add_constant_2 before cpu_add_constant_16.
        for name, status in sorted(rows[device], key=lambda row: [int(t) if t.isdigit() else t
                                                                   for t in re.split(r"(\d+)", row[0])]):
            print(f"  {name:<{width}}  {status}")
    for problem in problems:
        print(f"warning: {problem}")
    return 0


# ---------------------------------------------------------------------- show-clangd-recommend-config


def _gpu_arch() -> tuple[str, str | None]:
    """(--cuda-gpu-arch value, note): the first GPU's compute capability, else a default."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout
            caps = [line.strip() for line in out.splitlines() if line.strip()]
            if caps:
                return "sm_" + caps[0].replace(".", ""), None
        except (OSError, subprocess.TimeoutExpired):
            pass
        return DEFAULT_CUDA_ARCH, f"nvidia-smi reported no GPU; using the default {DEFAULT_CUDA_ARCH}"
    return DEFAULT_CUDA_ARCH, f"no nvidia-smi on PATH; using the default {DEFAULT_CUDA_ARCH}"


def _cuda_path() -> tuple[str | None, str | None]:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var], None
    nvcc = shutil.which("nvcc")
    if nvcc:
        return str(Path(nvcc).parent.parent), None
    return None, "no CUDA_HOME / CUDA_PATH and no nvcc on PATH: --cuda-path omitted (clang searches its defaults)"


def _include_paths() -> tuple[list[str], list[str]]:
    from mllm_kernel.jit_utils import config

    paths: list[Path] = []
    notes: list[str] = []
    try:
        tvm_includes, _ = config.tvm_ffi_paths()
        paths += tvm_includes
    except Exception as error:
        notes.append(f"tvm-ffi headers not found ({error})")
    try:
        paths.append(config.highway_root())
    except FileNotFoundError as error:
        notes.append(f"Highway not found, its include path is left out ({error})")
    try:
        paths.append(config.include_root())
    except FileNotFoundError as error:
        notes.append(f"mllm_kernel headers not found ({error})")
    import mllm_kernel.kernels as kernels

    # The op folders (each op includes "<op>.hpp" from beside it): $MLLM_KERNEL_SOURCE_ROOT's
    # (tools/clangd_config.py points it at the workspace), else the kernels package's.
    configured = os.environ.get(config.ENV_SOURCE_ROOT)
    roots = [Path(configured)] if configured else [Path(p) for p in kernels.__path__]
    ops = [p for root in roots if root.is_dir() for p in sorted(root.iterdir()) if (p / "__init__.py").is_file()]
    if not ops:
        notes.append(f"kernel folders not found under {[str(r) for r in roots]}")
    paths += ops
    return [str(p) for p in dict.fromkeys(paths)], notes


def render_clangd_config() -> str:
    includes, notes = _include_paths()
    arch, arch_note = _gpu_arch()
    cuda_path, cuda_note = _cuda_path()
    notes += [n for n in (arch_note, cuda_note) if n]

    lines = ["# Generated by `python -m mllm_kernel show-clangd-recommend-config`."]
    lines += [f"# note: {note}" for note in notes]
    lines += ["CompileFlags:", "  Add:", "    - -std=c++20"]
    lines += [f"    - {json.dumps('-I' + path)}" for path in includes]
    cuda_flags = ["-xcuda", f"--cuda-gpu-arch={arch}", "-nocudalib", "--no-cuda-version-check"]
    if cuda_path:
        cuda_flags.append(f"--cuda-path={cuda_path}")
    lines += ["---", "If:", r"  PathMatch: .*\.(cu|cuh)", "CompileFlags:", "  Add:"]
    lines += [f"    - {json.dumps(flag)}" for flag in cuda_flags]
    return "\n".join(lines) + "\n"


def show_clangd_recommend_config(args: argparse.Namespace) -> int:
    output = Path(args.output) if args.output else Path.cwd()
    target = output / ".clangd" if output.is_dir() else output
    if target.exists() and not args.force:
        print(f"error: {target} already exists; not overwriting it (remove it, or pass --force)", file=sys.stderr)
        return 1
    text = render_clangd_config()
    target.write_text(text)
    print(f"wrote {target}")
    print(text, end="")
    return 0


# ---------------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mllm_kernel", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("show-env", help="the environment report").set_defaults(run=show_env)
    commands.add_parser("show-config", help="environment, runtime configuration, kernels and their status"
                        ).set_defaults(run=show_config)
    clangd = commands.add_parser("show-clangd-recommend-config", help="write a .clangd for this machine")
    clangd.add_argument("--output", help="directory to write .clangd into, or the file itself (default: .)")
    # Refusing is the default; --force-no spells it out, --force overwrites.
    clangd.add_argument("--force", action="store_true", help="overwrite an existing .clangd")
    clangd.add_argument("--force-no", "--no-force", dest="force", action="store_false", help="never overwrite (default)")
    clangd.set_defaults(run=show_clangd_recommend_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
