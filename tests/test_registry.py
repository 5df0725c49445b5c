"""The op registry (mllm_kernel.kernels) against Bazel's list of kernels and the public API."""

import glob
import os
import re

import pytest

import mllm_kernel as mk
from mllm_kernel import kernels


def bazel_kernels() -> list[str]:
    text = open(os.environ["KERNELS_LIST_BZL"]).read()
    body = re.search(r"KERNELS\s*=\s*\[(.*?)\]", text, re.S).group(1)
    return sorted(re.findall(r'"([a-z0-9_]+)"', body))


def test_bazel_list_and_registry_agree():
    assert bazel_kernels() == kernels.names(), (
        "tools/kernels_list.bzl and the op packages under kernels/ disagree: add the new op's folder "
        "name to KERNELS (or remove a stale one)"
    )


def test_every_op_package_declares_exports_specs_and_cases():
    for name in kernels.names():
        package = kernels.package(name)
        assert isinstance(package.EXPORTS, tuple), name
        assert package.SPECS, name
        for export in package.EXPORTS:
            assert callable(getattr(package, export)), (name, export)
        if package.EXPORTS:  # ops with public functions have references, checks and benchmarks
            cases = kernels.cases(name)
            assert cases is not None and callable(cases.check) and callable(cases.benchmark_cases), name


def test_top_level_exports_come_from_the_registry():
    assert set(mk.__all__) == {"__version__", *kernels.exports()}
    for export, package in kernels.exports().items():
        assert getattr(mk, export) is getattr(kernels.package(package), export)
    with pytest.raises(AttributeError):
        mk.no_such_op  # noqa: B018


def test_every_test_file_runs_pytest_as_a_script():
    """Bazel runs a py_test file as a script: without a pytest.main call at the bottom it defines
    its tests, runs none, and passes."""
    here = os.path.dirname(os.path.abspath(__file__))
    files = glob.glob(os.path.join(here, "**", "test_*.py"), recursive=True)
    assert len(files) > 10, files
    silent = [f for f in files if "pytest.main(" not in open(f, encoding="utf-8").read()]
    assert not silent, f"test files that would pass under Bazel without running a test: {silent}"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
