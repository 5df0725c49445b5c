"""Ahead-of-time builds:
`python -m mllm_kernel.jit_utils.aot --out DIR [--archs ...] [--devices ...] --module M [--module M2 ...] [--attr SPECS]`.

Bazel runs this for each kernel (tools/kernel.bzl). From each Python module M it takes the
attribute named by --attr (default SPECS), by name (nothing is evaluated): a JitSpec, or a list /
tuple / dict (its values) of them. Every spec is built with the runtime's own build code into DIR
(laid out like the JIT cache, same keys), and DIR gets a manifest.json (see prebuilt.py, with
each module's size and sha256) and compile_commands.json entries for each kernel source.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from . import compile, prebuilt
from .spec import JitSpec, resolve_source


def resolve_specs(module_name: str, attr: str = "SPECS") -> list[JitSpec]:
    """The JitSpecs that attribute `attr` of Python module `module_name` holds."""
    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        raise AttributeError(f"aot: module {module_name} has no attribute {attr!r}")
    value = getattr(module, attr)
    values: Iterable = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
    specs = list(values)
    for spec in specs:
        if not isinstance(spec, JitSpec):
            raise TypeError(f"aot: {module_name}.{attr} holds a {type(spec).__name__}, not a JitSpec")
    return specs


def _relative(arg: str, base: str) -> str:
    """Paths under the build's working directory become relative to it (compile_commands)."""
    for prefix in ("-I", ""):
        if arg.startswith(prefix) and arg[len(prefix):].startswith(base + os.sep):
            return prefix + os.path.relpath(arg[len(prefix):], base)
    return arg


def source_commands(spec: JitSpec, location, base: str) -> list[dict]:
    """One compile_commands entry per kernel source, with the flags its wrapper compiled with."""
    entries = []
    include_flags = [f"-I{p}" for p in spec.include_paths(with_toolkit=False)]
    flags = spec.flags(location.archs)
    for name in spec.cpp_files + spec.cuda_files:
        source = str(resolve_source(name))
        if name in spec.cuda_files:
            # clangd understands clang's CUDA mode, not nvcc's flags.
            archs = [f"--cuda-gpu-arch={n}" for a in location.archs for n in a.names() if n.startswith("sm_")]
            args = ["clang++", "-x", "cuda", "-std=c++20", "-nocudainc", "-nocudalib", *archs, *include_flags]
        else:
            args = ["c++", *flags["cflags"], *include_flags]
        args += ["-c", source]
        entries.append({"file": _relative(source, base), "arguments": [_relative(a, base) for a in args]})
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="the prebuilt tree to write")
    parser.add_argument("--archs", default="", help="CUDA targets, e.g. sm_80,sm_90a,compute_90")
    parser.add_argument("--devices", default="cpu,cuda", help="which devices' modules to build")
    parser.add_argument("--module", action="append", default=[], dest="modules",
                        help="Python module holding the specs (repeatable)")
    parser.add_argument("--attr", default="SPECS", help="attribute of each module holding the specs")
    args = parser.parse_args(argv)

    devices = set(filter(None, args.devices.split(",")))
    archs = compile.parse_cuda_arch_list(args.archs) if args.archs else []
    args.out.mkdir(parents=True, exist_ok=True)
    base = os.getcwd()
    entries, commands = [], []
    for module_name in args.modules:
        for spec in resolve_specs(module_name, args.attr):
            if spec.device not in devices:
                continue
            if spec.device == "cuda" and not archs:
                raise SystemExit(f"aot: {spec.display_name} is a CUDA module but --archs is empty")
            location = spec.location(root=args.out.resolve(), archs=archs if spec.device == "cuda" else ())
            spec.build(location, serialized_wgmma="error")
            entries.append(prebuilt.manifest_entry(spec, location))
            commands += source_commands(spec, location, base)
    prebuilt.write_manifest(args.out, entries)
    (args.out / "compile_commands.json").write_text(json.dumps(commands, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
