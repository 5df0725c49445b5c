"""bazel run //tools:show_env: the environment report, with the hermetic nvcc and Highway's
dispatch target from this build."""
import os
import subprocess
import sys

from mllm_kernel import env_info


def main() -> int:
    nvcc = os.path.abspath(os.environ["HERMETIC_NVCC"])
    hwy = subprocess.run([os.path.abspath(os.environ["HWY_TARGET_BIN"])], capture_output=True, text=True)
    target = hwy.stdout.strip() if hwy.returncode == 0 else f"probe failed: {hwy.stderr.strip()}"
    print(env_info.format_rows(env_info.collect(hermetic_nvcc=nvcc, simd_target=target)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
