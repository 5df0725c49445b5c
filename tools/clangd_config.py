"""bazel run //tools:clangd_config [-- --force]: write .clangd into the workspace (never overwrites
one unless asked), pointing at the workspace's headers and kernels, not at Bazel's runfiles copies."""
import os
import sys

from mllm_kernel.__main__ import main

if __name__ == "__main__":
    workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY")
    if not workspace:
        sys.exit("clangd_config: run it with `bazel run //tools:clangd_config`")
    os.environ.setdefault("MLLM_KERNEL_INCLUDE_ROOT", os.path.join(workspace, "include"))
    os.environ.setdefault("MLLM_KERNEL_SOURCE_ROOT", os.path.join(workspace, "kernels"))
    header = os.environ.pop("MLLM_KERNEL_HIGHWAY_HEADER", None)
    if header and "MLLM_KERNEL_HIGHWAY_ROOT" not in os.environ:
        # Resolved: the runfiles tree is rebuilt by Bazel; the external repository stays put.
        os.environ["MLLM_KERNEL_HIGHWAY_ROOT"] = os.path.dirname(os.path.dirname(os.path.realpath(header)))
    sys.exit(main(["show-clangd-recommend-config", "--output", workspace, *sys.argv[1:]]))
