"""CUDA rules on the hermetic toolkit (@cuda_toolkit).

cuda_library compiles .cu sources with nvcc for the arch list in //tools/cuda:archs and returns a
CcInfo (an alwayslink static library), so cc_library / cc_binary link it like any C++ code.
cuda_shared_module links such a library into a shared module loadable by tvm_ffi.load_module.
cuda_cubin compiles one .cu source to a fatbin (a cubin per arch) for mllm_kernel.runtime.load_cubin.
"""

load("@bazel_skylib//rules:common_settings.bzl", "BuildSettingInfo")
load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

CudaCompileInfo = provider(
    doc = "How each .cu source was compiled (for compile_commands.json).",
    fields = {"commands": "list of struct(file, arguments, output)"},
)

def gencode_flags(archs):
    """sm_90a -> machine code for sm_90a; compute_90 -> PTX for compute_90."""
    flags = []
    for arch in archs:
        if arch.startswith("sm_"):
            flags.append("-gencode=arch=compute_%s,code=%s" % (arch[3:], arch))
        elif arch.startswith("compute_"):
            flags.append("-gencode=arch=%s,code=%s" % (arch, arch))
        else:
            fail("//tools/cuda:archs: %r is neither sm_XX[a] nor compute_XX" % arch)
    return flags

# What every rule that runs the hermetic nvcc needs: the arch list, nvcc, its tree, the C++
# toolchain (nvcc's host compiler).
_NVCC_ATTRS = {
        "_archs": attr.label(default = "//tools/cuda:archs"),
        "_nvcc": attr.label(
            default = "@cuda_toolkit//:nvidia/cu13/bin/nvcc",
            executable = True,
            cfg = "exec",
            allow_single_file = True,
        ),
        "_toolkit": attr.label(default = "@cuda_toolkit//:compiler_files", cfg = "exec"),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
}

def _cuda_library_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    feature_configuration = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    deps_cc = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps])
    dep_ctx = deps_cc.compilation_context
    archs = ctx.attr._archs[BuildSettingInfo].value
    nvcc = ctx.executable._nvcc

    common = [
        "-ccbin",
        cc_toolchain.compiler_executable,
        "-std=c++20",
        "-O3",
        "-Xcompiler=-fPIC,-fvisibility=hidden",
        "--expt-relaxed-constexpr",
    ] + gencode_flags(archs) + ctx.attr.copts
    for inc in depset(transitive = [dep_ctx.includes, dep_ctx.quote_includes, dep_ctx.system_includes]).to_list() + ["."]:
        common += ["-I", inc]
    for d in dep_ctx.defines.to_list():
        common.append("-D" + d)

    inputs = depset(ctx.files.srcs + ctx.files.hdrs, transitive = [dep_ctx.headers, cc_toolchain.all_files])
    objects, commands = [], []
    for src in ctx.files.srcs:
        if not src.basename.endswith(".cu"):
            continue
        obj = ctx.actions.declare_file("_objs/%s/%s.o" % (ctx.label.name, src.basename[:-3]))

        # -frandom-seed makes the object reproducible (same bytes for the same inputs).
        arguments = common + ["-Xcompiler=-frandom-seed=" + obj.path, "-c", src.path, "-o", obj.path]
        ctx.actions.run(
            executable = nvcc,
            arguments = arguments,
            inputs = inputs,
            tools = ctx.files._toolkit,
            outputs = [obj],
            mnemonic = "CudaCompile",
            progress_message = "Compiling CUDA %{input} for " + ",".join(archs),
            env = {"PATH": "/usr/bin:/bin"},  # no system CUDA: nvcc finds its tree from nvcc.profile
        )
        objects.append(obj)
        commands.append(struct(file = src.path, arguments = [nvcc.path] + arguments, output = obj.path))

    archive = ctx.actions.declare_file("lib%s.a" % ctx.label.name)
    ctx.actions.run(
        executable = cc_toolchain.ar_executable,
        arguments = ["rcsD", archive.path] + [o.path for o in objects],
        inputs = depset(objects, transitive = [cc_toolchain.all_files]),
        outputs = [archive],
        mnemonic = "CudaArchive",
    )
    library = cc_common.create_library_to_link(
        actions = ctx.actions,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        pic_static_library = archive,
        alwayslink = True,
    )
    own = CcInfo(
        compilation_context = cc_common.create_compilation_context(headers = depset(ctx.files.hdrs)),
        linking_context = cc_common.create_linking_context(linker_inputs = depset([
            cc_common.create_linker_input(owner = ctx.label, libraries = depset([library])),
        ])),
    )
    return [
        DefaultInfo(files = depset([archive])),
        cc_common.merge_cc_infos(direct_cc_infos = [own], cc_infos = [deps_cc]),
        CudaCompileInfo(commands = commands),
    ]

cuda_library = rule(
    implementation = _cuda_library_impl,
    attrs = dict({
        "srcs": attr.label_list(allow_files = [".cu", ".cuh", ".h", ".hpp"]),
        "hdrs": attr.label_list(allow_files = [".cuh", ".h", ".hpp"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    }, **_NVCC_ATTRS),
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

def cuda_shared_module(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    """A shared module (name + ".so") of CUDA sources, with static cudart and tvm-ffi."""
    cuda_library(
        name = name + "_objs",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        visibility = ["//visibility:private"],
    )
    native.cc_binary(
        name = name + ".so",
        linkshared = True,
        linkopts = ["-Wl,--no-undefined"],
        deps = [":" + name + "_objs", "@cuda_toolkit//:cudart_static"] + deps,
        visibility = visibility,
        **kwargs
    )

def _cuda_cubin_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    archs = ctx.attr._archs[BuildSettingInfo].value
    out = ctx.actions.declare_file(ctx.label.name + ".fatbin")
    arguments = [
        "-ccbin",
        cc_toolchain.compiler_executable,
        "-fatbin",
        "-O3",
        "-I",
        ".",
    ] + gencode_flags(archs) + ctx.attr.copts + [ctx.file.src.path, "-o", out.path]
    ctx.actions.run(
        executable = ctx.executable._nvcc,
        arguments = arguments,
        inputs = depset([ctx.file.src] + ctx.files.hdrs, transitive = [cc_toolchain.all_files]),
        tools = ctx.files._toolkit,
        outputs = [out],
        mnemonic = "CudaCubin",
        progress_message = "Compiling cubins of %{input} for " + ",".join(archs),
        env = {"PATH": "/usr/bin:/bin"},
    )
    return [DefaultInfo(files = depset([out]))]

cuda_cubin = rule(
    implementation = _cuda_cubin_impl,
    doc = """<name>.fatbin: the kernels of one .cu source as machine code for every configured arch
(//tools/cuda:archs; compute_XX entries embed PTX). mllm_kernel.runtime.load_cubin launches them
through the driver API alone: no compiler, no CUDA runtime.""",
    attrs = dict({
        "src": attr.label(allow_single_file = [".cu"], mandatory = True),
        "hdrs": attr.label_list(allow_files = [".cuh", ".h", ".hpp"]),
        "copts": attr.string_list(),
    }, **_NVCC_ATTRS),
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)
