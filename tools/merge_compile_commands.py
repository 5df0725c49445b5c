"""Merge compile_commands fragments (tools/compile_commands.bzl) into one compile_commands.json.

Runs unsandboxed, so the working directory is Bazel's execution root: every path in the fragments
(and in the prebuilt trees' compile_commands.json, written by actions with the same working
directory layout) is relative to it, and it becomes each entry's `directory`.
"""

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--fragment", action="append", default=[])
    parser.add_argument("--prebuilt", action="append", default=[], help="a prebuilt tree")
    args = parser.parse_args(argv)

    execroot = os.getcwd()
    sources = list(args.fragment) + [os.path.join(tree, "compile_commands.json") for tree in args.prebuilt]
    merged, seen = [], set()
    for source in sources:
        if not os.path.isfile(source):  # e.g. a prebuilt tree built with no devices
            continue
        with open(source) as f:
            for entry in json.load(f):
                # One entry per file: the same source compiled twice (pic / non-pic, one per
                # template instance) would only make clangd pick arbitrarily.
                # Sources are reached through execroot / runfiles symlinks; clangd matches the
                # path the editor opened, i.e. the file in the workspace, so name that one.
                real = os.path.realpath(os.path.join(execroot, entry["file"]))
                if real in seen:
                    continue
                seen.add(real)
                arguments = [real if arg == entry["file"] else arg for arg in entry["arguments"]]
                merged.append({"directory": execroot, "file": real, "arguments": arguments})
    with open(args.out, "w") as f:
        json.dump(merged, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
