#!/bin/bash
# A/B of prefill-attention kernel variants in one GPU session (compare variants only within one
# call: lent machines differ by 5-8%). Each variant is a copy of this checkout with some files of
# kernels/prefill_attention/ replaced; all variants JIT-build in parallel, then
# bench_prefill_attention.py runs once per variant in the order A B .. .. B A (a palindrome, so a
# drift of the clock over the call hits every variant alike), repeated --rounds times, and
# ab_compare.py prints each row's median TFLOP/s per variant and its ratio to A.
#
#   benchmarks/tuning/ab_prefill.sh OUTDIR A=- B=dir_b [C=dir_c ...] [-- bench args]
#
# A variant's value is a folder whose files replace those of kernels/prefill_attention/ ("-":
# the checkout as it is). Needs a CUDA GPU, nvcc (CUDA_HOME) and `import tvm_ffi`; set
# MLLM_KERNEL_CUDA_ARCH_LIST (e.g. 9.0a) to build for one target only. ROUNDS=n repeats the
# palindrome. On the lent GPU machine, tar OUTDIR into $OUT: only a few files come back from it.
# Default bench args: head_dim 64/128/256 x 16x1024, 8x4096, 2x16384 x causal and full, no peers.
#
# KERNELS=1 times the kernels alone instead (no Python between launches; each run takes seconds,
# so ROUNDS=4 or more): prefill_kernels.cu is built against each variant's folder (nvcc, sm_90a)
# and run with the args after "--" (its rows, e.g. 128:causal:8x4096:16; default its own set).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$1; shift
mkdir -p "$out"
variants=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  name=${1%%=*}; src=${1#*=}; shift
  if ! [[ $name =~ ^[A-Z]$ ]]; then  # ab_compare.py reads p_<letter><run>.json: S2 and S5 would merge
    echo "ab_prefill.sh: a variant's name is one capital letter, got '$name'" >&2; exit 2
  fi
  dir=${TMPDIR:-/tmp}/mllm_kernel_ab/$name
  rm -rf "$dir"; mkdir -p "$dir"
  cp -r "$repo/mllm_kernel" "$repo/include" "$repo/kernels" "$repo/benchmarks" "$dir/"
  if [ "$src" != "-" ]; then cp "$src"/* "$dir/kernels/prefill_attention/"; fi
  variants+=("$name")
done
[ "${1:-}" = "--" ] && shift
bench_args=("$@")
kernels=${KERNELS:-0}
[ ${#bench_args[@]} -eq 0 ] && [ "$kernels" = 0 ] &&
  bench_args=(--head-dims 64,128,256 --shapes 16x1024,8x4096,2x16384 --causal both --fi-head-dims "" --no-sdpa --no-mma)
export MLLM_KERNEL_CACHE_DIR=${MLLM_KERNEL_CACHE_DIR:-${TMPDIR:-/tmp}/mllm_kernel_ab_cache} PYTHONUNBUFFERED=1

start=$(date +%s)
if [ "$kernels" != 0 ]; then
  tvm=$(python3 -c "import os, tvm_ffi; print(os.path.dirname(tvm_ffi.__file__))")
  for v in "${variants[@]}"; do
    (cd "${TMPDIR:-/tmp}/mllm_kernel_ab/$v" &&
     "${CUDA_HOME:+$CUDA_HOME/bin/}nvcc" -std=c++20 -O3 -arch=sm_90a --expt-relaxed-constexpr -Ikernels/prefill_attention \
       -Iinclude -I"$tvm/include" -I"$tvm/include/dlpack" benchmarks/tuning/prefill_kernels.cu -o prefill_kernels \
       -L"$tvm/lib" -ltvm_ffi -Xlinker -rpath="$tvm/lib" > "$out/build_$v.log" 2>&1 ||
     echo "build of $v failed: $out/build_$v.log") &
  done
else for v in "${variants[@]}"; do
  (cd "${TMPDIR:-/tmp}/mllm_kernel_ab/$v" && python3 -c "
import sys; sys.path.insert(0, '.')
import mllm_kernel.kernels as kernels
specs = kernels.package('prefill_attention').SPECS
for spec in (specs.values() if isinstance(specs, dict) else specs): spec.build()
" > "$out/build_$v.log" 2>&1 || echo "build of $v failed: $out/build_$v.log") &
done; fi
wait
echo "built ${variants[*]} in $(( $(date +%s) - start )) s"

order=("${variants[@]}")
for (( i=${#variants[@]}-1; i>=0; i-- )); do order+=("${variants[$i]}"); done
for (( r=0; r<${ROUNDS:-1}; r++ )); do
  for v in "${order[@]}"; do
    dir=${TMPDIR:-/tmp}/mllm_kernel_ab/$v
    if [ "$kernels" != 0 ]; then
      n=$(ls "$out" | grep -c "^k_${v}[0-9]*\.log$" || true)
      "$dir/prefill_kernels" "${bench_args[@]}" > "$out/k_$v$n.log" 2>&1 || echo "run of $v failed: $out/k_$v$n.log"
      continue
    fi
    n=$(ls "$out" | grep -c "^p_${v}[0-9]*\.json$" || true)
    (cd "$dir" &&
     python3 benchmarks/bench_prefill_attention.py "${bench_args[@]}" --json "$out/p_$v$n.json" > "$out/p_$v$n.log" 2>&1) ||
      echo "bench of $v failed: $out/p_$v$n.log"
  done
done
echo "benchmarks done in $(( $(date +%s) - start )) s"
python3 "$repo/benchmarks/tuning/ab_compare.py" "$out" | tee "$out/compare.txt"
