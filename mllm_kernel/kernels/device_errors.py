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


class DeviceErrorRecord(dict):
    """`record[t.device]`: the int64 [3] buffer to pass to the kernel for tensors on that device
    (a plain dict lookup once allocated; the first lookup per device allocates it, which must not
    happen inside a CUDA graph capture). CPU devices get a dummy that no one reads."""

    def __init__(self, op: str, message: str):
        """`message` formats a recorded error: {index}, {value} and the keywords of raise_recorded."""
        super().__init__()
        self.op = op
        self.message = message
        self._lock = threading.Lock()

    @staticmethod
    def _key(device: torch.device) -> torch.device:
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        return device

    def __missing__(self, device: torch.device) -> torch.Tensor:
        key = self._key(device)
        with self._lock:
            buffer = dict.get(self, key)
            if buffer is None:
                if key.type == "cuda" and torch.cuda.is_current_stream_capturing():
                    raise RuntimeError(
                        f"{self.op}: call it once on {key} before capturing a CUDA graph "
                        "(the first call allocates its error flag buffer)"
                    )
                buffer = torch.zeros(3, dtype=torch.int64, device=key)
                self[key] = buffer
            if key != device:
                self[device] = buffer
        return buffer

    def pop(self, device: torch.device | str | int | None = None) -> tuple[int, int] | None:
        """(index, value) of the first bad element recorded on `device` since the last read, or
        None; clears the record. Syncs the current stream. The CPU paths raise at once."""
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if device.type == "cpu":
            return None
        buffer = dict.get(self, self._key(device))
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
