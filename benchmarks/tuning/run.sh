#!/bin/bash
# Builds the six parts of sweep.cu in parallel with the machine's nvcc, then runs them one after
# another (never two at once: they time the GPU). Usage: run.sh [prefetch] > sweep.txt
set -eu
cd "$(dirname "$0")"
out=${TMPDIR:-/tmp}/mllm_kernel_sweep
mkdir -p "$out"
for p in 0 1 2 3 4 5; do
  nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -DPART=$p sweep.cu -o "$out/part$p" &
done
wait
parts="0 1 2 3 4 5"
[ "${1:-}" = prefetch ] && parts="2 3 4 5"
for p in $parts; do echo "== part $p"; "$out/part$p" "${1:-}"; done
