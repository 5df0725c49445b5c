"""CompiledKernel: a cubin's kernel, launched from Python through the driver API.

A launch converts each argument to its parameter's declared type (signature.py), packs the
launch configuration and the values into one record and hands the record's address to
driver.cpp's Launch (cuLaunchKernelEx). The common launch (default configuration, CUDA tensors
of the declared dtypes, Python scalars in range) goes through one C call, the extension's
fast_launch, which builds the record on its stack; every other launch takes the general path
here, which packs a per-thread record with struct.pack_into. Everything that can be checked is
checked before the launch, naming the parameter.

Arguments:
- pointer parameters: a CUDA torch tensor (its data pointer; the dtype must match the pointee,
  `void*` and unknown structs take any), a NumPy array (copied to the GPU before the launch and,
  unless the pointee is `const`, back after it, so the call then waits for the kernel), or None
  (a null pointer). `T**` takes a tensor of int64/uint64 addresses.
- scalars: Python/NumPy int, float, bool, converted to the declared C type (range-checked).
- structs by value: bytes of exactly the parameter's size (the driver's cuFuncGetParamInfo).
"""

from __future__ import annotations

import ctypes
import math
import numbers
import struct
import threading
from collections.abc import Sequence
from typing import Any

import numpy
import torch

from . import driver
from .signature import Param

# driver.cpp's LaunchRecord: grid[3] block[3] shared_mem cluster[3] params_offset unused |
# context function stream
RECORD_HEAD = "12I3Q"
RECORD_HEAD_SIZE = 72
RECORD_CALL_OFFSET = 48  # where context, function, stream start: what a default launch packs
_POINTER, _SCALAR, _BF16, _OPAQUE = range(4)
_FAST_RECORD_CAPACITY = 8192  # launch_ext.c's kRecordCapacity
_DEFAULT_DYNAMIC_SHARED = 48 * 1024  # what a kernel may use without opting in
_MAX_BLOCK = (1024, 1024, 64)
_MAX_GRID = (2**31 - 1, 65535, 65535)
_get_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _exchange_dtypes(dtypes: tuple) -> tuple | None:
    """The fast path's accepted dtypes as DLPack codes (bytes of the extension's packed uint32s
    per pointer parameter), for reading tensors through torch's DLPack C exchange API; None where
    torch has none (before 2.10) or cannot export one of the dtypes, and the fast path then reads
    torch's attributes. The codes come from torch's own export of an empty tensor of each dtype."""
    try:
        from . import _launch
    except ImportError:
        return None
    if not _launch.set_exchange(getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)):
        return None
    try:
        return tuple(None if accepted is None else
                     b"".join(struct.pack("=I", _launch.exchange_dtype(torch.empty(0, dtype=d))) for d in accepted)
                     for accepted in dtypes)  # fmt: skip
    except Exception:  # noqa: BLE001 - a dtype torch cannot export: attributes instead
        return None


class KernelArgumentError(TypeError):
    """An argument does not fit its kernel parameter (raised before anything is launched)."""


def _current_device() -> int:
    try:
        return torch.cuda.current_device()
    except (AssertionError, RuntimeError) as error:  # torch without CUDA, or no GPU
        raise RuntimeError(f"mllm_kernel.runtime: no CUDA device to launch on ({error})") from None


def _dims(value: Any, what: str, limits: Sequence[int]) -> tuple[int, int, int]:
    """(x, y, z) from an int or a 1-3 tuple of positive ints, within `limits`."""
    dims = (value,) if isinstance(value, numbers.Integral) else tuple(value) if isinstance(value, (tuple, list)) else None
    if dims is None or not 1 <= len(dims) <= 3 or not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in dims):
        raise ValueError(f"{what} must be an int or a tuple of 1-3 ints, got {value!r}")
    dims = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    for axis, (dim, limit) in enumerate(zip(dims, limits)):
        if not 1 <= dim <= limit:
            raise ValueError(f"{what}={value!r}: dimension {'xyz'[axis]} must be in [1, {limit}], got {dim}")
    return dims


def _bf16_bits(value: float) -> int:
    """float -> bfloat16 bits, rounding to nearest even (NaN stays NaN)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x7FFFFF:
        return (bits >> 16) | 0x40
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


_TORCH_DTYPES = {name: getattr(torch, name) for name in
                 ("float32", "float64", "float16", "bfloat16", "bool", "int8", "uint8", "int16", "uint16",
                  "int32", "uint32", "int64", "uint64") if hasattr(torch, name)}  # fmt: skip
_ALIGN = {"b": 1, "B": 1, "?": 1, "h": 2, "H": 2, "e": 2, "i": 4, "I": 4, "f": 4, "q": 8, "Q": 8, "d": 8}
_FLOAT_LIMITS = {"e": 65504.0, "f": 3.4028234663852886e38}  # largest finite half / float
_BF16_LIMIT = 3.3895313892515355e38
_INT_RANGES = {"b": (-(2**7), 2**7 - 1), "B": (0, 2**8 - 1), "h": (-(2**15), 2**15 - 1), "H": (0, 2**16 - 1),
               "i": (-(2**31), 2**31 - 1), "I": (0, 2**32 - 1), "q": (-(2**63), 2**63 - 1), "Q": (0, 2**64 - 1)}  # fmt: skip


class _Record:
    """One thread's launch record: a buffer with the head and argument values at fixed offsets,
    followed by the kernelParams array (written once: it points at the values). Between launches
    the head holds the kernel's default configuration, so a default launch packs only the stream
    and the values."""

    def __init__(self, layout: str, value_offsets: Sequence[int], default_head: Sequence[int]) -> None:
        size = struct.calcsize(layout)
        self.params_offset = (size + 7) // 8 * 8
        self.buffer = bytearray(self.params_offset + 8 * max(1, len(value_offsets)))
        self.address = ctypes.addressof((ctypes.c_char * len(self.buffer)).from_buffer(self.buffer))
        pointers = [self.address + offset for offset in value_offsets]
        struct.pack_into(f"={len(pointers)}Q", self.buffer, self.params_offset, *pointers)
        self.pack_head(default_head)

    def pack_head(self, head: Sequence[int]) -> None:
        """grid[3] block[3] shared_mem cluster[3] (the params offset and padding follow)."""
        struct.pack_into("=12I", self.buffer, 0, *head, self.params_offset, 0)


class CompiledKernel(driver.launcher_base()):
    """A launchable kernel: `kernel(*args, grid=, block=, shared_mem_bytes=, stream=, cluster=)`.

    Calling it runs the base class's C __call__ (the extension's Launcher), which launches
    through the fast path and calls _call_general when that declines; without the extension
    (a checkout not built by Bazel), __call__ is _call_general."""

    def __init__(self, image: bytes, name: str, params: Sequence[Param], *, grid, block, shared_mem_bytes: int = 0,
                 cluster=None, source: str | None = None, path=None, log: str = "", compiler: str | None = None) -> None:  # fmt: skip
        self.name = name
        self.params = tuple(params)
        self.cubin = bytes(image)
        self.source = source
        self.path = path
        self.compiler = compiler
        self.log = log
        self.grid = _dims(grid, "grid", _MAX_GRID)
        self.block = _dims(block, "block", _MAX_BLOCK)
        self.dynamic_shared_mem_bytes = self._check_shared_mem(shared_mem_bytes)  # the launch default
        self.cluster = self._check_cluster(cluster, self.grid)
        self._functions: dict[int, tuple[int, int]] = {}  # device -> (context, CUfunction)
        self._dynamic_limit: dict[int, int] = {}  # device -> the function's dynamic shared memory limit
        self._load_lock = threading.Lock()
        self._local = threading.local()
        self._prepare(params)
        self._make_fast_path()

    # ------------------------------------------------------------------ argument conversion

    def _prepare(self, params: Sequence[Param]) -> None:
        layout, offsets, kinds, infos = "=" + RECORD_HEAD, [], [], []
        position = RECORD_HEAD_SIZE
        for param in params:
            if param.pointer:
                fmt, kind = "Q", _POINTER
                accepted = param.element_dtypes()
                info = (None if accepted is None else {_TORCH_DTYPES[n] for n in accepted if n in _TORCH_DTYPES},
                        accepted, param.alignment() - 1)  # fmt: skip
            elif param.scalar is not None:
                fmt, _, _, scalar_kind = param.scalar
                kind = _BF16 if scalar_kind == "bf16" else _SCALAR
                # (fmt, kind, the Python type taken as is, its range): anything else goes through _scalar
                if scalar_kind in ("int", "uint"):
                    info = (fmt, scalar_kind, int, *_INT_RANGES[fmt])
                elif scalar_kind == "bool":
                    info = (fmt, scalar_kind, bool, False, True)
                else:
                    limit = _FLOAT_LIMITS.get(fmt, math.inf)
                    info = (fmt, scalar_kind, float, -limit, limit)
            else:
                fmt, kind, info = None, _OPAQUE, None  # size known once loaded (cuFuncGetParamInfo)
            kinds.append(kind)
            infos.append(info)
            if fmt is None:
                offsets.append(None)
                continue
            align = _ALIGN[fmt]
            padding = -position % align
            layout += "x" * padding
            position += padding
            offsets.append(position)
            layout += fmt
            position += struct.calcsize("=" + fmt)
        self._kinds, self._infos = kinds, infos
        self._layout, self._offsets = layout, offsets
        self._packer = struct.Struct(layout) if None not in offsets else None

    def _opaque_layout(self, sizes: Sequence[int]) -> None:
        """Fill in structs passed by value once their sizes are known (8-byte aligned slots)."""
        layout, offsets, position = "=" + RECORD_HEAD, [], RECORD_HEAD_SIZE
        for param, kind, size in zip(self.params, self._kinds, sizes):
            fmt = f"{size}s" if kind == _OPAQUE else self._layout_fmt(param)
            align = 8 if kind == _OPAQUE else _ALIGN[fmt]
            padding = -position % align
            layout += "x" * padding + fmt
            position += padding
            offsets.append(position)
            position += struct.calcsize("=" + fmt)
        self._infos = [size if kind == _OPAQUE else info for kind, info, size in zip(self._kinds, self._infos, sizes)]
        self._layout, self._offsets, self._packer = layout, offsets, struct.Struct(layout)
        self._local = threading.local()  # records of the old layout are stale

    @staticmethod
    def _layout_fmt(param: Param) -> str:
        return "Q" if param.pointer else param.scalar[0]

    def _wrong(self, index: int, expected: str, arg: Any) -> KernelArgumentError:
        param = self.params[index]
        got = f"a {type(arg).__name__}"
        if isinstance(arg, torch.Tensor):
            got = f"a {arg.dtype} tensor on {arg.device}"
        elif isinstance(arg, numpy.ndarray):
            got = f"a NumPy array of {arg.dtype}"
        elif isinstance(arg, (int, float)):
            got = f"{arg!r} ({type(arg).__name__})"
        return KernelArgumentError(
            f"{self.name}: argument {index} ({param.name}: {param.spelling}) must be {expected}, got {got}"
        )

    def _expected_pointer(self, index: int) -> str:
        accepted = self._infos[index][1]
        kinds = "any dtype" if accepted is None else "/".join(accepted)
        return f"a CUDA tensor ({kinds}), a NumPy array or None"

    def _scalar(self, index: int, arg: Any) -> Any:
        fmt, kind = self._infos[index][:2]
        if kind in ("int", "uint"):
            if isinstance(arg, numbers.Integral):
                low, high = _INT_RANGES[fmt]
                if low <= int(arg) <= high:
                    return int(arg)
                raise KernelArgumentError(
                    f"{self.name}: argument {index} ({self.params[index].name}: {self.params[index].base}) is {int(arg)}, "
                    f"outside [{low}, {high}]"
                )
            raise self._wrong(index, f"an int ({self.params[index].base})", arg)
        if kind == "bool":
            if isinstance(arg, (bool, numpy.bool_)) or (isinstance(arg, numbers.Integral) and int(arg) in (0, 1)):
                return bool(arg)
            raise self._wrong(index, "a bool", arg)
        if isinstance(arg, numbers.Real) and not isinstance(arg, bool):  # float, half, bf16
            value = float(arg)
            limit = _BF16_LIMIT if kind == "bf16" else _FLOAT_LIMITS.get(fmt, math.inf)
            if math.isfinite(value) and abs(value) > limit:
                raise KernelArgumentError(
                    f"{self.name}: argument {index} ({self.params[index].name}: {self.params[index].base}) is {value!r}, "
                    f"which overflows the type (largest finite value {limit:g})"
                )
            return _bf16_bits(value) if kind == "bf16" else value
        raise self._wrong(index, f"a number ({self.params[index].base})", arg)

    def _opaque(self, index: int, arg: Any) -> bytes:
        size = self._infos[index]
        if isinstance(arg, (bytes, bytearray, memoryview)) and len(arg) == size:
            return bytes(arg)
        raise self._wrong(index, f"bytes of length {size} (the struct's size; this type is not converted)", arg)

    # ------------------------------------------------------------------ loading

    def _function(self, device: int) -> tuple[int, int]:
        with self._load_lock:
            found = self._functions.get(device)
            if found is not None:
                return found
            api = driver.module()
            context = driver.primary_context(device)
            module = api.module_load(context, self.cubin)
            try:
                function = api.module_function(context, module, self.name)
            except RuntimeError as error:
                api.module_unload(context, module)
                raise RuntimeError(f"{self.name}: the cubin has no kernel of that name ({error})") from None
            self._check_params(api, function)
            self._dynamic_limit[device] = _DEFAULT_DYNAMIC_SHARED - api.function_attribute(function, driver.FUNC_SHARED_SIZE_BYTES)
            self._launch = driver.launch_function()  # looked up once: the general path calls it directly
            self._publish_spec(device, context, function)
            self._functions[device] = (context, function)
            return context, function

    def _check_params(self, api: Any, function: int) -> None:
        """The driver's parameter sizes against the declaration's (when the driver can tell)."""
        infos = []
        for index in range(4096):  # until the driver says past the end (an expected API error)
            info = api.param_info(function, index)
            if info == -2:
                if _OPAQUE in self._kinds:
                    raise RuntimeError(f"{self.name}: passing structs by value needs cuFuncGetParamInfo (driver 12.4+)")
                return
            if info == -1:
                break
            infos.append(info)
        sizes = [info & 0xFFFFFFFF for info in infos]
        if len(sizes) != len(self.params):
            raise RuntimeError(
                f"{self.name}: the source declares {len(self.params)} parameters but the compiled kernel has "
                f"{len(sizes)}; is the declaration hidden behind a macro?"
            )
        if _OPAQUE in self._kinds:
            self._opaque_layout(sizes)
        for index, (param, size) in enumerate(zip(self.params, sizes)):
            expected = struct.calcsize("=" + (f"{size}s" if self._kinds[index] == _OPAQUE else self._layout_fmt(param)))
            if size != expected:
                raise RuntimeError(
                    f"{self.name}: parameter {index} ({param.name}: {param.spelling}) is {size} bytes in the compiled "
                    f"kernel, {expected} by its declared type"
                )

    def _attribute(self, attribute: int, device: int | None) -> int:
        device = _current_device() if device is None else device
        _, function = self._function(device)
        return driver.module().function_attribute(function, attribute)

    @property
    def num_regs(self) -> int:
        return self._attribute(driver.FUNC_NUM_REGS, None)

    @property
    def shared_mem_bytes(self) -> int:
        """Static (__shared__) shared memory per block, from the driver; the dynamic amount a
        launch asks for is `dynamic_shared_mem_bytes` (or the call's shared_mem_bytes=)."""
        return self._attribute(driver.FUNC_SHARED_SIZE_BYTES, None)

    @property
    def local_mem_bytes(self) -> int:
        return self._attribute(driver.FUNC_LOCAL_SIZE_BYTES, None)

    @property
    def max_threads_per_block(self) -> int:
        return self._attribute(driver.FUNC_MAX_THREADS_PER_BLOCK, None)

    # ------------------------------------------------------------------ launching

    def _check_shared_mem(self, value: Any) -> int:
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{self.name}: shared_mem_bytes must be an int >= 0, got {value!r}")
        return int(value)

    def _check_cluster(self, value: Any, grid: tuple[int, int, int]) -> tuple[int, int, int]:
        if value is None:
            return (0, 0, 0)
        cluster = _dims(value, "cluster", (8, 8, 8))
        for axis in range(3):
            if grid[axis] % cluster[axis]:
                raise ValueError(f"{self.name}: grid {grid} is not a multiple of cluster {cluster} along {'xyz'[axis]}")
        return cluster

    def _raise_dynamic_limit(self, device: int, context: int, function: int, wanted: int) -> None:
        api = driver.module()
        static = api.function_attribute(function, driver.FUNC_SHARED_SIZE_BYTES)
        optin = api.device_attribute(device, driver.DEVICE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        if static + wanted > optin:
            raise ValueError(
                f"{self.name}: shared_mem_bytes={wanted} plus {static} bytes of static shared memory exceeds the "
                f"{optin} bytes a block may use on device {device}"
            )
        api.set_function_attribute(context, function, driver.FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, wanted)
        self._dynamic_limit[device] = wanted
        self._publish_spec(device, context, function)

    def _make_fast_path(self) -> None:
        """The plan of the C fast path (the extension's Launcher, see launch_ext.c), which takes a
        default launch with torch CUDA tensors of the declared dtypes, Python scalars in range and
        the kernel loaded on the tensors' device from the call to cuLaunchKernelEx; it declines
        anything else, which then takes _launch_general. None where the extension is absent (a
        checkout without Bazel), for structs by value, and without torch's CUDA stream query."""
        self._plan = None
        if driver.launcher_base() is object or _OPAQUE in self._kinds or _get_raw_stream is None:
            return
        dtypes = tuple(tuple(info[0]) if kind == _POINTER and info[0] is not None else None
                       for kind, info in zip(self._kinds, self._infos))  # fmt: skip
        self._specs: list[bytes | None] = []  # per device, once the kernel is loaded there (_publish_spec)
        self._plan = (self.name, self._specs, torch.Tensor, torch.cuda.Stream, _get_raw_stream, dtypes,
                      _exchange_dtypes(dtypes))  # fmt: skip

    def _publish_spec(self, device: int, context: int, function: int) -> None:
        """Let the fast path launch on `device` (once the function allows its default dynamic
        shared memory there)."""
        if self._plan is None or self.dynamic_shared_mem_bytes > self._dynamic_limit[device]:
            return
        spec = self._value_spec(context, function)
        if spec is not None:  # else every launch takes the general path
            self._specs.extend([None] * (device + 1 - len(self._specs)))
            self._specs[device] = spec

    def _value_spec(self, context: int, function: int) -> bytes | None:
        """fast_launch' spec for a default launch of this kernel on one device (its layout is in
        launch_ext.c): the value slots' offsets and formats, then the record's template. None for
        a record larger than fast_launch builds on its stack."""
        record = _Record(self._layout, self._offsets, self._default_head())
        size = len(record.buffer)
        if size > _FAST_RECORD_CAPACITY:
            return None
        struct.pack_into("=2Q", record.buffer, RECORD_CALL_OFFSET, context, function)
        slots = []
        for offset, kind, info in zip(self._offsets, self._kinds, self._infos):
            fmt, mask = ("P", info[2]) if kind == _POINTER else ("E" if kind == _BF16 else info[0], 0)
            if mask > 255:
                return None
            slots.append(struct.pack("=IBB2x", offset, ord(fmt), mask))
        return struct.pack("=2I8x", size, len(slots)) + b"".join(slots) + bytes(record.buffer)

    def _record(self) -> _Record:
        record = getattr(self._local, "record", None)
        if record is None:
            record = self._local.record = _Record(self._layout, self._offsets, self._default_head())
        return record

    def _default_head(self) -> tuple[int, ...]:
        return (*self.grid, *self.block, self.dynamic_shared_mem_bytes, *self.cluster)

    def _call_general(self, *args: Any, stream=None, grid=None, block=None, shared_mem_bytes=None, cluster=None) -> None:
        """Launch with `args` on `stream` (default: torch's current stream of the tensors' device;
        a torch.cuda.Stream or a raw CUstream handle). grid, block, shared_mem_bytes and cluster
        override the kernel's defaults for this launch."""
        return self._launch_general(args, grid, block, shared_mem_bytes, stream, cluster)

    if driver.launcher_base() is object:  # no extension
        __call__ = _call_general

    def _launch_general(self, args: Sequence[Any], grid=None, block=None, shared_mem_bytes=None, stream=None,
                        cluster=None) -> None:  # fmt: skip
        if len(args) != len(self.params):
            names = ", ".join(p.name for p in self.params)
            raise KernelArgumentError(f"{self.name} takes {len(self.params)} arguments ({names}), got {len(args)}")
        if self._packer is None:  # structs by value: their sizes come from the loaded function
            self._function(_current_device())
        values: list[Any] = []
        device = -1
        arrays = None  # (index, NumPy array) to copy
        kinds, infos = self._kinds, self._infos
        for index, arg in enumerate(args):
            kind = kinds[index]
            if kind == _POINTER:
                if isinstance(arg, torch.Tensor):
                    accepted = infos[index][0]
                    if not arg.is_cuda or (accepted is not None and arg.dtype not in accepted):
                        raise self._wrong(index, self._expected_pointer(index), arg)
                    arg_device = arg.get_device()
                    if arg_device != device:
                        if device >= 0:
                            raise KernelArgumentError(
                                f"{self.name}: argument {index} ({self.params[index].name}) is on cuda:{arg_device}, "
                                f"earlier tensor arguments on cuda:{device}"
                            )
                        device = arg_device
                    pointer = arg.data_ptr()
                    if pointer & infos[index][2]:
                        raise KernelArgumentError(
                            f"{self.name}: argument {index} ({self.params[index].name}: {self.params[index].spelling}) "
                            f"must be {infos[index][2] + 1}-byte aligned; its data pointer is not"
                        )
                    values.append(pointer)
                elif arg is None:
                    values.append(0)
                elif isinstance(arg, numpy.ndarray):
                    accepted = infos[index][1]
                    if accepted is not None and arg.dtype.name not in accepted:
                        raise self._wrong(index, self._expected_pointer(index), arg)
                    if not self.params[index].const and not arg.flags.writeable:
                        raise KernelArgumentError(
                            f"{self.name}: argument {index} ({self.params[index].name}) is a read-only NumPy array, "
                            "but the parameter is not const, so the kernel may write it"
                        )
                    arrays = (arrays or []) + [(index, arg)]
                    values.append(0)  # the device copy's pointer, below
                else:
                    raise self._wrong(index, self._expected_pointer(index), arg)
            elif kind == _SCALAR:
                info = infos[index]
                if type(arg) is info[2] and info[3] <= arg <= info[4]:
                    values.append(arg)
                else:
                    values.append(self._scalar(index, arg))
            elif kind == _BF16:
                values.append(self._scalar(index, arg))
            else:
                values.append(self._opaque(index, arg))

        # Stream and device.
        if stream is None:
            if device < 0:
                device = _current_device()
            handle = _get_raw_stream(device) if _get_raw_stream else torch.cuda.current_stream(device).cuda_stream
        elif isinstance(stream, torch.cuda.Stream):
            if device >= 0 and stream.device_index != device:
                raise ValueError(f"{self.name}: the stream is on cuda:{stream.device_index}, the tensor arguments on cuda:{device}")
            device = stream.device_index
            handle = stream.cuda_stream
        elif isinstance(stream, numbers.Integral) and not isinstance(stream, bool) and stream >= 0:
            if device < 0:
                device = _current_device()
            handle = int(stream)
        else:
            raise TypeError(f"{self.name}: stream must be a torch.cuda.Stream, a raw CUstream handle (int) or None, got {stream!r}")

        found = self._functions.get(device)
        context, function = found if found is not None else self._function(device)
        grid = self.grid if grid is None else _dims(grid, "grid", _MAX_GRID)
        block = self.block if block is None else _dims(block, "block", _MAX_BLOCK)
        shared = self.dynamic_shared_mem_bytes if shared_mem_bytes is None else self._check_shared_mem(shared_mem_bytes)
        if cluster is not None:
            cluster = self._check_cluster(cluster, grid)
        elif grid is self.grid or not self.cluster[0]:
            cluster = self.cluster
        else:
            cluster = self._check_cluster(self.cluster, grid)
        if shared > self._dynamic_limit[device]:
            self._raise_dynamic_limit(device, context, function, shared)
        if block is not self.block and block[0] * block[1] * block[2] > 1024:
            raise ValueError(f"{self.name}: block {block} has more than 1024 threads")

        copies = None
        if arrays:
            copies = self._to_device(arrays, values, device, stream, handle)
        record = self._record()
        head = (*grid, *block, shared, *cluster)
        self._packer.pack_into(record.buffer, 0, *head, record.params_offset, 0, context, function, handle, *values)
        try:
            self._launch(record.address)
        except RuntimeError as error:
            raise RuntimeError(f"{self.name}: launch failed: {error}") from None
        finally:
            if head != self._default_head():
                record.pack_head(self._default_head())
        if copies:
            self._to_host(copies, device, handle)

    # ------------------------------------------------------------------ NumPy arguments

    @staticmethod
    def _torch_stream(device: int, handle: int) -> torch.cuda.Stream:
        return torch.cuda.ExternalStream(handle, device=torch.device("cuda", device))

    def _to_device(self, arrays, values, device, stream, handle):
        """Copy NumPy arguments to the device, on the launch stream; return those to copy back."""
        copies = []
        with torch.cuda.stream(self._torch_stream(device, handle)):
            for index, array in arrays:
                on_device = torch.from_numpy(numpy.ascontiguousarray(array)).to(torch.device("cuda", device))
                values[index] = on_device.data_ptr()
                copies.append((index, array, on_device))
        return copies

    def _to_host(self, copies, device, handle) -> None:
        with torch.cuda.stream(self._torch_stream(device, handle)):
            for index, array, on_device in copies:
                if not self.params[index].const:
                    array[...] = on_device.cpu().numpy()  # .cpu() waits for the launch stream

    def synchronize(self, stream=None) -> None:
        """Wait for `stream` (default: torch's current stream of the current device)."""
        if stream is None:
            device = _current_device()
            handle = _get_raw_stream(device) if _get_raw_stream else torch.cuda.current_stream(device).cuda_stream
        elif isinstance(stream, torch.cuda.Stream):
            device, handle = stream.device_index, stream.cuda_stream
        elif isinstance(stream, numbers.Integral) and not isinstance(stream, bool):
            device, handle = _current_device(), int(stream)
        else:
            raise TypeError(f"stream must be a torch.cuda.Stream, a raw CUstream handle (int) or None, got {stream!r}")
        driver.module().stream_synchronize(driver.primary_context(device), handle)

    def __repr__(self) -> str:
        params = ", ".join(f"{p.spelling} {p.name}" for p in self.params)
        return f"CompiledKernel({self.name}({params}), grid={self.grid}, block={self.block})"
