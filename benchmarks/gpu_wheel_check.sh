#!/usr/bin/env bash
# The GPU checks of a built wheel, run on the GPU machine from the repository root: the suite
# with the JIT disabled (everything from the wheel's prebuilt modules), the JIT's own tests,
# compute-sanitizer memcheck over every CUDA op, the hostile-input table on CPU and CUDA, and the
# benchmarks. With a base wheel, bench_ops and bench_call_overhead run for both, alternating, in
# this one session (ratios need the same machine and moment). Logs go to OUTDIR.
# Usage: benchmarks/gpu_wheel_check.sh OUTDIR WHEEL TVM_FFI_WHEEL [BASE_WHEEL BASE_BENCH_OPS_PY]
set -u
out=$1 wheel=$2 tvm=$3 base=${4:-} base_bench=${5:-}
mkdir -p "$out"
repo=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheel" "$tvm"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 MLLM_KERNEL_CACHE_DIR=${MLLM_KERNEL_CACHE_DIR:-/tmp/mkc}
# Scripts run from copies outside the checkout, so `import mllm_kernel` finds the wheel.
mkdir -p /tmp/b/benchmarks && cp benchmarks/*.py /tmp/b/benchmarks/
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$out/gpu.txt"

(cd tests && MLLM_KERNEL_DISABLE_JIT=1 KERNELS_LIST_BZL=$repo/tools/kernels_list.bzl python3 -m pytest -q -p no:cacheprovider \
  kernels test_jit_add_constant.py test_op_fast_path.py test_hostile_inputs.py test_registry.py) > "$out/tests_nojit.log" 2>&1
echo "tests, JIT disabled: rc=$? $(tail -1 "$out/tests_nojit.log")"
(cd tests && MLLM_KERNEL_NVCC=${MLLM_KERNEL_NVCC:-/usr/local/cuda/bin/nvcc} python3 -m pytest -q -p no:cacheprovider \
  test_seed_examples.py test_damaged_module.py) > "$out/tests_jit.log" 2>&1
echo "JIT tests: rc=$? $(tail -1 "$out/tests_jit.log")"
MLLM_KERNEL_DISABLE_JIT=1 compute-sanitizer --tool memcheck python3 /tmp/b/benchmarks/sanitize_ops.py > "$out/sanitize.log" 2>&1
echo "sanitizer: rc=$? $(grep 'ERROR SUMMARY' "$out/sanitize.log")"

export MLLM_KERNEL_DISABLE_JIT=1
run_bench() {  # $1: label, $2: site, $3: bench_ops.py
  (cd /tmp && PYTHONPATH=$2 python3 /tmp/b/benchmarks/bench_call_overhead.py) > "$out/overhead_$1.txt" 2>&1
  (cd /tmp && PYTHONPATH=$2 python3 "$3" --no-compile --json "$out/bench_$1.json") > "$out/bench_$1.log" 2>&1
}
if [[ -n $base ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/base_site "$base" "$tvm"
  cp "$base_bench" /tmp/b/benchmarks/bench_ops_base.py
  for round in 1 2; do
    run_bench "base_$round" /tmp/base_site /tmp/b/benchmarks/bench_ops_base.py
    run_bench "new_$round" /tmp/site /tmp/b/benchmarks/bench_ops.py
  done
else
  run_bench new /tmp/site /tmp/b/benchmarks/bench_ops.py
fi
echo "benchmarks written to $out"
