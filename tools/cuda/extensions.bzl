"""A hermetic CUDA 13.0 toolkit assembled from NVIDIA's PyPI wheels (no system CUDA).

The wheels are pinned by sha256 and fetched by pip, so pip's own configuration (indexes, mirrors,
proxies) applies and no host is written here. They unpack into one tree, nvidia/cu13/, whose
bin/nvcc.profile locates cicc, ptxas, headers and libraries relative to itself.
13.0 matches the GPU machines' driver (580), which cannot JIT PTX from newer toolkits.
"""

# name, version, sha256 of the manylinux x86_64 wheel.
CUDA_WHEELS = [
    ("nvidia-cuda-nvcc", "13.0.88", "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03"),
    ("nvidia-nvvm", "13.0.88", "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0"),
    ("nvidia-cuda-crt", "13.0.88", "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4"),
    ("nvidia-cuda-runtime", "13.0.96", "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548"),
    ("nvidia-cuda-cccl", "13.0.85", "e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649"),
    # NVRTC: mllm_kernel.runtime's compiler where no nvcc exists; tests compile through it.
    ("nvidia-cuda-nvrtc", "13.0.88", "ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575"),
    # A reader only (no 13.0 wheel exists); it reads 13.0 fat binaries. Tests use it to list the
    # architectures embedded in built modules.
    ("nvidia-cuda-cuobjdump", "13.2.51", "95c69d3ddf0c2c1f535ec44c3433a66aeee19f588d9d22f73356e20b25f12b50"),
]

_PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64"]

def _run(rctx, args, what):
    res = rctx.execute(args, timeout = 1200, quiet = True)
    if res.return_code != 0:
        fail("cuda_toolkit: %s failed (%d):\n%s\n%s" % (what, res.return_code, res.stdout, res.stderr))
    return res

def _patch_for_new_glibc(rctx, path):
    """glibc >= 2.41 (pulled in with Debian sid's Bazel) declares rsqrt/rsqrtf as noexcept; CUDA
    13.0 declares them without, and nvcc rejects the mismatch. __THROW is glibc's own spelling of
    that exception specification (empty on glibcs that lack these functions), so it fits both."""
    text = rctx.read(path)
    for decl in ["double                 rsqrt(double x);", "float                  rsqrtf(float x);"]:
        if decl not in text:
            fail("cuda_toolkit: %s no longer declares %r; revisit the glibc patch" % (path, decl))
        text = text.replace(decl, decl[:-1] + " __THROW;")
    rctx.file(path, text, legacy_utf8 = False)

def _cuda_toolkit_repo_impl(rctx):
    python = rctx.which("python3")
    unzip = rctx.which("unzip")
    if not python or not unzip:
        fail("cuda_toolkit: needs python3 (with pip) and unzip on PATH; run tools/setup.sh")
    rctx.file("requirements.txt", "".join([
        "%s==%s --hash=sha256:%s\n" % (name, version, sha)
        for name, version, sha in CUDA_WHEELS
    ]))
    args = [python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--require-hashes", "--disable-pip-version-check", "-d", "wheels", "-r", "requirements.txt"]
    for p in _PLATFORMS:
        args += ["--platform", p]
    _run(rctx, args, "pip download")

    # unzip keeps the exec bits (Python's zipfile drops them).
    for whl in rctx.path("wheels").readdir():
        # (NVRTC's ".alt" libraries are an alternative build nobody here loads: 110 MB skipped.)
        _run(rctx, [unzip, "-q", "-o", str(whl), "nvidia/*", "-x", "*.alt.*", "-d", "."], "unzip " + whl.basename)
    rctx.delete("wheels")
    root = "nvidia/cu13"

    # The 13.0 nvcc.profile links from lib64; there is no unversioned libcudart.so.
    rctx.symlink(root + "/lib", root + "/lib64")
    _patch_for_new_glibc(rctx, root + "/include/crt/math_functions.h")
    rctx.symlink(root + "/lib/libcudart.so.13", root + "/lib/libcudart.so")
    version = _run(rctx, [root + "/bin/nvcc", "--version"], "nvcc --version").stdout
    release = version.split("release ")[1].split(",")[0] if "release " in version else "unknown"
    rctx.file("version.bzl", "CUDA_VERSION = %r\nNVCC_VERSION_TEXT = %r\n" % (release, version))
    rctx.symlink(rctx.attr.build_file, "BUILD.bazel")

cuda_toolkit_repo = repository_rule(
    implementation = _cuda_toolkit_repo_impl,
    attrs = {"build_file": attr.label(default = "//tools/cuda:cuda_toolkit.BUILD")},
)

def _cuda_impl(_mctx):
    cuda_toolkit_repo(name = "cuda_toolkit")

cuda = module_extension(implementation = _cuda_impl)
