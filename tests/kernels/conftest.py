"""Shared setup of the kernel tests (tests/kernels/test_<op>.py tests the op package <op>).

Every SIMD target: Highway compiles each CPU kernel for several instruction sets and dispatches
to the best one this CPU has, so a test that only runs the dispatched target never runs the
others. Each CPU test here runs once per target that the op's CPU module has and this CPU
supports (test ids end in [simd=AVX2] etc.; the header of the run lists them): the `simd_target`
fixture restricts the module's dispatch to that target around the test. Tests marked as needing
a GPU are not multiplied.
"""

from __future__ import annotations

import os
import sys

import pytest

_SIMD_ENV = "MLLM_KERNEL_TEST_SIMD_TARGETS"  # e.g. "AVX2,SSE4": run only these (default: all)


def _op(module_name: str) -> str:
    return module_name.rsplit(".", 1)[-1].removeprefix("test_")


def _cpu_module(op: str):
    from mllm_kernel import kernels

    return kernels.package(op)._modules["cpu"]


_targets_cache: dict[str, list[tuple[str, int]]] = {}


def simd_targets(op: str) -> list[tuple[str, int]]:
    """(name, bit) of each target the op's CPU module can run here, best first."""
    if op not in _targets_cache:
        module = _cpu_module(op)
        mask = module.mllm_simd_targets()
        bits = [1 << i for i in range(63) if mask & (1 << i)]
        wanted = {t.strip() for t in os.environ.get(_SIMD_ENV, "").split(",") if t.strip()}
        found = [(str(module.mllm_simd_target_name(bit)), bit) for bit in bits]
        _targets_cache[op] = [t for t in found if not wanted or t[0] in wanted]
    return _targets_cache[op]


def _needs_gpu(item_or_definition) -> bool:
    for mark in item_or_definition.iter_markers("skipif"):
        if "CUDA" in str(mark.kwargs.get("reason", "")) or "GPU" in str(mark.kwargs.get("reason", "")):
            return True
    return False


def pytest_generate_tests(metafunc):
    if "simd_target" not in metafunc.fixturenames:
        return
    op = _op(metafunc.module.__name__)
    targets = [None] if _needs_gpu(metafunc.definition) else simd_targets(op)
    ids = ["simd=default" if t is None else f"simd={t[0]}" for t in targets]
    metafunc.parametrize("simd_target", targets, ids=ids, indirect=True)


@pytest.fixture(autouse=True)
def simd_target(request):
    """Restrict the op's CPU module to one SIMD target for the test (None: leave it alone)."""
    target = getattr(request, "param", None)
    if target is None:
        yield None
        return
    module = _cpu_module(_op(request.module.__name__))
    module.mllm_set_simd_targets(target[1])
    try:
        yield target[0]
    finally:
        module.mllm_set_simd_targets(0)


def pytest_report_header(config):
    lines = []
    for arg in config.args:
        name = os.path.basename(str(arg)).removesuffix(".py")
        if name.startswith("test_"):
            try:
                lines.append(f"{name}: CPU tests run on SIMD targets {', '.join(t for t, _ in simd_targets(_op(name)))}")
            except Exception as error:  # noqa: BLE001 - a header must not break collection
                lines.append(f"{name}: SIMD targets unknown ({type(error).__name__}: {error})")
    return lines


