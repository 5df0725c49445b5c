"""mllm_kernel_wheel: the installable wheel (tools/build_wheel.py assembles it).

Layout inside the wheel (what mllm_kernel/jit_utils/config.py looks for):
  mllm_kernel/...                      the package's .py files
  mllm_kernel/kernels/<op>/...         each kernel's sources and Python wrapper
  mllm_kernel/include/mllm_kernel/...  our C++ headers (config.include_root)
  mllm_kernel/_vendor/highway/...      Highway headers, runtime sources, LICENSE (config.highway_root)
  mllm_kernel/_prebuilt/manifest.json  one manifest merging every kernel's :prebuilt tree, whose
  mllm_kernel/_prebuilt/<op>/...       module.so files are copied (nothing else of the trees);
                                       _prebuilt/runtime/ holds mllm_kernel.runtime's driver module
  mllm_kernel/runtime/*.fatbin         cubins built by cuda_cubin (runtime/prebuilt_kernels.py)

The platform tag depends on the glibc the prebuilt modules need, known only once they are built,
so the output is a directory: bazel-bin/<name>/mllm_kernel-<version>-py3-none-<platform>.whl.
"""

load("@rules_python//python:defs.bzl", "py_binary")
load("@system_python//:version.bzl", "HAS_HEADERS")
load("//tools:kernel.bzl", "PrebuiltInfo")

# mllm_kernel.runtime's launch extension (needs the interpreter's headers to build).
LAUNCH_EXTENSION = ["//mllm_kernel/runtime:_launch.abi3.so"] if HAS_HEADERS else []

def _wheel_path(f):
    """Where a main-repo file goes in the wheel."""
    path = f.short_path
    if path.startswith("mllm_kernel/"):
        return path
    if path.startswith("include/") or path.startswith("kernels/"):
        return "mllm_kernel/" + path
    fail("mllm_kernel_wheel: do not know where %s goes in the wheel" % path)

def _repo_relative(f):
    # External files' short_path is ../<repo>/<path>.
    path = f.short_path
    if path.startswith("../"):
        path = path.split("/", 2)[2]
    return path

def _wheel_impl(ctx):
    entries = {}  # wheel path -> source file path

    def add(dest, f):
        if dest in entries and entries[dest] != f.path:
            fail("mllm_kernel_wheel: %s comes from both %s and %s" % (dest, entries[dest], f.path))
        entries[dest] = f.path

    inputs = []
    for lib in ctx.attr.py_libs:
        # Only our own sources: the transitive set also holds torch & co. from @pypi.
        for f in lib[PyInfo].transitive_sources.to_list():
            if f.owner.workspace_name == "" and f.basename != "aot_main.py":
                add(_wheel_path(f), f)
                inputs.append(f)
    for f in ctx.files.data:
        add(_wheel_path(f), f)
        inputs.append(f)
    for f in ctx.files.highway:
        add("mllm_kernel/_vendor/highway/" + _repo_relative(f), f)
        inputs.append(f)

    out = ctx.actions.declare_directory(ctx.label.name)
    args = ctx.actions.args()
    args.use_param_file("@%s", use_always = True)
    args.set_param_file_format("multiline")
    args.add("--out-dir", out.path)
    args.add("--version", ctx.attr.version)
    args.add("--version-file", ctx.file.version_file)
    args.add("--requirements-lock", ctx.file.requirements_lock)
    args.add("--arch", ctx.attr.arch)
    args.add("--license", ctx.attr.license)
    for dest in sorted(entries):
        args.add("--file", dest + "=" + entries[dest])
    trees = []
    for target in ctx.attr.prebuilt:
        tree = target[PrebuiltInfo].tree
        args.add("--prebuilt", target.label.package.rpartition("/")[2] + "=" + tree.path)
        trees.append(tree)

    ctx.actions.run(
        executable = ctx.executable.builder,
        arguments = [args],
        inputs = inputs + trees + [ctx.file.version_file, ctx.file.requirements_lock],
        outputs = [out],
        mnemonic = "MllmKernelWheel",
        progress_message = "Assembling the mllm_kernel wheel %{output}",
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

_mllm_kernel_wheel = rule(
    implementation = _wheel_impl,
    attrs = {
        "py_libs": attr.label_list(providers = [PyInfo], doc = "the package and each kernel's py_library"),
        "data": attr.label_list(allow_files = True, doc = "headers and kernel sources"),
        "highway": attr.label_list(allow_files = True, doc = "Highway's files, vendored"),
        "prebuilt": attr.label_list(providers = [PrebuiltInfo], doc = "//kernels/<op>:prebuilt trees"),
        "version": attr.string(mandatory = True),
        "version_file": attr.label(allow_single_file = True, mandatory = True),
        "requirements_lock": attr.label(allow_single_file = True, mandatory = True),
        "arch": attr.string(default = "x86_64"),
        "license": attr.string(mandatory = True),
        "builder": attr.label(mandatory = True, executable = True, cfg = "exec"),
    },
)

def mllm_kernel_wheel(name, kernels, version, license = "UNKNOWN", visibility = ["//visibility:public"]):
    """The wheel of the package plus kernels (op names, folders under kernels/).

    license: the METADATA License field; the repository has no LICENSE file yet, hence UNKNOWN.
    """
    py_binary(
        name = name + "_builder",
        srcs = ["//tools:build_wheel.py"],
        main = "//tools:build_wheel.py",
        visibility = ["//visibility:private"],
    )
    _mllm_kernel_wheel(
        name = name,
        py_libs = ["//mllm_kernel", "//mllm_kernel/runtime"] + ["//kernels/%s" % op for op in kernels],
        data = [
            "//include:jit_files",
            "//mllm_kernel/runtime:sources",
            "//mllm_kernel/runtime:prebuilt_kernels",
        ] + LAUNCH_EXTENSION + ["//kernels/%s:sources" % op for op in kernels],
        highway = ["@highway//:jit_files"],
        prebuilt = ["//mllm_kernel/runtime:prebuilt"] + ["//kernels/%s:prebuilt" % op for op in kernels],
        version = version,
        license = license,
        builder = ":%s_builder" % name,
        version_file = "//mllm_kernel:__init__.py",
        requirements_lock = "//tools/python:requirements_lock.txt",
        visibility = visibility,
    )
