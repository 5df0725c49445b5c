"""Exposes apache-tvm-ffi's C++ headers, DLPack headers and libtvm_ffi.so (all shipped inside its
pip wheel) as a cc_library-like target, so C++/CUDA modules build against the same tvm-ffi that
Python loads."""

def _tvm_ffi_cc_impl(ctx):
    files = ctx.attr.pkg[DefaultInfo].default_runfiles.files.to_list()
    headers, includes, libs = [], {}, []
    for f in files:
        for marker in ["/tvm_ffi/include/", "/tvm_ffi/3rdparty/dlpack/include/"]:
            idx = f.path.find(marker)
            if idx >= 0 and f.path.endswith(".h"):
                headers.append(f)
                includes[f.path[:idx + len(marker) - 1]] = True
        if f.path.endswith("/tvm_ffi/lib/libtvm_ffi.so"):
            libs.append(f)
    if not headers or len(libs) != 1:
        fail("tvm_ffi_cc: did not find tvm-ffi headers and libtvm_ffi.so in %s" % ctx.attr.pkg.label)

    cc_toolchain = ctx.attr._cc_toolchain[cc_common.CcToolchainInfo]
    feature_configuration = cc_common.configure_features(ctx = ctx, cc_toolchain = cc_toolchain)
    library = cc_common.create_library_to_link(
        actions = ctx.actions,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        dynamic_library = libs[0],
    )
    return [
        DefaultInfo(files = depset(headers + libs)),
        CcInfo(
            compilation_context = cc_common.create_compilation_context(
                headers = depset(headers),
                system_includes = depset(includes.keys()),
            ),
            linking_context = cc_common.create_linking_context(
                linker_inputs = depset([cc_common.create_linker_input(
                    owner = ctx.label,
                    libraries = depset([library]),
                )]),
            ),
        ),
    ]

tvm_ffi_cc = rule(
    implementation = _tvm_ffi_cc_impl,
    attrs = {
        "pkg": attr.label(mandatory = True, doc = "the apache-tvm-ffi py_library from pip.parse"),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)
