"""What this machine offers mllm-kernel: OS and CPU, Python, torch, tvm-ffi, CUDA toolkits,
driver and GPUs. Used by `bazel run //tools:show_env` and `python -m mllm_kernel show-env`.
Every probe degrades to a plain 'not found' line: the report never fails for a missing GPU."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys

NOT_FOUND = "not found"


def _run(cmd: list[str], timeout: float = 20.0) -> str | None:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def _os_name() -> str:
    try:
        with open("/etc/os-release") as f:
            fields = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
        name = fields.get("PRETTY_NAME", "").strip('"')
    except OSError:
        name = ""
    return f"{name or platform.system()} ({platform.platform()})"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or NOT_FOUND


def nvcc_release(nvcc: str) -> str:
    out = _run([nvcc, "--version"])
    if not out:
        return f"{nvcc} did not run"
    m = re.search(r"release ([\d.]+), (V[\d.]+)", out)
    return f"{m.group(1)} ({m.group(2)})" if m else out.strip().splitlines()[-1]


def _system_cuda() -> list[tuple[str, str]]:
    rows = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            rows.append((var, os.environ[var]))
    nvcc = shutil.which("nvcc")
    rows.append(("system nvcc", f"{nvcc}: {nvcc_release(nvcc)}" if nvcc else NOT_FOUND))
    smi = shutil.which("nvidia-smi")
    if not smi:
        rows.append(("nvidia-smi", f"{NOT_FOUND} (no NVIDIA driver visible)"))
        return rows
    out = _run([smi, "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"])
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", _run([smi]) or "")
    rows.append(("nvidia-smi", smi))
    rows.append(("driver CUDA version", cuda.group(1) if cuda else NOT_FOUND))
    for i, line in enumerate((out or "").strip().splitlines()):
        rows.append((f"nvidia-smi GPU {i}", line.strip()))
    return rows


def _torch_rows() -> list[tuple[str, str]]:
    try:
        import torch
    except ImportError as e:
        return [("torch", f"{NOT_FOUND} ({e})")]
    rows = [("torch", torch.__version__), ("torch CUDA build", torch.version.cuda or "none (CPU build)")]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            rows.append((f"GPU {i}", f"{p.name}, compute capability {p.major}.{p.minor}, "
                                     f"{p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB"))
    else:
        rows.append(("GPUs", "none visible to torch (torch.cuda.is_available() is False)"))
    return rows


def collect(hermetic_nvcc: str | None = None, simd_target: str | None = None) -> list[tuple[str, str]]:
    """Rows of (what, value). hermetic_nvcc / simd_target come from the Bazel build when present."""
    rows = [
        ("OS", _os_name()),
        ("CPU", _cpu_model()),
        ("CPU cores", str(os.cpu_count())),
        ("Highway SIMD target", simd_target or NOT_FOUND),
        ("Python", f"{platform.python_version()} ({sys.executable})"),
    ]
    rows += _torch_rows()
    try:
        import tvm_ffi

        rows.append(("apache-tvm-ffi", tvm_ffi.__version__))
    except ImportError as e:
        rows.append(("apache-tvm-ffi", f"{NOT_FOUND} ({e})"))
    rows.append(("hermetic nvcc", nvcc_release(hermetic_nvcc) if hermetic_nvcc else "not part of this run"))
    rows += _system_cuda()
    return rows


def format_rows(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
