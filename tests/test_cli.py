"""python -m mllm_kernel (show-env, show-config, show-clangd-recommend-config) and //:compile_commands."""
import json
import os
import subprocess
import sys

import pytest

PREBUILT = os.path.abspath(os.environ["PREBUILT_TREE"])
COMPILE_COMMANDS = os.path.abspath(os.environ["COMPILE_COMMANDS"])


def run_cli(*args, env=None, **extra):
    environment = dict(os.environ, **(env or {}))
    for name, value in extra.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    return subprocess.run([sys.executable, "-m", "mllm_kernel", *args], capture_output=True, text=True,
                          env=environment, timeout=300)


def kernel_status(output: str) -> dict[str, str]:
    rows = {}
    for line in output.splitlines():
        if line.startswith("  "):
            name, _, status = line.strip().partition(" ")
            rows[name] = status.strip()
    return rows


def test_show_env_prints_the_rows():
    result = run_cli("show-env")
    assert result.returncode == 0, result.stderr
    for row in ("OS", "CPU cores", "Highway SIMD target", "Python", "torch", "apache-tvm-ffi", "hermetic nvcc"):
        assert any(line.startswith(row + " ") for line in result.stdout.splitlines()), (row, result.stdout)


def test_show_config_prebuilt(tmp_path):
    result = run_cli("show-config", MLLM_KERNEL_PREBUILT=PREBUILT, MLLM_KERNEL_CACHE_DIR=str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    assert "Runtime configuration" in result.stdout and "torch" in result.stdout
    status = kernel_status(result.stdout)
    for c in (1, 2, 4, 8, 16):
        assert status[f"cpu_add_constant_{c}"] == "prebuilt", result.stdout
    assert status["cpu_add_constant_runtime"] == "prebuilt", result.stdout
    assert status["cuda_add_constant_1"] == "prebuilt", result.stdout


def test_show_config_not_built(tmp_path):
    result = run_cli("show-config", MLLM_KERNEL_PREBUILT=None, MLLM_KERNEL_CACHE_DIR=str(tmp_path / "empty"))
    assert result.returncode == 0, result.stderr
    status = kernel_status(result.stdout)
    assert status["cpu_add_constant_16"] == "not built", result.stdout
    assert status["cpu_add_constant_runtime"] == "not built", result.stdout
    # CUDA: 'not built' where archs can be picked, else the reason (no GPU here).
    assert status["cuda_add_constant_1"] == "not built" or status["cuda_add_constant_1"].startswith("unknown:")


def test_clangd_config_written_and_never_overwritten(tmp_path):
    from mllm_kernel.jit_utils import config

    result = run_cli("show-clangd-recommend-config", "--output", str(tmp_path), PATH="/usr/bin:/bin")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / ".clangd").read_text()
    tvm_includes, _ = config.tvm_ffi_paths()
    for path in [*tvm_includes, config.include_root(), config.highway_root()]:
        assert f"-I{path}" in text, (path, text)
    assert "kernels/add_constant" in text
    assert "-std=c++20" in text
    assert r"PathMatch: .*\.(cu|cuh)" in text
    assert "--cuda-gpu-arch=sm_" in text

    again = run_cli("show-clangd-recommend-config", "--output", str(tmp_path))
    assert again.returncode == 1
    assert "already exists" in again.stderr
    assert (tmp_path / ".clangd").read_text() == text


def test_compile_commands_lists_every_source():
    with open(COMPILE_COMMANDS) as f:
        entries = json.load(f)
    assert entries and all(set(e) == {"directory", "file", "arguments"} for e in entries)
    assert all(os.path.isabs(e["directory"]) for e in entries)
    by_file = {e["file"]: e for e in entries}
    assert len(by_file) == len(entries), "one entry per file"

    def entry(suffix):
        found = [e for f, e in by_file.items() if f.endswith(suffix)]
        assert found, (suffix, sorted(by_file))
        return found[0]

    for suffix in ("kernels/add_constant/add_constant.cpp", "tests/smoke/smoke_cpu.cc", "tests/cpp/matcher_probe.cc"):
        args = entry(suffix)["arguments"]
        assert "-std=c++20" in args, args
        assert any(a.startswith(("-I", "-isystem", "-iquote")) for a in args), args
    for suffix in ("kernels/add_constant/add_constant.cuh", "tests/smoke/smoke_cuda.cu"):
        args = entry(suffix)["arguments"]
        assert args[args.index("-x") + 1] == "cuda", args
        assert any(a.startswith("--cuda-gpu-arch=sm_") for a in args), args
        assert "-std=c++20" in args and any(a.startswith("-I") for a in args), args


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
