"""Merges prebuilt module trees (one per device, from tools/kernel.bzl's prebuild actions) into
the one tree a kernel's :prebuilt target gives: every file of each part at the same place, one
manifest.json listing all their modules and one compile_commands.json with all their entries.

    merge_prebuilt.py --out TREE PART [PART ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

MANIFEST, COMMANDS = "manifest.json", "compile_commands.json"


def merge(out: Path, parts: list[Path]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    modules, commands = [], []
    for part in parts:
        manifest = json.loads((part / MANIFEST).read_text())
        if manifest.get("format") != 1:
            raise SystemExit(f"merge_prebuilt: {part}/{MANIFEST} has format {manifest.get('format')!r}, expected 1")
        modules += manifest["modules"]
        commands += json.loads((part / COMMANDS).read_text())
        for source in sorted(part.rglob("*")):
            relative = source.relative_to(part)
            if source.is_dir() or str(relative) in (MANIFEST, COMMANDS):
                continue
            target = out / relative
            if target.exists():
                raise SystemExit(f"merge_prebuilt: {relative} is in two parts")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    # The same form as jit_utils/prebuilt.py's write_manifest and aot.py's compile_commands.
    (out / MANIFEST).write_text(json.dumps({"format": 1, "modules": modules}, indent=1, sort_keys=True))
    (out / COMMANDS).write_text(json.dumps(commands, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("parts", nargs="*", type=Path)
    args = parser.parse_args(argv)
    merge(args.out, args.parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
