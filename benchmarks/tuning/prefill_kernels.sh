#!/bin/bash
# Builds prefill_kernels.cu against a kernel folder (default: the checkout's
# kernels/prefill_attention) with the machine's nvcc and tvm-ffi's headers, then runs it for the
# Hopper kernel and for the mma.sync kernel. Further arguments go to it: `pages` sweeps the paged
# block sizes, HEAD_DIM:causal|full:BATCHxSEQ[:BLOCK_SIZE] picks rows (prefill_kernels.cu).
# Needs an sm_90 GPU and `import tvm_ffi`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
kernels=${1:-$here/../../kernels/prefill_attention}
tvm=$(python3 -c "import os, tvm_ffi; print(os.path.dirname(tvm_ffi.__file__))")
bin=${TMPDIR:-/tmp}/mllm_kernel_prefill_kernels
nvcc -std=c++20 -O3 -arch=sm_90a --expt-relaxed-constexpr -I"$kernels" -I"$here/../../include" -I"$tvm/include" \
  -I"$tvm/include/dlpack" "$here/prefill_kernels.cu" -o "$bin" -L"$tvm/lib" -ltvm_ffi -Xlinker -rpath="$tvm/lib"
"$bin" "${@:2}"
"$bin" mma "${@:2}"
