"""The CUDA chain: a module built by the hermetic nvcc exports its function, embeds exactly the
configured GPU architectures, links cudart statically, and (on a GPU machine) runs."""
import os
import re
import subprocess
import sys

import pytest

MODULE = os.path.abspath(os.environ["SMOKE_CUDA_MODULE"])
CUOBJDUMP = os.path.abspath(os.environ["CUOBJDUMP"])
with open(os.environ["CUDA_ARCHS_FILE"]) as f:
    ARCHS = f.read().split()


def _run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def test_exports_the_tvm_ffi_symbol():
    symbols = _run("nm", "-D", "--defined-only", MODULE).split()
    assert "__tvm_ffi_iota" in symbols


def test_cudart_is_static():
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", _run("readelf", "-d", MODULE))
    assert needed, "readelf found no NEEDED entries"
    assert not [lib for lib in needed if "cudart" in lib], needed


def test_embeds_exactly_the_configured_archs():
    # cuobjdump prints e.g. "ELF file    1: smoke_cuda.1.sm_90a.cubin" / "PTX file    1: ...sm_90.ptx".
    elf = set(re.findall(r"\.(sm_\d+a?)\.cubin", _run(CUOBJDUMP, "--list-elf", MODULE)))
    ptx_out = subprocess.run([CUOBJDUMP, "--list-ptx", MODULE], capture_output=True, text=True).stdout
    ptx = {"compute_" + a[3:] for a in re.findall(r"\.(sm_\d+a?)\.ptx", ptx_out)}
    expected_elf = {a for a in ARCHS if a.startswith("sm_")}
    expected_ptx = {a for a in ARCHS if a.startswith("compute_")}
    assert elf == expected_elf
    assert ptx == expected_ptx


def test_runs_on_gpu_when_present():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    import tvm_ffi

    mod = tvm_ffi.load_module(MODULE)
    out = torch.full((100_003,), -7, dtype=torch.int32, device="cuda")
    mod.iota(out)
    assert torch.equal(out.cpu(), torch.arange(100_003, dtype=torch.int32))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
