"""The kernel packages and the registry of ops.

Each folder kernels/<op>/ of the repository is the package `mllm_kernel.kernels.<op>`. This is the
one place where the checkout and the wheel meet: the wheel ships the folders inside this package
(mllm_kernel/kernels/<op>/), while in a checkout (and in Bazel's runfiles, which mirror it) they
stay at <repo>/kernels/<op>/, which joins this package's search path below. Nothing else maps
paths: an op package finds its C++ and CUDA sources beside its own __init__.py.

An op package declares
  EXPORTS   the public functions it adds to `mllm_kernel` (names of module attributes),
  SPECS     its modules, {"cpu": JitSpec, "cuda": JitSpec} (built ahead of time by Bazel),
and has a module `cases` with
  the float64 torch references of its ops (shared by tests, the report and the benchmarks),
  check(checks)            the report's checks (mllm_kernel.kernels.checks.Checks),
  benchmark_cases(device)  the cases of benchmarks/bench_ops.py.
The top-level exports, the report and the benchmarks iterate over this registry; Bazel's list
(tools/kernels_list.bzl) is checked against it by tests/test_registry.py.
"""

from __future__ import annotations

import os
from importlib import import_module
from types import ModuleType

_checkout_kernels = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "kernels")
if os.path.isdir(_checkout_kernels) and _checkout_kernels not in __path__:
    __path__.append(_checkout_kernels)

_exports: dict[str, str] | None = None


def names() -> list[str]:
    """The op packages on this package's path (folders with an __init__.py), sorted."""
    found = []
    for root in __path__:
        if os.path.isdir(root):
            found += [n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "__init__.py"))]
    return sorted(set(found))


def package(name: str) -> ModuleType:
    return import_module(f"{__name__}.{name}")


def cases(name: str) -> ModuleType | None:
    """The op package's `cases` module (references, checks, benchmark cases), if it has one."""
    folder = os.path.dirname(package(name).__file__)
    return import_module(f"{__name__}.{name}.cases") if os.path.isfile(os.path.join(folder, "cases.py")) else None


def exports() -> dict[str, str]:
    """{public name: op package} of every op package's EXPORTS (imports them all once)."""
    global _exports
    if _exports is None:
        table: dict[str, str] = {}
        for name in names():
            for export in getattr(package(name), "EXPORTS", ()):
                if export in table:
                    raise RuntimeError(f"mllm_kernel: {export!r} is exported by both {table[export]} and {name}")
                table[export] = name
        _exports = table
    return _exports
