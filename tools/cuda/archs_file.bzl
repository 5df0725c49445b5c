"""Writes the configured //tools/cuda:archs to a file, so tests can check built modules against it."""

load("@bazel_skylib//rules:common_settings.bzl", "BuildSettingInfo")

def _cuda_archs_file_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".txt")
    ctx.actions.write(out, "\n".join(ctx.attr._archs[BuildSettingInfo].value) + "\n")
    return [DefaultInfo(files = depset([out]))]

cuda_archs_file = rule(
    implementation = _cuda_archs_file_impl,
    attrs = {"_archs": attr.label(default = "//tools/cuda:archs")},
)
