"""Entry point of each kernel's Bazel prebuild tool (tools/kernel.bzl); see jit_utils/aot.py."""
import sys

from mllm_kernel.jit_utils.aot import main

if __name__ == "__main__":
    sys.exit(main())
