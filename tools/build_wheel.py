"""Assemble the mllm_kernel wheel (run by the mllm_kernel_wheel rule in tools/wheel.bzl).

Writes OUT_DIR/mllm_kernel-<version>-py3-none-<platform>.whl. The zip is deterministic (sorted
entries, fixed timestamps and modes), so the same inputs give the same bytes. The platform tag is
manylinux_2_<N>_<arch>, 2.N being the newest GLIBC symbol version any prebuilt module needs (they
are linked against the build machine's glibc); with no module it is linux_<arch>.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import struct
import sys
import zipfile
from pathlib import Path

NAME = "mllm_kernel"  # the import / file-name form of the distribution name
DIST_NAME = "mllm-kernel"
SUMMARY = "CPU (Highway) and CUDA kernels for LLM inference, called from PyTorch through apache-tvm-ffi"
PREBUILT_DIR = f"{NAME}/_prebuilt"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can hold: reproducible


def read_version(init_py: Path) -> str:
    match = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", init_py.read_text(), re.M)
    if not match:
        raise SystemExit(f"build_wheel: no __version__ in {init_py}")
    return match.group(1)


def locked_version(lock: Path, package: str) -> str:
    match = re.search(rf"^{re.escape(package)}==([^\s\\]+)", lock.read_text(), re.M | re.I)
    if not match:
        raise SystemExit(f"build_wheel: {package} is not pinned in {lock}")
    return match.group(1)


# ----------------------------------------------------------------------------- glibc tag

SHT_GNU_VERNEED = 0x6FFFFFFE
EM_X86_64 = 62


def required_glibc(data: bytes, what: str) -> list[tuple[int, int]]:
    """The GLIBC_x.y versions an ELF64 little-endian shared object needs (.gnu.version_r)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SystemExit(f"build_wheel: {what} is not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    found = []
    for _name, sh_type, _flags, _addr, offset, _size, link, info, _align, _entsize in sections:
        if sh_type != SHT_GNU_VERNEED:
            continue
        strtab = sections[link][4]
        entry = offset
        for _ in range(info):  # sh_info: number of Verneed entries
            _version, count, _file, aux, next_entry = struct.unpack_from("<HHIII", data, entry)
            position = entry + aux
            for _ in range(count):
                _hash, _vflags, _other, name, next_aux = struct.unpack_from("<IHHII", data, position)
                text = data[strtab + name:data.index(b"\0", strtab + name)].decode()
                match = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)*", text)
                if match:
                    found.append((int(match.group(1)), int(match.group(2))))
                position += next_aux
            entry += next_entry
    return found


def elf_machine(data: bytes) -> int:
    return struct.unpack_from("<H", data, 0x12)[0]


def platform_tag(shared_objects: dict[str, bytes], arch: str) -> str:
    versions = []
    for path, data in shared_objects.items():
        if arch == "x86_64" and elf_machine(data) != EM_X86_64:
            raise SystemExit(f"build_wheel: {path} is not an x86_64 module")
        versions += required_glibc(data, path)
    if not versions:
        return f"linux_{arch}"
    major, minor = max(versions)
    return f"manylinux_{major}_{minor}_{arch}"


# ----------------------------------------------------------------------------- contents


def merge_prebuilt(trees: list[tuple[str, Path]]) -> dict[str, bytes]:
    """Each kernel's tree goes under _prebuilt/<op>/; only the modules its manifest names (no
    wrappers, build.json, locks, compile_commands). One manifest lists them all."""
    files: dict[str, bytes] = {}
    modules = []
    for op, tree in trees:
        manifest = json.loads((tree / "manifest.json").read_text())
        if manifest.get("format") != 1:
            raise SystemExit(f"build_wheel: {tree}/manifest.json has format {manifest.get('format')!r}, expected 1")
        for entry in manifest["modules"]:
            source = tree / entry["path"]
            if not source.is_file():
                raise SystemExit(f"build_wheel: {tree}/manifest.json names {entry['path']}, which is missing")
            relative = f"{op}/{entry['path']}"
            files[f"{PREBUILT_DIR}/{relative}"] = source.read_bytes()
            modules.append(dict(entry, path=relative))
    if trees:
        manifest = {"format": 1, "modules": modules}
        files[f"{PREBUILT_DIR}/manifest.json"] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    return files


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write_wheel(path: Path, files: dict[str, bytes], dist_info: str) -> None:
    names = sorted(files)
    record_name = f"{dist_info}/RECORD"
    record = "".join(f"{name},{record_hash(files[name])},{len(files[name])}\n" for name in names)
    record += f"{record_name},,\n"
    files = dict(files, **{record_name: record.encode()})
    # Package files first, dist-info last with RECORD at the very end (as wheel tools write it).
    order = [n for n in names if not n.startswith(dist_info + "/")]
    order += [n for n in names if n.startswith(dist_info + "/")] + [record_name]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in order:
            info = zipfile.ZipInfo(name, date_time=ZIP_DATE)
            mode = 0o755 if name.endswith(".so") else 0o644
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, files[name], compresslevel=9)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], fromfile_prefix_chars="@")
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--version", required=True, help="as Bazel knows it (tools/kernels_list.bzl)")
    parser.add_argument("--version-file", required=True, type=Path, help="mllm_kernel/__init__.py")
    parser.add_argument("--requirements-lock", required=True, type=Path)
    parser.add_argument("--license", default="UNKNOWN")
    parser.add_argument("--arch", default="x86_64")
    parser.add_argument("--file", action="append", default=[], help="WHEEL_PATH=SOURCE")
    parser.add_argument("--prebuilt", action="append", default=[], help="OP=TREE")
    args = parser.parse_args(argv)

    version = read_version(args.version_file)
    if version != args.version:
        raise SystemExit(f"build_wheel: {args.version_file} says {version}, tools/kernels_list.bzl says "
                         f"{args.version}; make them agree")
    tvm_ffi = locked_version(args.requirements_lock, "apache-tvm-ffi")

    files: dict[str, bytes] = {}
    for item in args.file:
        dest, _, source = item.partition("=")
        files[dest] = Path(source).read_bytes()
    files.update(merge_prebuilt([(op, Path(tree)) for op, _, tree in (p.partition("=") for p in args.prebuilt)]))

    tag = f"py3-none-{platform_tag({n: d for n, d in files.items() if n.endswith('.so')}, args.arch)}"
    dist_info = f"{NAME}-{version}.dist-info"
    files[f"{dist_info}/METADATA"] = "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {DIST_NAME}",
        f"Version: {version}",
        f"Summary: {SUMMARY}",
        f"License: {args.license}",
        "Requires-Python: >=3.10",
        "Requires-Dist: torch",
        # The prebuilt modules link this exact tvm-ffi ABI (and their keys hash its version).
        f"Requires-Dist: apache-tvm-ffi=={tvm_ffi}",
        "Requires-Dist: numpy",  # mllm_kernel.runtime takes NumPy arrays as kernel arguments
        # NVRTC: mllm_kernel.runtime compiles with it where no nvcc exists (the CUDA 13 build).
        "Provides-Extra: nvrtc",
        'Requires-Dist: nvidia-cuda-nvrtc>=13; extra == "nvrtc"',
        "",
    ]).encode()
    files[f"{dist_info}/WHEEL"] = "\n".join([
        "Wheel-Version: 1.0",
        "Generator: mllm_kernel tools/build_wheel.py",
        "Root-Is-Purelib: false",
        f"Tag: {tag}",
        "",
    ]).encode()

    args.out_dir.mkdir(parents=True, exist_ok=True)
    wheel = args.out_dir / f"{NAME}-{version}-{tag}.whl"
    write_wheel(wheel, files, dist_info)
    print(f"build_wheel: {wheel} ({len(files) + 1} files)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
