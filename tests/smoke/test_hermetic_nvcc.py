"""The CUDA toolkit is the hermetic one: nvcc resolves every tool, header and library inside its
own tree, with no CUDA_HOME and no system CUDA on PATH."""
import os
import re
import subprocess
import sys
import tempfile

import pytest

NVCC = os.path.realpath(os.environ["HERMETIC_NVCC"])
TREE = os.path.dirname(os.path.dirname(NVCC))  # .../nvidia/cu13
CLEAN_ENV = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}


def _dryrun():
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.cu")
        with open(src, "w") as f:
            f.write("__global__ void k(int* p) { *p = 1; }\n")
        res = subprocess.run(
            [NVCC, "--dryrun", "-gencode=arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC",
             src, "-o", os.path.join(tmp, "k.so")],
            capture_output=True, text=True, env=CLEAN_ENV)
    assert res.returncode == 0, res.stderr
    return res.stderr + res.stdout


def test_nvcc_is_13_0():
    out = subprocess.run([NVCC, "--version"], capture_output=True, text=True, env=CLEAN_ENV).stdout
    assert "release 13.0" in out, out


def test_every_cuda_path_is_inside_the_hermetic_tree():
    text = _dryrun()
    # nvcc --dryrun prints the variables its profile sets ("#$ NAME=value"), then each command.
    variables = dict(re.findall(r"^#\$ (\w+)=(.*)$", text, re.M))
    for name in ("TOP", "CICC_PATH", "NVVMIR_LIBRARY_DIR", "INCLUDES", "SYSTEM_INCLUDES", "LIBRARIES"):
        paths = re.findall(r"(/[^\s\"]+)", variables[name])
        assert paths, (name, variables[name])
        for path in paths:
            assert os.path.realpath(path).startswith(TREE), (name, path)
    # Tools are found through PATH: the tree's own dirs come first, then only our clean PATH.
    path_dirs = variables["PATH"].split(":")
    tree_dirs = [d for d in path_dirs if os.path.realpath(d).startswith(TREE)]
    assert path_dirs[: len(tree_dirs)] == tree_dirs and tree_dirs
    assert [d for d in path_dirs if d not in tree_dirs] == CLEAN_ENV["PATH"].split(":")
    for tool in ("nvvm/bin/cicc", "bin/ptxas", "bin/fatbinary", "bin/nvlink", "bin/cudafe++"):
        assert os.access(os.path.join(TREE, tool), os.X_OK), tool
    assert "/usr/local/cuda" not in text


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
