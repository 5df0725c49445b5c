"""The parameters of an `extern "C" __global__` function, read from its declaration in the source.

A launch converts each Python argument to the parameter's declared C type, so the types must be
known before any launch: they come from the text (no compiler involved), and the driver's
cuFuncGetParamInfo cross-checks the sizes once the function is loaded (kernel.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# C spelling -> (struct format, size, torch dtype name of a matching element, kind).
# kind: "int", "uint", "float", "bool", "half", "bf16". `long` is 64-bit (LP64 Linux).
_SCALARS: dict[str, tuple[str, int, str, str]] = {}


def _scalar(spellings: str, fmt: str, size: int, dtype: str, kind: str) -> None:
    for spelling in spellings.split(","):
        _SCALARS[spelling.strip()] = (fmt, size, dtype, kind)


_scalar("float", "f", 4, "float32", "float")
_scalar("double", "d", 8, "float64", "float")
_scalar("__half, half", "e", 2, "float16", "half")
_scalar("__nv_bfloat16, nv_bfloat16", "H", 2, "bfloat16", "bf16")
_scalar("bool", "?", 1, "bool", "bool")
_scalar("char, signed char, int8_t", "b", 1, "int8", "int")
_scalar("unsigned char, uint8_t", "B", 1, "uint8", "uint")
_scalar("short, short int, signed short, int16_t", "h", 2, "int16", "int")
_scalar("unsigned short, unsigned short int, uint16_t", "H", 2, "uint16", "uint")
_scalar("int, signed, signed int, int32_t", "i", 4, "int32", "int")
_scalar("unsigned, unsigned int, uint32_t", "I", 4, "uint32", "uint")
_scalar("long, long int, long long, long long int, signed long long, int64_t, ptrdiff_t, intptr_t", "q", 8, "int64", "int")
_scalar("unsigned long, unsigned long long, unsigned long long int, uint64_t, size_t, uintptr_t", "Q", 8, "uint64", "uint")

# Vector types a pointer may point to: (element dtype name, alignment the pointer needs).
_VECTORS: dict[str, tuple[str, int]] = {}
for _base, _dtype, _size in (("float", "float32", 4), ("double", "float64", 8), ("int", "int32", 4),
                             ("uint", "uint32", 4), ("longlong", "int64", 8), ("char", "int8", 1),
                             ("uchar", "uint8", 1), ("short", "int16", 2), ("ushort", "uint16", 2)):  # fmt: skip
    for _lanes in (2, 4):
        _VECTORS[f"{_base}{_lanes}"] = (_dtype, min(16, _size * _lanes))
_VECTORS.update({"__half2": ("float16", 4), "half2": ("float16", 4), "__nv_bfloat162": ("bfloat16", 4),
                 "nv_bfloat162": ("bfloat16", 4)})  # fmt: skip

_DROPPED_WORDS = {"__restrict__", "__restrict", "restrict", "__grid_constant__", "volatile", "struct", "register"}
_ATTRIBUTES_WITH_ARGS = {"__launch_bounds__", "__cluster_dims__", "__maxnreg__", "__attribute__", "__declspec", "alignas"}


class SignatureError(ValueError):
    """The source does not declare the kernel in a form the runtime can read."""


@dataclass(frozen=True)
class Param:
    """One kernel parameter as declared.

    pointer: a pointer (or array) parameter; `base` is then the pointee type.
    const: the pointee is const, so the kernel only reads it (a NumPy argument is not copied back).
    base: the C type with qualifiers removed and spaces normalized ("unsigned int", "float4").
    pointer_depth: 2 for `float**` (it takes a tensor of int64/uint64 addresses).
    """

    name: str
    base: str
    pointer: bool
    const: bool
    pointer_depth: int = 0

    @property
    def spelling(self) -> str:
        stars = "*" * self.pointer_depth
        return f"{'const ' if self.const else ''}{self.base}{stars}"

    @property
    def scalar(self) -> tuple[str, int, str, str] | None:
        """(struct format, size, dtype name, kind) of a by-value scalar, None for anything else."""
        return None if self.pointer else _SCALARS.get(self.base)

    def element_dtypes(self) -> tuple[str, ...] | None:
        """Names of the torch dtypes a pointer parameter accepts; None: any (void*, unknown structs)."""
        if self.pointer_depth > 1:
            return ("int64", "uint64")
        if self.base in _VECTORS:
            return (_VECTORS[self.base][0],)
        if self.base == "char":
            return ("int8", "uint8", "bool")  # plain char*: bytes of any kind
        scalar = _SCALARS.get(self.base)
        return (scalar[2],) if scalar else None

    def alignment(self) -> int:
        """Byte alignment a pointer argument must have (vector types need their width)."""
        if self.pointer_depth == 1 and self.base in _VECTORS:
            return _VECTORS[self.base][1]
        return 1


def strip_comments(source: str) -> str:
    """The source with comments replaced by spaces (string and char literals kept as they are)."""

    def replace(match: re.Match) -> str:
        text = match.group(0)
        if text.startswith("/"):
            return re.sub(r"[^\n]", " ", text)  # keep line structure
        return text

    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', replace, source, flags=re.S)


def _matching_paren(text: str, open_index: int) -> int:
    depth = 0
    for index in range(open_index, len(text)):
        if text[index] == "(":
            depth += 1
        elif text[index] == ")":
            depth -= 1
            if depth == 0:
                return index
    raise SignatureError("unbalanced parentheses in a kernel declaration")


_WORD = re.compile(r"[A-Za-z_]\w*")


def _declared_name(text: str, start: int) -> tuple[str, int] | None:
    """From just after `__global__`: (function name, index of its '(') skipping attributes."""
    index = start
    last_word = None
    while index < len(text):
        char = text[index]
        if char.isspace():
            index += 1
            continue
        match = _WORD.match(text, index)
        if match:
            word = match.group(0)
            index = match.end()
            if word in _ATTRIBUTES_WITH_ARGS:
                while index < len(text) and text[index].isspace():
                    index += 1
                if index < len(text) and text[index] == "(":
                    index = _matching_paren(text, index) + 1
                continue
            last_word = word
            continue
        if char == "(":
            return (last_word, index) if last_word else None
        if char in ";{}=":
            return None
        index += 1  # '*', ':', '<' ...
    return None


def _extern_c_blocks(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of every `extern "C" { ... }` block."""
    blocks = []
    for match in re.finditer(r'extern\s*"C"\s*\{', text):
        depth = 0
        for index in range(match.end() - 1, len(text)):
            if text[index] == "{":
                depth += 1
            elif text[index] == "}":
                depth -= 1
                if depth == 0:
                    blocks.append((match.end(), index))
                    break
    return blocks


def find_kernels(source: str) -> dict[str, tuple[str, bool]]:
    """Every __global__ function of `source`: name -> (parameter list text, declared extern "C")."""
    text = strip_comments(source)
    blocks = _extern_c_blocks(text)
    kernels: dict[str, tuple[str, bool]] = {}
    for match in re.finditer(r"\b__global__\b", text):
        found = _declared_name(text, match.end())
        if found is None:
            continue
        name, open_index = found
        params = text[open_index + 1 : _matching_paren(text, open_index)]
        head_start = max(text.rfind(ch, 0, match.start()) for ch in ";{}") + 1
        extern_c = bool(re.search(r'extern\s*"C"', text[head_start : match.start()])) or any(
            start <= match.start() < end for start, end in blocks
        )
        kernels.setdefault(name, (params, extern_c))  # a forward declaration comes first
    return kernels


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        if char in "(<[":
            depth += 1
        elif char in ")>]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts]


def parse_param(text: str, index: int) -> Param:
    """One parameter declaration, e.g. `const float* __restrict__ x` or `unsigned n`."""
    declaration = text.split("=", 1)[0].strip()  # a default argument does not change the type
    arrays = declaration.count("[")
    declaration = re.sub(r"\[[^\]]*\]", "", declaration)
    if "&" in declaration:
        raise SignatureError(f"parameter {index} ({text!r}) is a reference; kernels take values and pointers")
    tokens = re.findall(r"[A-Za-z_][\w:]*|\*", declaration)
    tokens = [t.removeprefix("::").removeprefix("std::") for t in tokens if t not in _DROPPED_WORDS]
    depth = tokens.count("*") + arrays
    first_star = tokens.index("*") if "*" in tokens else len(tokens)
    const = depth > 0 and "const" in tokens[:first_star]
    words = [t for t in tokens if t not in ("*", "const")]
    if not words:
        raise SignatureError(f"cannot read the type of parameter {index} ({text!r})")
    # The last word names the parameter unless the words left form a known type without it.
    if len(words) > 1 and not (" ".join(words) in _SCALARS and depth == 0 and words[-1] in ("int", "long", "short", "char", "signed", "unsigned")):
        name, type_words = words[-1], words[:-1]
    else:
        name, type_words = f"arg{index}", words
    return Param(name=name, base=" ".join(type_words), pointer=depth > 0, const=const, pointer_depth=depth)


def parse_signature(source: str, name: str) -> list[Param]:
    """The parameters of kernel `name`, declared `extern "C" __global__` in `source` (whole CUDA
    source, or just the declaration)."""
    kernels = find_kernels(source)
    if name not in kernels:
        listed = ", ".join(sorted(kernels)) or "none"
        raise SignatureError(f"no __global__ function named {name!r} in the source (kernels found: {listed})")
    params_text, extern_c = kernels[name]
    if not extern_c:
        raise SignatureError(
            f'kernel {name!r} is not declared extern "C": its symbol name is mangled, so the driver '
            f'cannot find it by name; declare it `extern "C" __global__ void {name}(...)`'
        )
    params_text = params_text.strip()
    if params_text in ("", "void"):
        return []
    params = [parse_param(part, index) for index, part in enumerate(_split_top_level(params_text))]
    seen: set[str] = set()
    for param in params:
        if param.name in seen:
            raise SignatureError(f"kernel {name!r} declares parameter {param.name!r} twice")
        seen.add(param.name)
    return params
