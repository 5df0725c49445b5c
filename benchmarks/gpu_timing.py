"""GPU timing shared by the benchmarks: a CUDA-graph timer and the copy roof.

- time_graph(calls, iters): median µs per call over replays of a CUDA graph of the calls.
- copy_gbps(iters): a large device-to-device copy_, launched eagerly (bytes read + written).
"""

from __future__ import annotations

import math
import statistics

import torch


def time_graph(calls, iters: int, min_ms: float = 1.0) -> tuple[float, str]:
    """Median µs per call: a CUDA graph of `passes` passes over `calls`, replayed `iters` times
    between CUDA events. Falls back to launching the calls (marked †) if capture fails."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch recommends
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for call in calls:
        call()
    end.record()
    torch.cuda.synchronize()
    passes = max(1, math.ceil(min_ms / max(start.elapsed_time(end), 1e-3)))

    def body():
        for _ in range(passes):
            for call in calls:
                call()

    how, run = "graph", body
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            body()
        run = graph.replay
    except Exception:  # noqa: BLE001 - not capturable: time launches
        how = "launch †"
        torch.cuda.synchronize()
    # Warm-up replays for >= 50 ms: after host-side work (allocating and freeing the caches) the
    # GPU idles and its clock drops; a row timed before it ramps up again reads ~10% slow.
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    run()
    b.record()
    b.synchronize()
    for _ in range(min(1000, int(50 / max(a.elapsed_time(b), 1e-3)))):
        run()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in pairs:
        a.record()
        run()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in pairs) * 1e3 / (passes * len(calls)), how


def copy_gbps(iters: int) -> float:
    """Device-to-device copy of a large float32 tensor, launched eagerly: bytes read + written."""
    n = min(1 << 30, torch.cuda.mem_get_info()[0] // 8) // 4
    src, dst = torch.ones(n, device="cuda"), torch.empty(n, device="cuda")
    for _ in range(3):
        dst.copy_(src)
    samples = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b))
    return 2 * n * 4 / (statistics.median(samples) * 1e-3) / 1e9
