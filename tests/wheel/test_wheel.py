"""The wheel (bazel build //:wheel): its contents, then installed into a fresh virtualenv, where it
must run its prebuilt CPU modules with no compiler on PATH and JIT-compile new ones with one."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import pytest

WHEEL_DIR = Path(os.environ["WHEEL_DIR"])  # $(rootpath //:wheel): a directory holding the .whl
REQUIREMENTS_LOCK = Path(os.environ["REQUIREMENTS_LOCK"])
TMP = Path(os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp(prefix="mllm_wheel_test_"))
COMPILERS = ("c++", "g++", "gcc", "cc", "clang", "clang++", "nvcc")


def _wheel() -> Path:
    wheels = sorted(WHEEL_DIR.glob("*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {WHEEL_DIR}, found {wheels}"
    return wheels[0]


WHEEL = _wheel()
# tools/kernels_list.bzl's VERSION and KERNELS, passed in by tests/wheel/BUILD.bazel.
VERSION = os.environ["VERSION"]
KERNELS = os.environ["KERNELS"].split(",")
DIST_INFO = f"mllm_kernel-{VERSION}.dist-info"


@pytest.fixture(scope="module")
def archive():
    with zipfile.ZipFile(WHEEL) as zf:
        yield zf


def _headers(text: str) -> list[tuple[str, str]]:
    return [tuple(part.strip() for part in line.split(":", 1)) for line in text.splitlines() if ":" in line]


# ----------------------------------------------------------------------------- (a) contents


def test_file_name_version_and_tag(archive):
    wheel_tags = dict(_headers(archive.read(f"{DIST_INFO}/WHEEL").decode()))
    assert wheel_tags["Wheel-Version"] == "1.0"
    assert wheel_tags["Root-Is-Purelib"] == "false"
    tag = wheel_tags["Tag"]
    assert WHEEL.name == f"mllm_kernel-{VERSION}-{tag}.whl"
    assert re.fullmatch(r"py3-none-manylinux_2_\d+_x86_64", tag), tag


def test_version_agrees_with_package(archive):
    # Bazel names the file from tools/kernels_list.bzl; Python reads mllm_kernel.__version__.
    init = archive.read("mllm_kernel/__init__.py").decode()
    assert re.search(rf"^__version__ = \"{re.escape(VERSION)}\"$", init, re.M), "kernels_list.bzl VERSION != __version__"


def test_metadata(archive):
    fields = _headers(archive.read(f"{DIST_INFO}/METADATA").decode())
    values = dict(fields)
    assert values["Metadata-Version"] == "2.1"
    assert values["Name"] == "mllm-kernel"
    assert values["Version"] == VERSION
    assert values["Requires-Python"] == ">=3.10"
    assert values["Summary"] and "License" in values
    tvm_ffi = re.search(r"^apache-tvm-ffi==(\S+)", REQUIREMENTS_LOCK.read_text(), re.M).group(1)
    requires = sorted(v for k, v in fields if k == "Requires-Dist")
    assert requires == sorted(["torch", f"apache-tvm-ffi=={tvm_ffi}", "numpy", 'nvidia-cuda-nvrtc>=13; extra == "nvrtc"'])
    assert values["Provides-Extra"] == "nvrtc"


def test_record_matches_every_file(archive):
    rows = list(csv.reader(io.StringIO(archive.read(f"{DIST_INFO}/RECORD").decode())))
    recorded = {row[0]: row for row in rows}
    assert set(recorded) == set(archive.namelist()), "RECORD and the archive list different files"
    assert recorded[f"{DIST_INFO}/RECORD"][1:] == ["", ""]
    for name, (_, digest, size) in recorded.items():
        if name.endswith("/RECORD"):
            continue
        data = archive.read(name)
        expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == expected and int(size) == len(data), name


def test_deterministic_entries(archive):
    infos = archive.infolist()
    assert all(info.date_time == (1980, 1, 1, 0, 0, 0) for info in infos)
    package = [i.filename for i in infos if not i.filename.startswith(DIST_INFO)]
    assert package == sorted(package)
    assert infos[-1].filename == f"{DIST_INFO}/RECORD"


def test_expected_members(archive):
    names = set(archive.namelist())
    expected = {
        "mllm_kernel/__init__.py",
        "mllm_kernel/jit_utils/jit.py",
        "mllm_kernel/jit_utils/prebuilt.py",
        "mllm_kernel/kernels/__init__.py",
        "mllm_kernel/cpu/jit/__init__.py",
        "mllm_kernel/include/mllm_kernel/tensor.hpp",
        "mllm_kernel/include/mllm_kernel/utils.hpp",
        "mllm_kernel/include/mllm_kernel/utils.cuh",
        "mllm_kernel/_vendor/highway/LICENSE",
        "mllm_kernel/_vendor/highway/hwy/highway.h",
        "mllm_kernel/_vendor/highway/hwy/targets.cc",
        "mllm_kernel/_vendor/highway/hwy/abort.cc",
        "mllm_kernel/_prebuilt/manifest.json",
        "mllm_kernel/kernels/add_constant/__init__.py",
        "mllm_kernel/kernels/add_constant/add_constant.hpp",
        "mllm_kernel/kernels/add_constant/add_constant.cpp",
        "mllm_kernel/kernels/add_constant/add_constant-inl.h",
        "mllm_kernel/kernels/add_constant/add_constant.cuh",
        "mllm_kernel/runtime/__init__.py",
        "mllm_kernel/runtime/driver.cpp",
        "mllm_kernel/runtime/driver_api.hpp",
        "mllm_kernel/runtime/prebuilt_kernels.cu",
        "mllm_kernel/runtime/prebuilt_kernels.fatbin",
        "mllm_kernel/runtime/_launch.abi3.so",
    }
    assert expected <= names, sorted(expected - names)
    for op in KERNELS:
        assert any(n.startswith(f"mllm_kernel/kernels/{op}/") and n.endswith(".py") for n in names), op
    assert any(n.startswith("mllm_kernel/_vendor/highway/hwy/ops/") for n in names)
    # Only modules and their manifest from the prebuilt trees; nothing from a test or a build dir.
    leaked = [n for n in names if n.endswith((".lock", "build.json", "compile_commands.json", ".o"))
              or re.search(r"/wrapper\.(cc|cu)$", n) or "/tests/" in n or "__pycache__" in n]
    assert not leaked, leaked


def test_prebuilt_manifest(archive):
    manifest = json.loads(archive.read("mllm_kernel/_prebuilt/manifest.json"))
    assert manifest["format"] == 1
    modules = manifest["modules"]
    shipped = {n for n in archive.namelist() if n.startswith("mllm_kernel/_prebuilt/") and n.endswith(".so")}
    assert shipped == {f"mllm_kernel/_prebuilt/{m['path']}" for m in modules}
    names = {m["display_name"] for m in modules}
    assert {"cpu_add_constant_16", "cpu_add_constant_runtime"} <= names
    for op in KERNELS:
        assert any(m["path"].startswith(f"{op}/") for m in modules), f"{op} has no prebuilt module"


def test_platform_tag_is_the_newest_glibc_needed(archive):
    objdump = shutil.which("objdump")
    if not objdump:
        pytest.skip("no objdump to cross-check with")
    newest = (0, 0)
    work = TMP / "so"
    for name in archive.namelist():
        if name.endswith(".so"):
            path = Path(archive.extract(name, work))
            symbols = subprocess.run([objdump, "-T", str(path)], check=True, capture_output=True, text=True).stdout
            for major, minor in re.findall(r"\bGLIBC_(\d+)\.(\d+)", symbols):
                newest = max(newest, (int(major), int(minor)))
    assert WHEEL.name.endswith(f"-manylinux_{newest[0]}_{newest[1]}_x86_64.whl")


# ----------------------------------------------------------------------------- (b), (c) installed


def _dependency_paths() -> list[str]:
    """The test's own site-packages of torch, tvm-ffi & co. (Bazel's pip repos), never a tree
    that holds mllm_kernel: the venv must import the package from the wheel only."""
    paths = []
    for entry in sys.path:
        path = Path(entry)
        if not path.is_dir() or (path / "mllm_kernel").exists() or path == Path(__file__).parent:
            continue
        if any((path / top).exists() for top in ("torch", "tvm_ffi", "numpy", "typing_extensions.py", "sympy",
                                                "networkx", "jinja2", "markupsafe", "filelock", "fsspec", "mpmath")):
            paths.append(str(path.absolute()))
    return paths


@pytest.fixture(scope="module")
def venv():
    root = TMP / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    python = root / "bin" / "python"
    site_packages = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        check=True, capture_output=True, text=True).stdout.strip())
    deps = _dependency_paths()
    assert any((Path(p) / "torch").is_dir() for p in deps) and any((Path(p) / "tvm_ffi").is_dir() for p in deps)
    (site_packages / "zz_bazel_deps.pth").write_text("\n".join(deps) + "\n")
    pip_env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(WHEEL)], check=True, env=pip_env)
    return root


def _child(venv: Path, script: str, path: str, tag: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Run script in the venv's python from a directory outside the repo, with a fresh cache."""
    cache = TMP / f"cache_{tag}"
    cwd = TMP / f"cwd_{tag}"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLLM_KERNEL_", "PYTHON", "RUNFILES", "CUDA")) and k not in ("CXX", "CC", "HIGHWAY_HEADER")}
    env.update(PATH=path, HOME=str(cwd), MLLM_KERNEL_CACHE_DIR=str(cache), PYTHONNOUSERSITE="1")
    result = subprocess.run([str(venv / "bin" / "python"), "-c", textwrap.dedent(script)], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=1800)
    print(result.stdout)
    print(result.stderr, file=sys.stderr)
    assert result.returncode == 0, result.stderr
    return result, cache


CHECK_INSTALLED = """
    import os, sys
    from pathlib import Path
    import torch
    import mllm_kernel
    from mllm_kernel.jit_utils import config
    venv = Path(sys.prefix).resolve()
    for where in (mllm_kernel.__file__, config.include_root(), config.highway_root(), *config.prebuilt_manifests()):
        assert venv in Path(where).resolve().parents, f"{where} is not inside the venv {venv}"
    import mllm_kernel.kernels as kernels
    assert [venv in Path(p).resolve().parents for p in kernels.__path__] == [True], kernels.__path__
"""


def test_prebuilt_modules_run_without_a_compiler(venv):
    bin_only = TMP / "bin_only"
    bin_only.mkdir()
    for tool in ("python", "python3"):  # only the venv's interpreter; no compiler anywhere on PATH
        (bin_only / tool).symlink_to(venv / "bin" / tool)
    script = CHECK_INSTALLED + """
    import shutil
    assert not [c for c in %r if shutil.which(c)], "a compiler is on PATH"
    from mllm_kernel.cpu.jit import add_constant, add_constant_runtime
    x = torch.randn(4099, dtype=torch.float32)
    torch.testing.assert_close(add_constant(x, 16), x + 16, rtol=0, atol=0)
    torch.testing.assert_close(add_constant_runtime(x, 3.25), x + 3.25, rtol=0, atol=0)
    from mllm_kernel.jit_utils import registered_specs
    statuses = {s.display_name: s.status() for s in registered_specs() if s.display_name.startswith("cpu_add_constant")}
    assert statuses["cpu_add_constant_16"] == "prebuilt" and statuses["cpu_add_constant_runtime"] == "prebuilt", statuses
    # mllm_kernel.runtime: its driver module prebuilt, its shipped cubins loadable, no compiler to be found.
    from mllm_kernel.runtime import compiler, driver, prebuilt_kernels
    assert driver.SPEC.status() == "prebuilt" and prebuilt_kernels.origin() == "fatbin"
    from mllm_kernel.runtime import _launch  # the CPython extension (abi3)
    assert driver.launch_function() is _launch.launch
    assert [p.name for p in prebuilt_kernels.kernel("mllm_axpby_f32").params] == ["x", "y", "alpha", "beta", "n"]
    os.environ["MLLM_KERNEL_NVRTC"] = "/nonexistent/libnvrtc.so"  # an NVRTC wheel on this machine is no compiler here
    try:
        compiler.pick_compiler("auto")
        raise AssertionError("a CUDA compiler was found")
    except FileNotFoundError:
        pass
    print("prebuilt ok")
    """ % (COMPILERS,)
    result, cache = _child(venv, script, str(bin_only), "prebuilt")
    assert "prebuilt ok" in result.stdout
    assert "compiling" not in result.stderr
    assert not cache.exists() or not any(cache.iterdir()), list(cache.rglob("*"))


def test_jit_compiles_from_installed_sources(venv):
    if not shutil.which("c++"):
        pytest.skip("no C++ compiler on this machine")
    script = CHECK_INSTALLED + """
    from mllm_kernel.jit_utils import load_cpu_jit, JitSpec, make_cpp_args, prebuilt
    import mllm_kernel.kernels.add_constant as add_constant_package
    source = str(Path(add_constant_package.__file__).parent / "add_constant.cpp")
    assert venv in Path(source).resolve().parents
    wrappers = [("add_constant", "mllm_kernel::cpu::add_constant<16>")]
    # A flag the prebuilt module lacks: same display name, new key, so it must be compiled here.
    spec = JitSpec(name="add_constant", device="cpu", cpp_args=make_cpp_args(16), cpp_files=(source,),
                   cpp_wrappers=tuple(wrappers), extra_cflags=("-DMLLM_WHEEL_TEST=1",))
    assert prebuilt.find_prebuilt(spec.display_name, "cpu", spec.source_key()) is None
    module = load_cpu_jit("add_constant", 16, cpp_files=[source], cpp_wrappers=wrappers,
                          extra_cflags=["-DMLLM_WHEEL_TEST=1"])
    assert spec.status() == "jit-cached", spec.status()
    x = torch.randn(4099, dtype=torch.float32)
    out = torch.empty_like(x)
    module.add_constant(out, x)
    torch.testing.assert_close(out, x + 16, rtol=0, atol=0)
    print("jit ok", spec.module_path())
    """
    path = os.pathsep.join([str(venv / "bin"), os.environ.get("PATH") or "/usr/bin:/bin"])
    result, cache = _child(venv, script, path, "jit")
    assert "jit ok" in result.stdout
    assert "compiling cpu_add_constant_16" in result.stderr
    assert list(cache.rglob("module.so")), "the JIT cache holds no module"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v", "-s"]))
