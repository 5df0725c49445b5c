"""The prebuild is reproducible: the same modules built from two checkouts at different paths
(as two machines, or two Bazel sandboxes, would) are identical byte for byte, every file of the
tree (module.so, its integrity record, build.json, the wrapper, manifest.json and
compile_commands.json). A remote cache serves one machine's outputs to another only if this
holds. The build is the one Bazel runs (`python -m mllm_kernel.jit_utils.aot`), on one CPU module
and, where nvcc is found, one CUDA module (compiled for sm_90a; no GPU needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import mllm_kernel
except ImportError:  # run as a plain script from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import mllm_kernel

from mllm_kernel.jit_utils import config

PACKAGE = Path(mllm_kernel.__file__).resolve().parent
REPO = PACKAGE.parent
# A CPU module (Highway) and a CUDA one: the same specs the wheel prebuilds for add_constant.
SPECS_MODULE = """
from mllm_kernel.kernels import add_constant
SPECS = [add_constant._KERNELS[2].spec, add_constant.cuda_spec(1)]
"""


def nvcc_available() -> bool:
    try:
        return bool(config.nvcc_compiler())
    except (FileNotFoundError, RuntimeError):
        return False


def make_checkout(root: Path) -> Path:
    """A copy of what the build reads: the package, add_constant's folder, the headers."""
    root.mkdir(parents=True)
    shutil.copytree(PACKAGE, root / "mllm_kernel", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "kernels" / "add_constant", root / "kernels" / "add_constant",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(config.include_root(), root / "include")
    (root / "repro_specs.py").write_text(SPECS_MODULE)
    return root


def compiler_at(folder: Path) -> str:
    """A C++ compiler at `folder`: a script running the usual one (a copied binary would not
    find its own programs)."""
    folder.mkdir(parents=True)
    script = folder / "c++"
    script.write_text(f'#!/bin/sh\nexec {shutil.which(config.cxx_compiler())} "$@"\n')
    script.chmod(0o755)
    return str(script)


def prebuild(checkout: Path, devices: str, cxx: str | None = None) -> Path:
    out = checkout / "prebuilt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLLM_KERNEL_PREBUILT", "MLLM_KERNEL_INCLUDE"))}
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), *sys.path])  # the copy's mllm_kernel first
    # Bazel gives these relative to the test's directory; the build runs in the copy.
    env.pop("MLLM_KERNEL_HIGHWAY_HEADER", None)
    env["MLLM_KERNEL_HIGHWAY_ROOT"] = str(config.highway_root())
    if "cuda" in devices:
        env["MLLM_KERNEL_NVCC"] = config.nvcc_compiler()
    if cxx:
        env["CXX"] = cxx
    command = [sys.executable, "-m", "mllm_kernel.jit_utils.aot", "--out", str(out), "--devices", devices,
               "--archs", "sm_90a", "--module", "repro_specs"]  # fmt: skip
    result = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"prebuild in {checkout} failed:\n{result.stderr}{result.stdout}"
    return out


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_prebuild_is_identical_from_two_paths(tmp_path):
    devices = "cpu,cuda" if nvcc_available() else "cpu"
    # Different depths and names: path lengths differ too, so no offset can line up by chance.
    # Each build's C++ compiler is the same wrapper script at its own path, as a hermetic
    # toolchain sits in each Bazel output base: keys name compilers by content and version, not
    # by place.
    first = prebuild(make_checkout(tmp_path / "a"), devices, cxx=compiler_at(tmp_path / "a-tools"))
    second_root = tmp_path / "second" / "deeper"
    second = prebuild(make_checkout(second_root / "checkout"), devices, cxx=compiler_at(second_root / "tools"))
    a, b = tree(first), tree(second)
    assert sorted(a) == sorted(b), f"the trees hold different files: {sorted(set(a) ^ set(b))}"
    modules = [name for name in a if name.endswith("module.so")]
    assert len(modules) == len(devices.split(",")), modules
    differing = [name for name in a if a[name] != b[name]]
    assert not differing, f"built from two paths, these files differ: {differing}"
    # Nothing records where the checkouts, tvm-ffi or the compiler live (another machine or
    # Bazel sandbox has them elsewhere: equal here, they would differ there).
    places = [str(tmp_path), str(config.tvm_ffi_paths()[1].parent), str(config.highway_root())]
    if "cuda" in devices:
        places.append(os.path.dirname(config.nvcc_compiler()))
    for name, data in a.items():
        if name == "compile_commands.json":  # clangd's input: absolute paths outside the tree by design
            continue
        for place in places:
            if place.encode() in data:  # not an assert: pytest would print the whole file
                pytest.fail(f"{name} records the location {place}")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
