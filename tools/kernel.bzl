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

def _prebuild(ctx, device, tool, archs, cc_toolchain, highway_root):
    """One action: the package's `device` modules, built by `tool`, into their own tree."""
    tree = ctx.actions.declare_directory(ctx.label.name + "." + device)
    args = ctx.actions.args()
    args.add("--out", tree.path)
    args.add("--archs", ",".join(archs) if device == "cuda" else "")
    args.add("--devices", device)
    args.add("--module", ctx.attr.package)
    args.add("--attr", "SPECS")
    ctx.actions.run(
        executable = tool,
        arguments = [args],
        inputs = depset(ctx.files._highway_files + ctx.files._highway_header, transitive = [cc_toolchain.all_files]),
        tools = ctx.files._nvcc_files + [ctx.executable._nvcc],
        outputs = [tree],
        mnemonic = "KernelPrebuild",
        progress_message = "Prebuilding the %s modules of %%{label}" % device,
        env = {
            "CXX": _cxx_for_linking(cc_toolchain),
            # CPU modules without Highway search the toolkit's headers too (JitSpec.include_paths)
            "MLLM_KERNEL_NVCC": ctx.executable._nvcc.path,
            "MLLM_KERNEL_HIGHWAY_ROOT": highway_root,
            "PATH": "/usr/bin:/bin",
        },
    )
    return tree

def _prebuilt_modules_impl(ctx):
    # One action per device module (each with only its device's sources as inputs, through its
    # own aot tool), so that they run in parallel and a change to a kernel's CPU code does not
    # rebuild its CUDA module; then a cheap merge into the one tree the consumers read.
    tools = {"cpu": ctx.executable.cpu_aot_tool, "cuda": ctx.executable.cuda_aot_tool}
    enabled = {"cpu": ctx.attr._cpu_kernels[BuildSettingInfo].value, "cuda": ctx.attr._cuda_kernels[BuildSettingInfo].value}
    archs = ctx.attr._archs[BuildSettingInfo].value
    cc_toolchain = find_cpp_toolchain(ctx)
    highway_root = ctx.file._highway_header.dirname.rpartition("/")[0]
    parts = [
        _prebuild(ctx, device, tools[device], archs, cc_toolchain, highway_root)
        for device in ("cpu", "cuda")
        if enabled[device] and tools[device] != None
    ]

    tree = ctx.actions.declare_directory(ctx.label.name)
    args = ctx.actions.args()
    args.add("--out", tree.path)
    args.add_all(parts, expand_directories = False)
    ctx.actions.run(
        executable = ctx.executable._merge_tool,
        arguments = [args],
        inputs = parts,
        outputs = [tree],
        mnemonic = "KernelPrebuildMerge",
        progress_message = "Merging the prebuilt module trees of %{label}",
    )
    return [DefaultInfo(files = depset([tree])), PrebuiltInfo(tree = tree)]

prebuilt_modules = rule(
    implementation = _prebuilt_modules_impl,
    attrs = {
        "package": attr.string(mandatory = True, doc = "the Python package whose SPECS to prebuild"),
        "cpu_aot_tool": attr.label(executable = True, cfg = "exec", doc = "builds the package's CPU modules"),
        "cuda_aot_tool": attr.label(executable = True, cfg = "exec", doc = "builds the package's CUDA modules"),
        "_merge_tool": attr.label(default = "//tools:merge_prebuilt", executable = True, cfg = "exec"),
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
    Targets: :sources, :<name> (py_library), :prebuilt (module tree + manifest, merged from one
    prebuild action per device).
    """
    native.filegroup(
        name = "sources",
        srcs = native.glob(["*.cpp", "*.h", "*.hpp", "*.cuh"]),
        visibility = visibility,
    )

    # What each device's module compiles from (.hpp and .h: shared contracts), for its prebuild
    # action's inputs.
    native.filegroup(name = "cpu_sources", srcs = native.glob(["*.cpp", "*.h", "*.hpp"]))
    native.filegroup(name = "cuda_sources", srcs = native.glob(["*.cuh", "*.h", "*.hpp"]))
    py_library(
        name = name + "_python",
        srcs = native.glob(["*.py"]),
        deps = ["//mllm_kernel", requirement("torch")],
        visibility = ["//visibility:private"],
    )
    py_library(
        name = name,
        data = [":sources"],
        deps = [":" + name + "_python"],
        visibility = visibility,
    )
    for device in ("cpu", "cuda"):
        py_binary(
            name = "aot_" + device,
            srcs = ["//mllm_kernel:aot_main.py"],
            main = "//mllm_kernel:aot_main.py",
            data = [":%s_sources" % device],
            deps = [":" + name + "_python", "//mllm_kernel", requirement("torch")],
            visibility = ["//visibility:private"],
        )
    prebuilt_modules(
        name = "prebuilt",
        package = "mllm_kernel.kernels." + name,
        cpu_aot_tool = ":aot_cpu",
        cuda_aot_tool = ":aot_cuda",
        visibility = visibility,
    )
