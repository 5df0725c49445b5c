"""mllm_kernel_library: one macro call declares a kernel (kernels/<op>/BUILD.bazel).

It declares the op's sources, its Python package as a py_library, and the prebuilt shared
modules of the package's SPECS (see mllm_kernel/jit_utils/aot.py), compiled at build time by the
runtime's own build code,
hermetically (the C++ toolchain's compiler with our Highway; the hermetic nvcc for the configured
--//tools/cuda:archs), into a tree laid out like the JIT cache with a manifest the runtime reads.
"""

load("@bazel_skylib//rules:common_settings.bzl", "BuildSettingInfo")
load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@pypi//:requirements.bzl", "requirement")
load("@rules_python//python:defs.bzl", "py_binary", "py_library")

PrebuiltInfo = provider(
    doc = "A kernel's prebuilt module tree (manifest.json + modules + compile_commands.json).",
    fields = {"tree": "the directory artifact"},
)

def _cxx_for_linking(cc_toolchain):
    # The autoconfigured toolchain names gcc; a shared C++ module links with g++.
    compiler = cc_toolchain.compiler_executable
    if compiler.endswith("/gcc"):
        return compiler[:-len("gcc")] + "g++"
    return compiler

def _prebuilt_modules_impl(ctx):
    tree = ctx.actions.declare_directory(ctx.label.name)
    devices = []
    if ctx.attr._cpu_kernels[BuildSettingInfo].value:
        devices.append("cpu")
    if ctx.attr._cuda_kernels[BuildSettingInfo].value:
        devices.append("cuda")
    archs = ctx.attr._archs[BuildSettingInfo].value
    cc_toolchain = find_cpp_toolchain(ctx)
    highway_root = ctx.file._highway_header.dirname.rpartition("/")[0]

    args = ctx.actions.args()
    args.add("--out", tree.path)
    args.add("--archs", ",".join(archs))
    args.add("--devices", ",".join(devices))
    args.add("--module", ctx.attr.package)
    args.add("--attr", "SPECS")
    ctx.actions.run(
        executable = ctx.executable.aot_tool,
        arguments = [args],
        inputs = depset(ctx.files._highway_files + ctx.files._highway_header, transitive = [cc_toolchain.all_files]),
        tools = ctx.files._nvcc_files + [ctx.executable._nvcc],
        outputs = [tree],
        mnemonic = "KernelPrebuild",
        progress_message = "Prebuilding kernel modules of %{label} (" + ",".join(devices) + ")",
        env = {
            "CXX": _cxx_for_linking(cc_toolchain),
            "MLLM_KERNEL_NVCC": ctx.executable._nvcc.path,
            "MLLM_KERNEL_HIGHWAY_ROOT": highway_root,
            "PATH": "/usr/bin:/bin",
        },
    )
    return [DefaultInfo(files = depset([tree])), PrebuiltInfo(tree = tree)]

prebuilt_modules = rule(
    implementation = _prebuilt_modules_impl,
    attrs = {
        "package": attr.string(mandatory = True, doc = "the Python package whose SPECS to prebuild"),
        "aot_tool": attr.label(mandatory = True, executable = True, cfg = "exec"),
        "_archs": attr.label(default = "//tools/cuda:archs"),
        "_cpu_kernels": attr.label(default = "//tools:cpu_kernels"),
        "_cuda_kernels": attr.label(default = "//tools:cuda_kernels"),
        "_highway_header": attr.label(default = "@highway//:hwy/highway.h", allow_single_file = True),
        "_highway_files": attr.label(default = "@highway//:jit_files"),
        "_nvcc": attr.label(default = "@cuda_toolkit//:nvcc", executable = True, cfg = "exec", allow_single_file = True),
        "_nvcc_files": attr.label(default = "@cuda_toolkit//:compiler_files", cfg = "exec"),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

def mllm_kernel_library(name, visibility = ["//visibility:public"]):
    """Declare the kernel in this folder, kernels/<name>/ (a BUILD file is this one call).

    Everything follows from the folder's layout: its C++/CUDA sources and headers (includable;
    compiled by the JIT runtime or prebuilt), its Python package mllm_kernel.kernels.<name>
    (every .py file), and the prebuilt modules of that package's SPECS attribute.
    Targets: :sources, :<name> (py_library), :prebuilt (module tree + manifest).
    """
    native.filegroup(
        name = "sources",
        srcs = native.glob(["*.cpp", "*.h", "*.hpp", "*.cuh"]),
        visibility = visibility,
    )
    py_library(
        name = name,
        srcs = native.glob(["*.py"]),
        data = [":sources"],
        deps = ["//mllm_kernel", requirement("torch")],
        visibility = visibility,
    )
    py_binary(
        name = "aot",
        srcs = ["//mllm_kernel:aot_main.py"],
        main = "//mllm_kernel:aot_main.py",
        deps = [":" + name, "//mllm_kernel", requirement("torch")],
        visibility = ["//visibility:private"],
    )
    prebuilt_modules(
        name = "prebuilt",
        package = "mllm_kernel.kernels." + name,
        aot_tool = ":aot",
        visibility = visibility,
    )
