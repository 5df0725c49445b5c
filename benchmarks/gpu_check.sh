#!/usr/bin/env bash
# One GPU session: JIT-build every module, run the whole pytest suite on the GPU, run
# compute-sanitizer memcheck over each CUDA op, then the benchmarks. Writes logs to $1 (or $OUT).
# Needs: python3 with torch (CUDA), nvcc, g++; tvm-ffi importable (e.g. PYTHONPATH=/tmp/site).
# Usage: MLLM_KERNEL_HIGHWAY_ROOT=<dir with hwy/> benchmarks/gpu_check.sh OUTDIR [tests|sanitize|bench]...
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu_check}}; shift || true
steps=${*:-tests sanitize bench}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export MLLM_KERNEL_CACHE_DIR=${MLLM_KERNEL_CACHE_DIR:-/tmp/mllm_kernel_gpu_cache}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"

echo "== building every module (JIT, in parallel)"
python3 - <<'PY' > "$out/build.log" 2>&1; tail -n 5 "$out/build.log"
import importlib, time
from concurrent.futures import ThreadPoolExecutor
import mllm_kernel.kernels as kernels
specs = []
for name in kernels.names():
    module_specs = kernels.package(name).SPECS
    specs += list(module_specs.values()) if isinstance(module_specs, dict) else list(module_specs)
start = time.time()
with ThreadPoolExecutor(8) as pool:
    list(pool.map(lambda spec: spec.build(), specs))
print(f"built {len(specs)} modules in {time.time() - start:.0f}s")
PY

if [[ " $steps " == *" tests "* ]]; then
  echo "== pytest (GPU)"
  probe=/tmp/matcher_probe.so
  g++ -std=c++20 -O2 -fPIC -shared -fvisibility=hidden -Iinclude \
    -I"$(python3 -c 'import tvm_ffi.libinfo as l; print(l.find_include_path())')" \
    -I"$(python3 -c 'import tvm_ffi.libinfo as l; print(l.find_dlpack_include_path())')" \
    tests/cpp/matcher_probe.cc -L"$(dirname "$(python3 -c 'import tvm_ffi.libinfo as l; print(l.find_libtvm_ffi())')")" \
    -ltvm_ffi -Wl,--no-undefined -o "$probe"
  MLLM_KERNEL_MATCHER_PROBE=$probe python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels tests/test_jit_add_constant.py \
    tests/test_tensor_matcher.py tests/test_jit_runtime.py --tb=short 2>&1 > "$out/pytest.log"
  tail -n 40 "$out/pytest.log"
fi

if [[ " $steps " == *" sanitize "* ]]; then
  echo "== compute-sanitizer memcheck"
  compute-sanitizer --tool memcheck --error-exitcode 3 python3 benchmarks/sanitize_ops.py 2>&1 | tail -n 40 | tee "$out/sanitizer.log"
  echo "sanitizer exit code: ${PIPESTATUS[0]}" | tee -a "$out/sanitizer.log"
fi

if [[ " $steps " == *" bench "* ]]; then
  echo "== benchmarks"
  python3 benchmarks/bench_ops.py --markdown "$out/RESULTS.md" --json "$out/bench_ops.json" 2>&1 | tail -n 80 | tee "$out/bench.log"
  python3 benchmarks/bench_add_constant.py --json "$out/bench_add_constant.json" 2>&1 | tail -n 30 | tee -a "$out/bench.log"
fi
