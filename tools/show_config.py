"""bazel run //tools:show_config: `python -m mllm_kernel show-config` on this build's prebuilt
modules, Highway tree and hermetic nvcc (see RUN_ENV in tools/BUILD.bazel)."""
import os
import subprocess
import sys

from mllm_kernel.__main__ import build_parser, show_config


def main() -> int:
    nvcc = os.path.abspath(os.environ["MLLM_KERNEL_NVCC"])
    hwy = subprocess.run([os.path.abspath(os.environ["HWY_TARGET_BIN"])], capture_output=True, text=True)
    target = hwy.stdout.strip() if hwy.returncode == 0 else f"probe failed: {hwy.stderr.strip()}"
    return show_config(build_parser().parse_args(["show-config"]), hermetic_nvcc=nvcc, simd_target=target)


if __name__ == "__main__":
    sys.exit(main())
