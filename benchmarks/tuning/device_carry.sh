#!/bin/bash
# Prepares what a session carries to the lent GPU machine (no network there; ../shared/PEERS.md):
#   benchmarks/tuning/device_carry.sh DIR [--flashinfer]
# into DIR (list it in .git/info/exclude and pass it as the run's `carry`):
#   - the apache-tvm-ffi wheel for the GPU machine's Python 3.12, at the version tools/python pins;
#   - hwy/ from Highway's release archive (the version and sha256 tools/highway pins), for the CPU
#     modules the tests JIT-build there (MLLM_KERNEL_HIGHWAY_ROOT);
#   - with --flashinfer: flashinfer-python 0.7.2.post1 slimmed to its Python files and the JIT
#     sources of its norm, rope, page, activation, sampling, top-k and attention modules (about
#     30 MB), plus wheels of the pure-Python packages it imports that the GPU machine lacks;
#   - env.sh, which on the GPU machine (`source DIR/env.sh` from the repository root) installs all
#     of it into /tmp/site and exports PYTHONPATH, CUDA_HOME, the cache folders and, for
#     FlashInfer, its JIT settings (sm_90a, 16 jobs, the cuRAND/cuBLAS headers from torch's packages).
# pip and apt use this machine's own configuration (mirrors included); no host is named here.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
with_flashinfer=${2:-}
pip_for_gpu=(python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
             --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d)

tvm_pin=$(grep -m1 '^apache-tvm-ffi==' "$repo/tools/python/requirements.in")
mkdir -p "$out/wheels"
"${pip_for_gpu[@]}" "$out/wheels" "$tvm_pin"

if [ ! -f "$out/highway/hwy/highway.h" ]; then
  version=$(sed -n 's/^HIGHWAY_VERSION = "\(.*\)"/\1/p' "$repo/tools/highway/extensions.bzl")
  sha=$(sed -n 's/^HIGHWAY_SHA256 = "\(.*\)"/\1/p' "$repo/tools/highway/extensions.bzl")
  mirror=${MLLM_KERNEL_DEBIAN_MIRROR:-$(apt-get indextargets --format '$(REPO_URI) $(COMPONENT)' 'Created-By: Packages' |
                                         awk '$2 == "main" && $1 !~ /security/ {print $1; exit}')}
  tarball=$(mktemp)
  curl -fsSL -o "$tarball" "${mirror%/}/pool/main/h/highway/highway_${version}.orig.tar.gz"
  echo "$sha  $tarball" | sha256sum -c --quiet
  mkdir -p "$out/highway"
  tar xzf "$tarball" -C "$out/highway" --strip-components=1 --wildcards "*/hwy/*" --exclude "*_test.cc" --exclude "*/tests/*"
  rm -f "$tarball"
fi

if [ "$with_flashinfer" = "--flashinfer" ] && [ ! -f "$out/flashinfer_slim.zip" ]; then
  work=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --only-binary=:all: flashinfer-python==0.7.2.post1 -d "$work"
  python3 - "$work"/flashinfer_python-*.whl "$out/flashinfer_slim.zip" <<'PY'
import sys, zipfile
keep_trees = ("flashinfer/data/include/", "flashinfer/data/cutlass/include/", "flashinfer/data/cutlass/tools/util/include/",
              "flashinfer/data/spdlog/include/", "flashinfer/data/cccl/cub/", "flashinfer/data/cccl/libcudacxx/include/",
              "flashinfer/data/cccl/thrust/")
with zipfile.ZipFile(sys.argv[1]) as wheel, zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_DEFLATED) as slim:
    for info in wheel.infolist():
        name = info.filename
        top_csrc = name.startswith("flashinfer/data/csrc/") and name.count("/") == 3 and info.file_size < 200_000
        if name.endswith(".py") or name.startswith(keep_trees) or top_csrc or ".dist-info/" in name:
            slim.writestr(info, wheel.read(name))
PY
  "${pip_for_gpu[@]}" "$out/wheels" click einops tabulate nvidia-ml-py tqdm packaging requests urllib3 idna \
    charset-normalizer certifi cuda-python cuda-bindings cuda-pathfinder
  rm -rf "$work"
fi

cat > "$out/env.sh" <<EOF
# On the GPU machine, from the repository root: source $(basename "$out")/env.sh
carry=\$PWD/$(basename "$out")
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \$carry/wheels/*.whl 2>&1 | grep -v "already exists" || true
if [ -f \$carry/flashinfer_slim.zip ] && [ ! -f /tmp/site/flashinfer/__init__.py ]; then
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/site')" \$carry/flashinfer_slim.zip
fi
mkdir -p /tmp/extra_include
for d in \$(python3 -c "import nvidia, os; [print(os.path.join(p, x, 'include')) for p in nvidia.__path__ for x in os.listdir(p)]" 2>/dev/null); do
  [ -d "\$d" ] && cp -rn "\$d/." /tmp/extra_include/ 2>/dev/null
done
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda TVM_FFI_CUDA_ARCH_LIST=9.0a
export MLLM_KERNEL_CUDA_ARCH_LIST=9.0a MLLM_KERNEL_CACHE_DIR=/tmp/mllm_kernel_cache MLLM_KERNEL_HIGHWAY_ROOT=\$carry/highway
export FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer_ws
export FLASHINFER_EXTRA_CUDAFLAGS="-isystem /tmp/extra_include"
EOF
du -sh "$out"
