"""The system python3 as Bazel's Python toolchain (rules_python's hermetic interpreters download
from the network, which these machines cannot reach)."""

def _system_python_repo_impl(rctx):
    python = rctx.which("python3")
    if not python:
        fail("system_python: no python3 on PATH")

    # Resolve shims (pyenv) to the real interpreter, and record its version for the README/show_env.
    res = rctx.execute([python, "-c", "import sys, sysconfig; print(sys.executable); print('%d.%d' % sys.version_info[:2]); print(sysconfig.get_paths()['include'])"])
    if res.return_code != 0:
        fail("system_python: %s failed: %s" % (python, res.stderr))
    executable, version, include = res.stdout.strip().split("\n")

    # Its C headers, for extension modules built against the stable ABI (Py_LIMITED_API): they
    # load in any CPython >= the version their code names, so this interpreter's headers do.
    has_headers = rctx.path(include + "/Python.h").exists
    if has_headers:
        rctx.symlink(include, "include")
    rctx.file("BUILD.bazel", """\
load("@rules_python//python:defs.bzl", "py_runtime", "py_runtime_pair")

py_runtime(
    name = "py3_runtime",
    interpreter_path = "{executable}",
    python_version = "PY3",
    visibility = ["//visibility:public"],
)

py_runtime_pair(name = "runtime_pair", py3_runtime = ":py3_runtime")

toolchain(
    name = "toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)

# Empty when the interpreter has no headers (no python3-dev): targets using it check HAS_HEADERS.
cc_library(
    name = "python_headers",
    hdrs = glob(["include/**/*.h"]),
    includes = ["include"],
    visibility = ["//visibility:public"],
)
""".format(executable = executable))
    rctx.file("version.bzl", "PYTHON_EXECUTABLE = %r\nPYTHON_VERSION = %r\nHAS_HEADERS = %r\n" % (executable, version, has_headers))

system_python_repo = repository_rule(
    implementation = _system_python_repo_impl,
    environ = ["PATH"],
    local = True,
)

def _system_python_impl(_mctx):
    system_python_repo(name = "system_python")

system_python = module_extension(implementation = _system_python_impl)
