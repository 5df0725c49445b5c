"""A per-device error record that CUDA kernels fill instead of reading or writing out of bounds.

Kernels that index memory with values from device tensors (RoPE positions, KV-cache slots,
embedding ids) cannot raise: each gets an int64 [3] buffer {flag, index, value} and records the
first bad element there (sticky until read). Reading it needs a stream sync, so ops read it only
when asked to (or by default where the cost is acceptable), never while a CUDA graph is captured.
"""

from __future__ import annotations

import threading

import torch


class DeviceErrorRecord:
    def __init__(self, op: str):
        self.op = op
        self._buffers: dict[int, torch.Tensor] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _index(device: torch.device) -> int:
        return device.index if device.index is not None else torch.cuda.current_device()

    def buffer(self, device: torch.device) -> torch.Tensor:
        """The record for `device`, passed to the kernel. Allocated on first use, which must not
        happen inside a CUDA graph capture."""
        index = self._index(device)
        with self._lock:
            buffer = self._buffers.get(index)
            if buffer is None:
                if torch.cuda.is_current_stream_capturing():
                    raise RuntimeError(
                        f"{self.op}: call it once on cuda:{index} before capturing a CUDA graph "
                        "(the first call allocates its error flag buffer)"
                    )
                buffer = self._buffers[index] = torch.zeros(3, dtype=torch.int64, device=device)
        return buffer

    def pop(self, device: torch.device | str | int | None = None) -> tuple[int, int] | None:
        """(index, value) of the first bad element recorded on `device` since the last read, or
        None; clears the record. Syncs the current stream. The CPU paths raise at once."""
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if device.type == "cpu":
            return None
        buffer = self._buffers.get(self._index(device))
        if buffer is None:
            return None
        flag, index, value = buffer.tolist()
        if not flag:
            return None
        buffer.zero_()
        return index, value
