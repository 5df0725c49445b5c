"""show_env's report: every row is present, and it succeeds on a machine with no GPU/driver."""
import os
import subprocess
import sys

import pytest

from mllm_kernel import env_info

EXPECTED = ["OS", "CPU", "CPU cores", "Highway SIMD target", "Python", "torch", "torch CUDA build",
            "apache-tvm-ffi", "hermetic nvcc", "system nvcc", "nvidia-smi"]


def test_report_has_every_row_and_runs_without_gpu(monkeypatch, tmp_path):
    # Hide any nvidia-smi / nvcc: the report must still succeed and say so.
    monkeypatch.setenv("PATH", str(tmp_path))
    rows = dict(env_info.collect(hermetic_nvcc=os.environ["HERMETIC_NVCC"], simd_target="TEST"))
    for key in EXPECTED:
        assert key in rows, key
    assert rows["nvidia-smi"].startswith("not found")
    assert rows["system nvcc"] == "not found"
    assert rows["hermetic nvcc"].startswith("13.0")
    assert rows["CPU cores"] == str(os.cpu_count())


def test_highway_target_probe_names_a_target():
    out = subprocess.run([os.path.abspath(os.environ["HWY_TARGET_BIN"])], capture_output=True, text=True,
                         check=True).stdout.strip()
    known = {"AVX3_SPR", "AVX3_ZEN4", "AVX3_DL", "AVX3", "AVX2", "SSE4", "SSSE3", "SSE2", "EMU128",
             "AVX10_2", "AVX10_2_512", "SCALAR", "NEON", "SVE", "SVE2", "NEON_BF16", "SVE_256", "SVE2_128"}
    assert out in known, out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
