"""A damaged module.so (truncated by a full disk, a partial copy, overwritten) must never be
loaded: dlopen maps it and the first touch of a missing page kills the process with SIGBUS.

Each case damages a copy of one good build, in the JIT cache or in a prebuilt tree, and loads it
in a child process, so that a crash is a test failure rather than a dead test run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:
    import mllm_kernel
except ImportError:  # run as a plain script from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import mllm_kernel

from mllm_kernel.jit_utils import JitSpec, make_spec

PACKAGE_PARENT = str(Path(mllm_kernel.__file__).resolve().parents[1])
TIMEOUT_S = 600

KERNEL = """\
#include <cstdint>
namespace demo {
template <int N>
int64_t add_n(int64_t x) { return x + N; }
}  // namespace demo
"""

# Loads the spec and calls add_n(10); a RuntimeError is printed, anything else fails.
CHILD = """\
import ast, sys
from mllm_kernel.jit_utils import JitSpec, filememo
filememo.RACY_S = 0.0  # memoize even these fresh files: the memo must not hide damage either
spec = JitSpec(**ast.literal_eval(sys.argv[1]))
try:
    print("result", spec.load().add_n(10), flush=True)
except RuntimeError as error:
    print("error", error, flush=True)
"""

SPECS_MODULE = """\
import ast
from mllm_kernel.jit_utils import JitSpec
SPECS = {{"cpu": JitSpec(**ast.literal_eval({fields!r}))}}
"""


def damage(path: Path, how: str) -> None:
    size = path.stat().st_size
    time.sleep(0.05)  # a new timestamp tick, as any real damage would come later
    if how == "half":
        os.truncate(path, size // 2)
    elif how == "4k":
        os.truncate(path, 4096)
    else:  # garbage of the same size, in place (same inode)
        with open(path, "r+b") as file:
            file.write(os.urandom(size))
    assert path.read_bytes()[:4] != b"\x7fELF" or how != "garbage"


def child_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLLM_KERNEL_DISABLE_JIT", "MLLM_KERNEL_PREBUILT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_PARENT, env.get("PYTHONPATH")]))
    env["MLLM_KERNEL_CACHE_DIR"] = str(cache)
    env.update(extra)
    return env


def load_in_child(spec: JitSpec, cache: Path, **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, repr(dataclasses.asdict(spec))],
        env=child_env(cache, **env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, f"the child died (exit code {result.returncode}):\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """(spec, prebuilt tree) built once by the aot tool; the JIT cases copy its module folder,
    which is laid out like the JIT cache with the same key."""
    work = tmp_path_factory.mktemp("pristine")
    (work / "kernel.hpp").write_text(KERNEL)
    spec = make_spec("damage_demo", "cpu", (3,), cpp_files=[work / "kernel.hpp"], cpp_wrappers=[("add_n", "demo::add_n<3>")])
    (work / "demo_specs.py").write_text(SPECS_MODULE.format(fields=repr(dataclasses.asdict(spec))))
    tree = work / "tree"
    env = child_env(work / "unused_cache")
    env["PYTHONPATH"] = os.pathsep.join([str(work), env["PYTHONPATH"]])
    command = [sys.executable, "-m", "mllm_kernel.jit_utils.aot", "--out", str(tree), "--devices", "cpu",
               "--module", "demo_specs", "--attr", "SPECS"]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    (entry,) = json.loads((tree / "manifest.json").read_text())["modules"]
    module = tree / entry["path"]
    assert entry["size"] == module.stat().st_size and len(entry["sha256"]) == 64
    return spec, tree, module.relative_to(tree)


def jit_cache_copy(pristine, cache: Path) -> Path:
    """A JIT cache holding the good module; returns its module.so."""
    _, tree, module = pristine
    shutil.copytree(tree / module.parent, cache / module.parent)
    for directory in (cache, cache / module.parent.parent, cache / module.parent):
        os.chmod(directory, 0o700)
    return cache / module


DAMAGES = ["half", "4k", "garbage"]


@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_jit_cache_entry_is_moved_aside_and_rebuilt(pristine, tmp_path, how):
    spec = pristine[0]
    cache = tmp_path / "cache"
    module = jit_cache_copy(pristine, cache)
    assert load_in_child(spec, cache).stdout.split() == ["result", "13"]  # good: loads (and is memoized)
    good = module.read_bytes()
    damage(module, how)

    # Without the JIT it cannot be repaired: a clear error, no crash.
    result = load_in_child(spec, cache, MLLM_KERNEL_DISABLE_JIT="1")
    assert result.stdout.startswith("error"), result.stdout
    assert "damaged" in result.stdout and "MLLM_KERNEL_DISABLE_JIT=1 forbids" in result.stdout

    result = load_in_child(spec, cache)
    assert result.stdout.split() == ["result", "13"]
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "damaged" in warnings[0] and "moved it to" in warnings[0], result.stderr
    assert "compiling cpu_damage_demo_3" in result.stderr
    aside = list(module.parent.parent.glob(".damaged-*/*/module.so"))
    assert len(aside) == 1 and aside[0].read_bytes() != good  # kept for inspection, not deleted
    assert module.read_bytes()[:4] == b"\x7fELF"

    result = load_in_child(spec, cache)  # repaired: loads quietly
    assert result.stdout.split() == ["result", "13"] and result.stderr == ""


@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_prebuilt_module_is_skipped(pristine, tmp_path, how):
    spec, tree, module = pristine
    prebuilt = tmp_path / "prebuilt"
    shutil.copytree(tree, prebuilt)
    cache = tmp_path / "cache"
    jit_cache_copy(pristine, cache)  # the JIT cache has a good copy
    assert load_in_child(spec, cache, MLLM_KERNEL_PREBUILT=str(prebuilt)).stdout.split() == ["result", "13"]
    damage(prebuilt / module, how)

    result = load_in_child(spec, cache, MLLM_KERNEL_PREBUILT=str(prebuilt))
    assert result.stdout.split() == ["result", "13"]
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "prebuilt module cpu_damage_demo_3" in warnings[0] and "damaged" in warnings[0]
    assert "compiling" not in result.stderr  # the JIT cache's copy serves

    # No JIT cache and no JIT: a clear error naming the damaged module.
    result = load_in_child(spec, tmp_path / "empty_cache", MLLM_KERNEL_PREBUILT=str(prebuilt), MLLM_KERNEL_DISABLE_JIT="1")
    assert result.stdout.startswith("error"), result.stdout
    assert f"prebuilt module cpu_damage_demo_3 at {prebuilt / module} is damaged" in result.stdout


def test_damaged_prebuilt_module_falls_back_to_compiling(pristine, tmp_path):
    spec, tree, module = pristine
    prebuilt = tmp_path / "prebuilt"
    shutil.copytree(tree, prebuilt)
    damage(prebuilt / module, "half")
    result = load_in_child(spec, tmp_path / "cache", MLLM_KERNEL_PREBUILT=str(prebuilt))
    assert result.stdout.split() == ["result", "13"]
    assert "is damaged" in result.stderr and "compiling cpu_damage_demo_3" in result.stderr


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
