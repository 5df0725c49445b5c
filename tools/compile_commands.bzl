"""compile_commands: one compile_commands.json (for clangd) covering the given targets and their deps.

An aspect walks deps/data/srcs and writes, per target of this repository, a JSON fragment with the
compile commands Bazel actually ran: C++ actions' argv, our nvcc commands (CudaCompileInfo) turned
into clang's CUDA mode, and the compile_commands.json that each kernel's prebuilt tree already
carries (PrebuiltInfo). tools/merge_compile_commands.py merges them, unsandboxed, so that it can
name the real execution root as every entry's `directory`.

    bazel build //:compile_commands && ln -sf bazel-bin/compile_commands.json .
"""

load("//tools:kernel.bzl", "PrebuiltInfo")
load("//tools/cuda:defs.bzl", "CudaCompileInfo")

CompileCommandsInfo = provider(
    doc = "Transitive compile command sources.",
    fields = {
        "fragments": "depset of JSON files, each a list of {file, arguments}",
        "prebuilt_trees": "depset of prebuilt tree artifacts (compile_commands.json inside)",
    },
)

_ATTRS = ["deps", "data", "srcs"]

# nvcc flags that take the next argument as their value and mean nothing to clang.
_NVCC_DROP_WITH_VALUE = ["-ccbin", "-o", "-gencode", "--generate-code", "-arch", "-Xcompiler"]

def _source_of(argv):
    for i in range(len(argv) - 1):
        if argv[i] == "-c":
            return argv[i + 1]
    return None

def _clang_cuda_command(nvcc_args, source):
    """nvcc argv -> clang++ -x cuda argv with the same includes, defines, standard and GPU archs."""
    nvcc = nvcc_args[0]

    # <toolkit>/bin/nvcc: clang finds headers (and would find libdevice) under <toolkit>.
    cuda_path = nvcc.rpartition("/")[0].rpartition("/")[0]
    archs, keep = [], []
    args = nvcc_args[1:]
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg in _NVCC_DROP_WITH_VALUE or arg == "-c":
            skip = True
            if arg in ("-gencode", "--generate-code") and i + 1 < len(args):
                archs.append(args[i + 1])
            continue
        if arg.startswith("-gencode=") or arg.startswith("--generate-code="):
            archs.append(arg.partition("=")[2])
        elif arg in ("-I", "-D"):
            skip = True
            if i + 1 < len(args):
                keep.append(arg + args[i + 1])
        elif arg in ("-isystem", "-include"):
            skip = True
            if i + 1 < len(args):
                keep += [arg, args[i + 1]]
        elif arg.startswith("-I") or arg.startswith("-D") or arg.startswith("-std=") or arg.startswith("-O"):
            keep.append(arg)

    # "arch=compute_90,code=sm_90a" -> sm_90a; PTX-only entries (code=compute_90) -> sm_90.
    gpu_archs = []
    for spec in archs:
        code = spec.partition("code=")[2].strip("\"'")
        for name in code.split(","):
            name = name.strip("[]")
            if name.startswith("compute_"):
                name = "sm_" + name[len("compute_"):]
            if name.startswith("sm_") and name not in gpu_archs:
                gpu_archs.append(name)
    return (
        ["clang++", "-x", "cuda", "--cuda-path=" + cuda_path] +
        ["--cuda-gpu-arch=" + a for a in gpu_archs] +
        # Parsing only: no libdevice needed, and CUDA 13 is newer than most clangs know.
        ["-nocudalib", "--no-cuda-version-check"] +
        keep + ["-c", source]
    )

def _compile_commands_aspect_impl(target, ctx):
    fragments, trees = [], []
    entries = []

    # External repositories (Highway, toolchains) are left out: the database is for our sources.
    if target.label.workspace_name == "":
        for action in target.actions:
            if action.mnemonic != "CppCompile" or not action.argv:
                continue
            source = _source_of(action.argv)
            if source:
                entries.append({"file": source, "arguments": action.argv})
        if CudaCompileInfo in target:
            for command in target[CudaCompileInfo].commands:
                entries.append({"file": command.file, "arguments": _clang_cuda_command(command.arguments, command.file)})
        if PrebuiltInfo in target:
            trees.append(target[PrebuiltInfo].tree)
    if entries:
        fragment = ctx.actions.declare_file(ctx.label.name + ".compile_commands_fragment.json")
        ctx.actions.write(fragment, json.encode(entries))
        fragments.append(fragment)

    transitive_fragments, transitive_trees = [], []
    for attr in _ATTRS:
        for dep in getattr(ctx.rule.attr, attr, None) or []:
            if type(dep) == "Target" and CompileCommandsInfo in dep:
                transitive_fragments.append(dep[CompileCommandsInfo].fragments)
                transitive_trees.append(dep[CompileCommandsInfo].prebuilt_trees)
    return [CompileCommandsInfo(
        fragments = depset(fragments, transitive = transitive_fragments),
        prebuilt_trees = depset(trees, transitive = transitive_trees),
    )]

compile_commands_aspect = aspect(
    implementation = _compile_commands_aspect_impl,
    attr_aspects = _ATTRS,
)

def _compile_commands_impl(ctx):
    fragments = depset(transitive = [t[CompileCommandsInfo].fragments for t in ctx.attr.targets])
    trees = depset(transitive = [t[CompileCommandsInfo].prebuilt_trees for t in ctx.attr.targets])
    out = ctx.actions.declare_file(ctx.label.name + ".json")
    args = ctx.actions.args()
    args.add("--out", out)
    args.add_all(fragments, before_each = "--fragment")
    args.add_all(trees, before_each = "--prebuilt", expand_directories = False)
    ctx.actions.run(
        executable = ctx.executable._merge,
        arguments = [args],
        inputs = depset(transitive = [fragments, trees]),
        outputs = [out],
        mnemonic = "CompileCommands",
        progress_message = "Writing %{output}",
        # Unsandboxed, so the working directory is the real execroot that clangd must resolve
        # paths against; never remote, where that directory would be another machine's.
        execution_requirements = {"no-sandbox": "1", "no-remote": "1"},
    )
    return [DefaultInfo(files = depset([out]))]

compile_commands = rule(
    implementation = _compile_commands_impl,
    doc = "Writes <name>.json: the compile commands of `targets` and their dependencies.",
    attrs = {
        "targets": attr.label_list(aspects = [compile_commands_aspect]),
        "_merge": attr.label(default = "//tools:merge_compile_commands", executable = True, cfg = "exec"),
    },
)
