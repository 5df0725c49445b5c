"""A per-device error record that CUDA kernels fill instead of reading or writing out of bounds.

Kernels that index memory with values from device tensors (RoPE positions, KV-cache slots,
embedding ids) cannot raise: each gets an int64 [3] buffer {flag, index, value} and records the
first bad element there (sticky until read). Reading it needs a stream sync, so ops read it only
when asked to (or by default where the cost is acceptable), never while a CUDA graph is captured.
The CPU exports take the same argument and ignore it (they raise at once), so an op calls its
module the same way on every device.
"""

from __future__ import annotations

import threading

import torch


class DeviceErrorRecord:
    def __init__(self, op: str, message: str):
        """`message` formats a recorded error: {index}, {value} and the keywords of raise_recorded."""
        self.op = op
        self.message = message
        self._buffers: dict[int, torch.Tensor] = {}
        self._lock = threading.Lock()
        self._cpu = torch.zeros(3, dtype=torch.int64)  # passed to the CPU exports, never read

    @staticmethod
    def _index(device: torch.device) -> int:
        return device.index if device.index is not None else torch.cuda.current_device()

    def buffer(self, device: torch.device) -> torch.Tensor:
        """The record for `device`, passed to the kernel. Allocated on first use, which must not
        happen inside a CUDA graph capture."""
        if device.type == "cpu":
            return self._cpu
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

    def raise_recorded(self, device: torch.device, **details: object) -> None:
        """After a checked call: ValueError if a bad element was recorded on `device` (syncs the
        stream). Skipped on the CPU (its kernels raise) and while a CUDA graph is captured (a sync
        is illegal there; the record stays set for a later read)."""
        if device.type == "cpu" or torch.cuda.is_current_stream_capturing():
            return
        recorded = self.pop(device)
        if recorded is not None:
            index, value = recorded
            raise ValueError(f"{self.op}: " + self.message.format(index=index, value=value, device=device, **details))
