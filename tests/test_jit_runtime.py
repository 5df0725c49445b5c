"""Tests of the JIT runtime (mllm_kernel.jit_utils) with tiny kernels written to temp dirs.

Needs a C++ compiler and Highway (MLLM_KERNEL_HIGHWAY_ROOT, or the wheel's vendored copy).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

try:
    import mllm_kernel
except ImportError:  # run as a plain script from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import mllm_kernel

import torch

from mllm_kernel.jit_utils import (
    JitSpec,
    cache_once,
    file_lock,
    gencode_flags,
    jit,
    load_cpu_jit,
    load_cuda_jit,
    make_cpp_args,
    parse_cuda_arch_list,
    registered_specs,
)
from mllm_kernel.jit_utils import config, filememo, make_spec

PACKAGE_PARENT = str(Path(mllm_kernel.__file__).resolve().parents[1])
# Bazel gives Highway as a runfiles-relative path; these tests change directories.
if os.environ.get("MLLM_KERNEL_HIGHWAY_HEADER"):
    os.environ["MLLM_KERNEL_HIGHWAY_HEADER"] = os.path.abspath(os.environ["MLLM_KERNEL_HIGHWAY_HEADER"])
SPAWN_TIMEOUT_S = 240


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(cache_dir))
    for name in ("MLLM_KERNEL_DISABLE_JIT", "MLLM_KERNEL_VERBOSE", "MLLM_KERNEL_SOURCE_ROOT"):
        monkeypatch.delenv(name, raising=False)
    return cache_dir


# A scalar kernel (fast to compile) and a tensor kernel, both templated so that the
# wrapper has to pass a template id with a comma through the export macro.
KERNEL_SOURCE = """\
#include <cstdint>
#include <tvm/ffi/container/tensor.h>
#include "level1.hpp"

namespace demo {{
template <int N, bool Negate>
int64_t add_n(int64_t x) {{ return (Negate ? -x : x) + N + kBias; }}

template <int N>
void add_n_tensor(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {{
  auto* out = static_cast<float*>(dst.data_ptr());
  const auto* in = static_cast<const float*>(src.data_ptr());
  for (int64_t i = 0; i < src.numel(); ++i) out[i] = in[i] + N;
}}
}}  // namespace demo
{extra}
"""


def write_kernel(directory: Path, bias: int = 0, extra: str = "") -> Path:
    """kernel.cpp -> "level1.hpp" -> <nested/level2.hpp> (found through an include path)."""
    (directory / "nested").mkdir(parents=True, exist_ok=True)
    (directory / "level1.hpp").write_text('#pragma once\n#include <nested/level2.hpp>\n')
    (directory / "nested" / "level2.hpp").write_text(f"#pragma once\nconstexpr int kBias = {bias};\n")
    (directory / "unrelated.hpp").write_text("#pragma once\n")
    kernel = directory / "kernel.cpp"
    kernel.write_text(KERNEL_SOURCE.format(extra=extra))
    return kernel


def demo_spec(kernel: Path, n: int = 3, negate: bool = True, **overrides) -> JitSpec:
    args = make_cpp_args(n, negate)
    fields = dict(
        name="demo",
        device="cpu",
        cpp_args=args,
        cpp_files=(str(kernel),),
        cpp_wrappers=(("add_n", f"demo::add_n<{args}>"), ("add_n_tensor", f"demo::add_n_tensor<{n}>")),
        extra_include_paths=(str(kernel.parent),),
    )
    fields.update(overrides)
    return JitSpec(**fields)


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_PARENT, env.get("PYTHONPATH")]))
    env.update(extra)
    return env


# Loads the demo module in a child process and prints add_n(10).
CHILD_LOAD = """\
import ast, sys, time
from pathlib import Path
from mllm_kernel.jit_utils import JitSpec
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.01)
spec = JitSpec(**ast.literal_eval(sys.argv[1]))
print("result", spec.load().add_n(10), flush=True)
"""


def child_load_command(spec: JitSpec, go: Path) -> list[str]:
    """A child process that waits for `go` to exist, then loads `spec` and calls add_n(10)."""
    return [sys.executable, "-c", CHILD_LOAD, repr(dataclasses.asdict(spec)), str(go)]


def cache_entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.rglob("*")) if cache_dir.exists() else []


def test_importing_jit_utils_does_not_import_torch():
    code = "import sys, mllm_kernel, mllm_kernel.jit_utils; print('torch' in sys.modules, mllm_kernel.__version__)"
    result = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "0.1.0"]


# ----------------------------------------------------------------------------- make_cpp_args


@pytest.mark.parametrize(
    "value, expected",
    [
        (42, "42"),
        (0, "0"),
        (-7, "-7"),
        (2**63 - 1, "9223372036854775807"),
        (True, "true"),
        (False, "false"),
        (0.5, "0.5"),
        (-2.0, "-2.0"),
        (0.1, "0.1"),
        (1e300, "1e+300"),
        (5e-324, "5e-324"),
        (torch.float32, "fp32_t"),
        (torch.float16, "fp16_t"),
        (torch.bfloat16, "bf16_t"),
        (torch.float64, "fp64_t"),
        (torch.int8, "int8_t"),
        (torch.int16, "int16_t"),
        (torch.int32, "int32_t"),
        (torch.int64, "int64_t"),
        (torch.uint8, "uint8_t"),
        (torch.bool, "bool"),
        (torch.float8_e4m3fn, "fp8_e4m3_t"),
        (torch.float8_e5m2, "fp8_e5m2_t"),
        ("kFoo", "kFoo"),
        ("mllm_kernel::cpu::Tag", "mllm_kernel::cpu::Tag"),
        ("::std::int32_t", "::std::int32_t"),
    ],
)
def test_make_cpp_args_single(value, expected):
    assert make_cpp_args(value) == expected


def test_make_cpp_args_joins_and_floats_round_trip():
    assert make_cpp_args(1, True, torch.float16, "T") == "1, true, fp16_t, T"
    assert make_cpp_args() == ""
    for value in (0.1, 1 / 3, math.pi, 1e-310, -123456.789e10):
        assert float(str(make_cpp_args(value))) == value  # a CppArgs tuple now; its text as before


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 2**63])
def test_make_cpp_args_rejects_values_without_a_literal(value):
    with pytest.raises(ValueError):
        make_cpp_args(value)


@pytest.mark.parametrize("value", ["1abc", "a b", "x; system()", "", None, [1], 1 + 2j, torch.complex64])
def test_make_cpp_args_rejects_other_types(value):
    with pytest.raises(TypeError, match=r"argument 1"):
        make_cpp_args(1, value)


def test_make_cpp_args_is_a_sequence_that_formats_joined():
    args = make_cpp_args(16, torch.float16, True)
    assert isinstance(args, tuple) and tuple(args) == ("16", "fp16_t", "true")
    assert f"{args}" == str(args) == "16, fp16_t, true"
    assert f"f<{args}>" == "f<16, fp16_t, true>"
    assert [*args] == ["16", "fp16_t", "true"]
    # Rendered arguments pass through unchanged, one by one or as a whole.
    assert make_cpp_args(*args) == args and make_cpp_args(args) == args
    assert make_cpp_args(*args, 2.5) == "16, fp16_t, true, 2.5"


@pytest.mark.parametrize(
    "text", ["16", "-3", "0x1F", "10u", "1.5f", "2.", "1e-05", "-2.0", "true", "false", "fp16_t", "int32_t", "ns::T",
             make_cpp_args(-(2**63))[0]],
)  # fmt: skip
def test_make_cpp_args_accepts_rendered_arguments(text):
    assert make_cpp_args(text) == text


def test_load_cpu_jit_takes_splatted_cpp_args(tmp_path):
    kernel = write_kernel(tmp_path)
    args = make_cpp_args(7, False)
    module = load_cpu_jit(
        "demo_splat",
        *args,
        cpp_files=[str(kernel)],
        cpp_wrappers=[("add_n", f"demo::add_n<{args}>")],
        extra_include_paths=[str(tmp_path)],
    )
    assert module.add_n(1) == 8
    fields = dict(cpp_files=[str(kernel)], cpp_wrappers=[("add_n", "demo::add_n<7, false>")])
    assert make_spec("demo_splat", "cpu", args, **fields) == make_spec("demo_splat", "cpu", (7, False), **fields)


# ----------------------------------------------------------------------------- cache_once


def test_cache_once_memoizes_typed_and_thread_safe():
    calls = []

    @cache_once
    def slow(x):
        calls.append(x)
        time.sleep(0.2)
        return (type(x).__name__, x)

    threads = [threading.Thread(target=slow, args=(1,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1]
    assert slow(True) == ("bool", True)  # True and 1 are different template args
    assert calls == [1, True]


def test_cache_once_does_not_cache_failures():
    attempts = []

    @cache_once
    def flaky():
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("first call fails")
        return "ok"

    with pytest.raises(RuntimeError):
        flaky()
    assert flaky() == "ok"
    assert flaky() == "ok"
    assert len(attempts) == 2


def test_cache_once_loader_under_torch_compile(tmp_path):
    kernel = write_kernel(tmp_path)
    spec = demo_spec(kernel, n=5)

    @cache_once
    def get_module():
        return spec.load()

    def fn(x):
        y = x * 2
        out = torch.full_like(y, float("nan"))
        get_module().add_n_tensor(out, y)
        return out + 1

    # aot_eager: traces through dynamo and AOT autograd without inductor codegen (which needs
    # setuptools data files that rules_python leaves out of runfiles).
    compiled = torch.compile(fn, fullgraph=False, backend="aot_eager")
    for size in (7, 33):
        x = torch.randn(size)
        torch.testing.assert_close(compiled(x), x * 2 + 5 + 1)


# ----------------------------------------------------------------------------- keys


def test_key_tracks_headers_two_levels_down(tmp_path):
    kernel = write_kernel(tmp_path)
    spec = demo_spec(kernel)
    key = spec.key()
    assert key == spec.key()

    (tmp_path / "unrelated.hpp").write_text("#pragma once\nint unrelated = 1;\n")
    (tmp_path / "nested" / "other.hpp").write_text("// not included\n")
    assert spec.key() == key

    (tmp_path / "nested" / "level2.hpp").write_text("#pragma once\nconstexpr int kBias = 1;\n")
    changed = spec.key()
    assert changed != key

    kernel.write_text(kernel.read_text() + "\n// edited\n")
    assert spec.key() != changed


def test_key_tracks_hwy_target_include(tmp_path):
    # foreach_target.h includes this file through a macro, not an #include line.
    kernel = write_kernel(tmp_path, extra='#define HWY_TARGET_INCLUDE "per_target.hpp"')
    (tmp_path / "per_target.hpp").write_text("// v1\n")
    spec = demo_spec(kernel)
    key = spec.key()
    (tmp_path / "per_target.hpp").write_text("// v2\n")
    assert spec.key() != key


def test_key_covers_args_flags_and_wrappers(tmp_path):
    kernel = write_kernel(tmp_path)
    base = demo_spec(kernel)
    keys = {
        base.key(),
        demo_spec(kernel, n=4).key(),
        demo_spec(kernel, negate=False).key(),
        demo_spec(kernel, extra_cflags=("-DFOO=1",)).key(),
        demo_spec(kernel, extra_ldflags=("-lm",)).key(),
        demo_spec(kernel, cpp_wrappers=(("add_n", "demo::add_n<3, true>"),)).key(),
    }
    assert len(keys) == 6


def test_key_follows_compiler_identity(tmp_path, monkeypatch):
    kernel = write_kernel(tmp_path)
    key = demo_spec(kernel).key()
    script = tmp_path / "other-cxx"
    script.write_text(f'#!/bin/sh\necho "other compiler 1.0"\nexec {config.cxx_compiler()} "$@"\n')
    script.chmod(0o755)
    monkeypatch.setenv("CXX", str(script))
    assert demo_spec(kernel).key() != key


CHILD_KEY = """\
import ast, subprocess, sys
from mllm_kernel.jit_utils import JitSpec, filememo

def recomputed(*args, **kwargs):
    raise AssertionError("a warm process re-read a source or ran the compiler")

filememo._digest_and_includes = recomputed
subprocess.run = recomputed
print(JitSpec(**ast.literal_eval(sys.argv[1])).key())
"""


def test_warm_process_reads_no_source_and_runs_no_compiler(tmp_path, isolated_cache, monkeypatch):
    monkeypatch.setattr(filememo, "RACY_S", 0.0)  # the demo files were written just now
    isolated_cache.mkdir(mode=0o700)
    spec = demo_spec(write_kernel(tmp_path))
    key = spec.key()
    assert (isolated_cache / filememo.MEMO_DIR / filememo.MEMO_FILE).is_file()
    command = [sys.executable, "-c", CHILD_KEY, repr(dataclasses.asdict(spec))]
    # The same copy of the package as this process (the memo is keyed by path; under Bazel the
    # runfiles' copy and the resolved checkout are two paths to the same headers).
    same_package = os.path.dirname(os.path.dirname(os.path.abspath(mllm_kernel.__file__)))
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([same_package, env["PYTHONPATH"]])
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == key


def test_memo_never_hides_an_edit(tmp_path, isolated_cache, monkeypatch):
    monkeypatch.setattr(filememo, "RACY_S", 0.0)
    isolated_cache.mkdir(mode=0o700)
    spec = demo_spec(write_kernel(tmp_path))
    key = spec.key()
    level2 = tmp_path / "nested" / "level2.hpp"
    before = level2.stat()
    time.sleep(0.05)  # past the filesystem's timestamp tick
    level2.write_text(level2.read_text().replace("kBias = 0", "kBias = 7"))  # same size, same inode
    os.utime(level2, ns=(before.st_atime_ns, before.st_mtime_ns))  # even with the old mtime back
    assert level2.stat().st_size == before.st_size and level2.stat().st_ino == before.st_ino
    assert spec.key() != key
    filememo.clear_process_memo()  # a new process: only the disk store
    assert spec.key() != key


def test_memo_store_missing_or_corrupt_is_harmless(tmp_path, isolated_cache, monkeypatch):
    monkeypatch.setattr(filememo, "RACY_S", 0.0)
    spec = demo_spec(write_kernel(tmp_path))
    key = spec.key()
    assert not isolated_cache.exists(), "computing a key must not create the cache directory"
    store = isolated_cache / filememo.MEMO_DIR / filememo.MEMO_FILE
    store.parent.mkdir(parents=True, mode=0o700)
    os.chmod(isolated_cache, 0o700)
    for garbage in (b"{not json", b"\0" * 100, b'{"src:x": [1, 2]}', b"[]"):
        store.write_bytes(garbage)
        filememo.clear_process_memo()
        assert spec.key() == key
    assert json.loads(store.read_text())  # rewritten whole


# ----------------------------------------------------------------------------- build, load, cache layout


def test_build_load_and_layout(tmp_path, isolated_cache, capfd):
    kernel = write_kernel(tmp_path, bias=100)
    spec = demo_spec(kernel)
    assert not spec.is_cached()
    module = spec.load()
    assert module.add_n(10) == -10 + 3 + 100
    x = torch.randn(1000)
    out = torch.full_like(x, float("nan"))
    module.add_n_tensor(out, x)
    torch.testing.assert_close(out, x + 3)

    err = capfd.readouterr().err
    assert err.count("mllm_kernel: compiling cpu_demo_3_true ...") == 1
    assert "mllm_kernel: compiled cpu_demo_3_true in" in err

    path = spec.module_path()
    assert spec.is_cached()
    assert path == isolated_cache / "cpu_demo_3_true" / spec.key()[:16] / "module.so"
    assert not [p for p in cache_entries(isolated_cache) if p.name.startswith(".tmp-")]
    for directory in (isolated_cache, path.parent.parent, path.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700

    # Loading again (also after a header edit) never reuses a stale module.
    assert spec.load() is module
    (tmp_path / "nested" / "level2.hpp").write_text("#pragma once\nconstexpr int kBias = 200;\n")
    assert not spec.is_cached()
    assert spec.load().add_n(10) == -10 + 3 + 200
    assert capfd.readouterr().err.count("compiling") == 1


def test_cache_dir_permissions_are_repaired(tmp_path, isolated_cache):
    isolated_cache.mkdir(mode=0o755)
    os.chmod(isolated_cache, 0o755)
    kernel = write_kernel(tmp_path)
    demo_spec(kernel).build()
    assert stat.S_IMODE(isolated_cache.stat().st_mode) == 0o700


def test_load_cpu_jit_and_registry(tmp_path):
    kernel = write_kernel(tmp_path)
    module = load_cpu_jit(
        "demo_loader",
        7,
        False,
        cpp_files=[str(kernel)],
        cpp_wrappers=[("add_n", f"demo::add_n<{make_cpp_args(7, False)}>")],
        extra_include_paths=[str(tmp_path)],
    )
    assert module.add_n(1) == 8
    names = {spec.display_name: spec for spec in registered_specs()}
    assert "cpu_demo_loader_7_false" in names
    info = names["cpu_demo_loader_7_false"].describe()
    assert info["cached"] and info["key"] and info["device"] == "cpu"


def test_jit_decorator(tmp_path, capfd):
    kernel = write_kernel(tmp_path)

    @jit(
        args=[9],
        device="cpu",
        cpp_files=[str(kernel)],
        func_name="demo::add_n_tensor",
        extra_include_paths=[str(tmp_path)],
    )
    def add_nine(compiled_module, dst, src):
        compiled_module.add_n_tensor(dst, src)
        return dst

    assert add_nine.spec.display_name == "cpu_add_n_tensor_9"
    assert add_nine.spec in registered_specs()
    assert capfd.readouterr().err == ""  # declaring compiles nothing
    for size in (0, 1, 17):
        x = torch.randn(size)
        torch.testing.assert_close(add_nine(torch.full_like(x, float("nan")), x), x + 9)
    assert capfd.readouterr().err.count("compiling") == 1
    assert add_nine.spec.is_cached()


def test_sources_resolve_against_source_root(tmp_path, monkeypatch):
    write_kernel(tmp_path / "demo_dir")
    monkeypatch.setenv("MLLM_KERNEL_SOURCE_ROOT", str(tmp_path))
    spec = demo_spec(Path("demo_dir/kernel.cpp"), extra_include_paths=(str(tmp_path / "demo_dir"),))
    assert spec.load().add_n(0) == 3

    missing = demo_spec(Path("demo_dir/missing.cpp"))
    with pytest.raises(FileNotFoundError, match=r"demo_dir/missing\.cpp.*" + str(tmp_path)):
        missing.key()
    with pytest.raises(FileNotFoundError, match="nope.cpp"):
        demo_spec(tmp_path / "nope.cpp").key()


def test_default_roots_in_dev_tree(monkeypatch, tmp_path):
    monkeypatch.delenv("MLLM_KERNEL_SOURCE_ROOT", raising=False)
    monkeypatch.delenv("MLLM_KERNEL_INCLUDE_ROOT", raising=False)
    package = Path(os.path.abspath(mllm_kernel.__file__)).parent
    # Relative sources resolve against the working directory (kernels pass absolute paths).
    monkeypatch.chdir(tmp_path)
    assert config.source_roots() == [tmp_path]
    monkeypatch.setenv("MLLM_KERNEL_SOURCE_ROOT", str(package))
    assert config.source_roots() == [package]
    expected_include = package / "include" if (package / "include").is_dir() else package.parent / "include"
    assert config.include_root() == expected_include


def test_relative_sources_resolve_against_cwd(tmp_path, monkeypatch):
    write_kernel(tmp_path / "demo_dir")
    monkeypatch.chdir(tmp_path / "demo_dir")
    spec = demo_spec(Path("kernel.cpp"), extra_include_paths=(str(tmp_path / "demo_dir"),))
    assert spec.load().add_n(0) == 3
    # The key does not depend on where the files live: the same sources elsewhere, same key.
    write_kernel(tmp_path / "elsewhere")
    moved = demo_spec(tmp_path / "elsewhere" / "kernel.cpp", extra_include_paths=(str(tmp_path / "elsewhere"),))
    assert moved.source_key() == spec.source_key()


def test_jit_utils_does_not_import_the_kernels():
    # The runtime gets sources as paths; it must never reach into mllm_kernel.kernels.
    root = Path(mllm_kernel.__file__).parent / "jit_utils"
    offenders = [p.name for p in root.glob("*.py") if "mllm_kernel.kernels" in p.read_text()]
    assert offenders == []


def add_constant_spec(c: int) -> JitSpec:
    import mllm_kernel.kernels.add_constant as add_constant_package

    source = Path(add_constant_package.__file__).parent / "add_constant.cpp"
    return make_spec("add_constant", "cpu", (c,), cpp_files=[source],
                     cpp_wrappers=[("add_constant", f"mllm_kernel::cpu::add_constant<{c}>")])  # fmt: skip


def test_cpu_module_lists_and_restricts_simd_targets(capsys):
    module = add_constant_spec(16).load()
    mask = module.mllm_simd_targets()
    targets = [1 << bit for bit in range(63) if mask >> bit & 1]
    names = [module.mllm_simd_target_name(target) for target in targets]
    with capsys.disabled():
        print(f"\nadd_constant<16> SIMD targets on this CPU: {names}")
    assert targets and all(names)
    x = torch.randn(4099)
    try:
        for target in targets:
            module.mllm_set_simd_targets(target)
            assert module.mllm_simd_targets() == mask  # the listing ignores the restriction
            out = torch.full_like(x, float("nan"))
            module.add_constant(out, x)
            torch.testing.assert_close(out, x + 16, rtol=0, atol=0)
    finally:
        module.mllm_set_simd_targets(0)
    missing = next(1 << bit for bit in range(63) if not mask >> bit & 1)
    with pytest.raises(ValueError, match="mllm_set_simd_targets"):
        module.mllm_set_simd_targets(missing)  # dispatching to a target this CPU lacks would crash


# ----------------------------------------------------------------------------- switches and errors


def test_disable_jit_names_module_and_how_to_prebuild(tmp_path, monkeypatch):
    kernel = write_kernel(tmp_path)
    spec = demo_spec(kernel)
    monkeypatch.setenv("MLLM_KERNEL_DISABLE_JIT", "1")
    with pytest.raises(RuntimeError) as error:
        spec.load()
    message = str(error.value)
    assert "cpu_demo_3_true" in message
    assert spec.source_key() in message and str(spec.module_path()) in message
    assert "without MLLM_KERNEL_DISABLE_JIT" in message
    monkeypatch.delenv("MLLM_KERNEL_DISABLE_JIT")
    spec.build()
    monkeypatch.setenv("MLLM_KERNEL_DISABLE_JIT", "1")
    assert spec.load().add_n(1) == 2  # a cached module still loads


def test_verbose_prints_commands(tmp_path, monkeypatch, capfd):
    kernel = write_kernel(tmp_path)
    demo_spec(kernel).build()
    quiet = capfd.readouterr().err
    assert "-std=c++20" not in quiet

    monkeypatch.setenv("MLLM_KERNEL_VERBOSE", "1")
    demo_spec(kernel, n=4).build()
    err = capfd.readouterr().err
    assert "-std=c++20 -O3 -fPIC -fvisibility=hidden" in err
    assert "wrapper.cc" in err and "hwy/targets.cc" in err
    assert "-shared" in err and "-ltvm_ffi" in err and "-Wl,--no-undefined" in err


def test_compile_error_reports_command_and_stderr(tmp_path, isolated_cache):
    kernel = write_kernel(tmp_path, extra="static_assert(false, \"deliberately broken kernel\");")
    spec = demo_spec(kernel)
    with pytest.raises(RuntimeError) as error:
        spec.build()
    message = str(error.value)
    assert "deliberately broken kernel" in message
    assert "command:" in message and "wrapper.cc" in message
    assert not spec.is_cached()
    assert not [p for p in cache_entries(isolated_cache) if p.name.startswith(".tmp-")]


# ----------------------------------------------------------------------------- processes


def test_concurrent_processes_compile_once(tmp_path):
    kernel = write_kernel(tmp_path)
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            child_load_command(demo_spec(kernel), go),
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    time.sleep(1.0)  # let every child import and reach the barrier
    go.touch()
    outputs = [child.communicate(timeout=SPAWN_TIMEOUT_S) for child in children]
    for child, (out, err) in zip(children, outputs):
        assert child.returncode == 0, err
        assert "result -7" in out
    all_err = "".join(err for _, err in outputs)
    assert all_err.count("mllm_kernel: compiling cpu_demo_3_true") == 1, all_err


def write_slow_compiler(tmp_path: Path) -> Path:
    """A CXX that, while SLOW_CXX_MARKER is set, writes half an output file and hangs."""
    real = config.cxx_compiler()
    script = tmp_path / "slow-cxx"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            if [ -n "$SLOW_CXX_MARKER" ]; then
              case " $* " in *" --version "*) ;; *)
                out=""; prev=""
                for arg in "$@"; do [ "$prev" = "-o" ] && out="$arg"; prev="$arg"; done
                [ -n "$out" ] && printf 'half-written garbage' > "$out"
                touch "$SLOW_CXX_MARKER"
                sleep 600
              esac
            fi
            exec {real} "$@"
            """
        )
    )
    script.chmod(0o755)
    return script


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_killed_compile_leaves_nothing_loadable(tmp_path, isolated_cache, monkeypatch, capfd):
    kernel = write_kernel(tmp_path)
    slow_cxx = write_slow_compiler(tmp_path)
    marker = tmp_path / "compiler-started"
    child = subprocess.Popen(
        child_load_command(demo_spec(kernel), tmp_path),
        env=child_env(CXX=str(slow_cxx), SLOW_CXX_MARKER=str(marker)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # so that the hanging compiler dies with it
    )
    try:
        wait_for(lambda: marker.exists() or child.poll() is not None, SPAWN_TIMEOUT_S, "the slow compiler")
        assert child.poll() is None, child.communicate()[1]
        time.sleep(0.2)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()

    monkeypatch.setenv("CXX", str(slow_cxx))  # same compiler identity, so the same key
    spec = demo_spec(kernel)
    assert not spec.is_cached()
    leftovers = [p for p in cache_entries(isolated_cache) if p.name.startswith(".tmp-")]
    assert leftovers, "the killed build should have left its private temp dir"
    capfd.readouterr()
    assert spec.load().add_n(10) == -7
    assert capfd.readouterr().err.count("compiling") == 1
    assert not [p for p in cache_entries(isolated_cache) if p.name.startswith(".tmp-")]
    assert spec.module_path().read_bytes()[:4] == b"\x7fELF"


def load_in_thread(spec: JitSpec) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run():
        try:
            result["value"] = spec.load().add_n(10)
        except BaseException as error:  # reported by the test
            result["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_stale_lock_file_does_not_block(tmp_path):
    kernel = write_kernel(tmp_path)
    spec = demo_spec(kernel)
    lock_path = spec.location().lock_path
    lock_path.parent.mkdir(parents=True)
    lock_path.write_text("left behind by a crashed process")
    thread, result = load_in_thread(spec)
    thread.join(SPAWN_TIMEOUT_S)
    assert not thread.is_alive(), "load hung on a stale lock file"
    assert result.get("value") == -7, result.get("error")


def test_lock_of_dead_holder_is_released(tmp_path, capfd):
    kernel = write_kernel(tmp_path)
    spec = demo_spec(kernel)
    lock_path = spec.location().lock_path
    lock_path.parent.mkdir(parents=True)
    holder_code = (
        "import sys, time\nfrom pathlib import Path\nfrom mllm_kernel.jit_utils import file_lock\n"
        "with file_lock(Path(sys.argv[1]), 'test'):\n    print('locked', flush=True)\n    time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", holder_code, str(lock_path)], env=child_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        thread, result = load_in_thread(spec)
        time.sleep(1.0)
        assert thread.is_alive(), "load did not wait for the lock holder"
        assert "waiting for another process" in capfd.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    thread.join(SPAWN_TIMEOUT_S)
    assert not thread.is_alive(), "load hung after the lock holder died"
    assert result.get("value") == -7, result.get("error")


# ----------------------------------------------------------------------------- CUDA


@pytest.mark.parametrize(
    "text, flags",
    [
        ("8.0 9.0a", ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a"]),
        ("sm_80;sm_90a", ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a"]),
        ("9.0+PTX", ["-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90"]),
        ("sm_90a+PTX", ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90a,code=compute_90a"]),
        ("10.0a, 12.0 8.6", [
            "-gencode=arch=compute_100a,code=sm_100a",
            "-gencode=arch=compute_120,code=sm_120",
            "-gencode=arch=compute_86,code=sm_86",
        ]),
        ("8.0 8.0 sm_80", ["-gencode=arch=compute_80,code=sm_80"]),
    ],
)  # fmt: skip
def test_cuda_arch_list_to_gencode(text, flags):
    assert gencode_flags(parse_cuda_arch_list(text)) == flags


@pytest.mark.parametrize("text", ["", "9", "ampere", "9.0b", "sm_9.0", "8.0+SASS"])
def test_cuda_arch_list_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_cuda_arch_list(text)


def test_cuda_arch_default_needs_gpu_or_env(monkeypatch):
    monkeypatch.delenv("MLLM_KERNEL_CUDA_ARCH_LIST", raising=False)
    from mllm_kernel.jit_utils import cuda_arch_list

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        assert f"{major}{minor}" in [arch.code for arch in cuda_arch_list()]
    else:
        with pytest.raises(RuntimeError, match="MLLM_KERNEL_CUDA_ARCH_LIST"):
            cuda_arch_list()


CUDA_KERNEL = """\
#include <cstdint>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

namespace demo {
template <int N>
__global__ void add_n_kernel(int32_t* out, const int32_t* in, int64_t n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = in[i] + N;
}

template <int N, bool Unused>
void add_n_cuda(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  int64_t n = src.numel();
  if (n == 0) return;
  add_n_kernel<N><<<(n + 255) / 256, 256>>>(static_cast<int32_t*>(dst.data_ptr()),
                                            static_cast<const int32_t*>(src.data_ptr()), n);
  TVM_FFI_ICHECK(cudaGetLastError() == cudaSuccess);
}
}  // namespace demo
"""

HOST_HELPER = """\
#include <cstdint>
#include <cuda_runtime.h>
namespace demo {
inline int64_t runtime_version() { int v = 0; cudaRuntimeGetVersion(&v); return v; }
}
"""


def test_cuda_module_builds_and_runs(tmp_path, monkeypatch, capfd):
    try:
        config.nvcc_compiler()
    except FileNotFoundError:
        pytest.skip("no nvcc")
    if not torch.cuda.is_available():
        monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "8.0 9.0+PTX")
    monkeypatch.setenv("MLLM_KERNEL_VERBOSE", "1")
    (tmp_path / "demo.cuh").write_text(CUDA_KERNEL)
    (tmp_path / "host.hpp").write_text(HOST_HELPER)
    try:
        module = load_cuda_jit(
            "demo_cuda",
            11,
            cuda_files=[str(tmp_path / "demo.cuh")],
            cpp_files=[str(tmp_path / "host.hpp")],
            cuda_wrappers=[("add_n", "demo::add_n_cuda<11, true>")],
            cpp_wrappers=[("runtime_version", "demo::runtime_version")],
        )
    except RuntimeError as error:
        # glibc >= 2.41 declares rsqrt(f) noexcept, which CUDA <= 13.0's math headers reject.
        if "rsqrt" in str(error) and "exception specification" in str(error):
            pytest.skip("this nvcc cannot compile against the host glibc (rsqrt declaration clash)")
        raise
    err = capfd.readouterr().err
    assert "-ccbin" in err and "-cudart=static" in err and "wrapper.cu" in err
    if not torch.cuda.is_available():
        assert "-gencode=arch=compute_90,code=compute_90" in err
        return
    assert module.runtime_version() > 0
    x = torch.randint(-1000, 1000, (1 << 16,), dtype=torch.int32, device="cuda")
    out = torch.full_like(x, -1)
    module.add_n(out, x)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + 11)


# Two wgmma products in flight and the first's accumulator read before the wait: ptxas makes every
# wgmma wait for the one before (C7514). With READ_AFTER_WAIT the read follows the wait (clean).
WGMMA_KERNEL = """\
#include <cstdint>
#include <tvm/ffi/container/tensor.h>

namespace demo {
#define DEMO_WGMMA(d, a, b)                                                                         \\
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;\\n" \\
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(a), "l"(b))
__global__ void two_products(float* out, uint64_t a, uint64_t b, int n) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  float d[4] = {0.f, 0.f, 0.f, 0.f}, e[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < n; ++i) {
    asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
    DEMO_WGMMA(d, a, b);
    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
    DEMO_WGMMA(e, a + i, b);
    asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
#ifndef READ_AFTER_WAIT
    out[threadIdx.x + i] = d[0];
#endif
    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
#ifdef READ_AFTER_WAIT
    out[threadIdx.x + i] = d[0];
#endif
  }
  out[threadIdx.x + 128] = d[1] + d[2] + d[3] + e[0] + e[1] + e[2] + e[3];
#endif
}

inline void launch(tvm::ffi::TensorView out) {  // never run by the test: the build is what it checks
  two_products<<<1, 128>>>(static_cast<float*>(out.data_ptr()), 0, 0, 1);
}
}  // namespace demo
"""


def test_serialized_wgmma_reports_are_parsed():
    line = ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
            "non wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline "
            "stage in the function '_Z3fooPf'\n")
    other = "ptxas info    : (C7519) warpgroup.arrive is injected in around line 9 by compiler in function '_Z3fooPf'\n"
    from mllm_kernel.jit_utils.compile import serialized_wgmma

    assert serialized_wgmma(other + line + line) == [
        "C7514 _Z3fooPf: due to non wgmma instructions reading accumulator registers of  a wgmma between start and "
        "end of the pipeline stage"]
    assert serialized_wgmma(other) == []


@pytest.mark.parametrize("read_after_wait", [False, True])
def test_serialized_wgmma_fails_ahead_of_time_builds(tmp_path, read_after_wait, capfd):
    # A prebuilt (ahead-of-time) module must not ship a kernel whose wgmma ptxas serialized: that
    # build fails, naming the code and the function; a JIT build warns and goes on.
    try:
        config.nvcc_compiler()
    except FileNotFoundError:
        pytest.skip("no nvcc")
    (tmp_path / "wgmma.cuh").write_text(WGMMA_KERNEL)
    spec = make_spec("demo_wgmma", "cuda", (), cuda_files=[str(tmp_path / "wgmma.cuh")],
                     cuda_wrappers=[("launch", "demo::launch")],
                     extra_cuda_cflags=["-DREAD_AFTER_WAIT"] if read_after_wait else [])
    archs = parse_cuda_arch_list("9.0a")
    try:
        if read_after_wait:
            spec.build(spec.location(root=tmp_path / "aot", archs=archs), serialized_wgmma="error")
            assert "serialized" not in capfd.readouterr().err
            return
        with pytest.raises(RuntimeError, match=r"ptxas serialized the wgmma pipeline[\s\S]*C7514 \S*two_products"):
            spec.build(spec.location(root=tmp_path / "aot", archs=archs), serialized_wgmma="error")
        assert not (tmp_path / "aot").exists() or not any((tmp_path / "aot").rglob("*.so"))
        spec.build(spec.location(root=tmp_path / "jit", archs=archs))
    except RuntimeError as error:
        if "rsqrt" in str(error) and "exception specification" in str(error):
            pytest.skip("this nvcc cannot compile against the host glibc (rsqrt declaration clash)")
        raise
    err = capfd.readouterr().err
    assert "C7514" in err and "the module was built anyway" in err
    assert any((tmp_path / "jit").rglob("*.so"))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
