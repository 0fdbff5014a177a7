"""The memory bandwidths ``placement="auto"`` plans with: the device's from a table of
common GPUs (by the description ggml reports, e.g. "NVIDIA GeForce RTX 4090") or the
caller's ``device_bandwidth``; the host's measured once per machine and thread count and
kept in the user cache (``host_bandwidth.json``), also for ggml's CPU backend as the
device (the same memory). GB/s = 1e9 bytes per second. And the device's round trip per
split layer (:func:`device_sync`), the cost model's ``sync_s``."""

from __future__ import annotations

import json
import math
import os
import platform
import re

__all__ = [
    "GPU_BANDWIDTH_GBPS",
    "UNKNOWN_GPU_GBPS",
    "GPU_SYNC_S",
    "gpu_bandwidth",
    "host_bandwidth",
    "device_bandwidth",
    "device_sync",
]

#: vendor-specified memory bandwidth in GB/s, by a name ggml's device description
#: contains (case-insensitive; the longest match wins, so "RTX 4060 Ti" before "RTX 4060")
GPU_BANDWIDTH_GBPS: dict[str, float] = {
    "RTX 3050": 224,
    "RTX 3060": 360,
    "RTX 3060 Ti": 448,
    "RTX 3070": 448,
    "RTX 3070 Ti": 608,
    "RTX 3080": 760,
    "RTX 3080 Ti": 912,
    "RTX 3090": 936,
    "RTX 3090 Ti": 1008,
    "RTX 4060": 272,
    "RTX 4060 Ti": 288,
    "RTX 4070": 504,
    "RTX 4070 Ti": 504,
    "RTX 4070 Super": 504,
    "RTX 4080": 717,
    "RTX 4080 Super": 736,
    "RTX 4090": 1008,
    "RTX 5070": 672,
    "RTX 5080": 960,
    "RTX 5090": 1792,
    "RTX A6000": 768,
    "RTX 6000 Ada": 960,
    "T4": 320,
    "L4": 300,
    "A10": 600,
    "L40S": 864,
    "L40": 864,
    "V100": 900,
    "A100": 1555,
    "A100-SXM4-80GB": 2039,
    "A100 80GB": 2039,
    "A100-PCIE-80GB": 1935,
    "H100 PCIe": 2000,
    "H100": 3350,
    "H200": 4800,
    "B200": 8000,
    "MI300X": 5300,
    "Radeon RX 7900 XTX": 960,
    "Apple M1": 68,
    "Apple M2": 100,
    "Apple M3": 100,
    "Apple M1 Max": 400,
    "Apple M2 Max": 400,
    "Apple M1 Ultra": 800,
    "Apple M2 Ultra": 800,
}
#: assumed for a GPU the table does not name (an entry-level discrete GPU's); said in the plan
UNKNOWN_GPU_GBPS = 300.0
#: seconds per token that a GPU adds to each layer whose work is split between it and the
#: CPU (graph launch, the activations' copies in and out, the synchronisation). Fitted on an
#: NVIDIA H200 with a 16-core Xeon (docs/placement.md, "Measured on an NVIDIA H200"): 0.43 and
#: 0.72 ms in two runs; the larger is kept, so that a placement the measurement says does
#: not pay is not chosen by ``placement="auto"``.
GPU_SYNC_S = 0.72e-3
#: bytes of a GPU's memory that its ggml backend takes beside the buffers a plan counts (the
#: CUDA backend's memory pool, cuBLAS's workspace, kernels loaded on first use): on the NVIDIA
#: H200 run (docs/placement.md) the GPU's free memory fell 70-104 MiB beyond the plan's
#: buffers in 5 of 12 placements. Set aside inside ``vram_budget``, so the process keeps to it.
GPU_RUNTIME_RESERVE = 128 * 2**20
_CACHE = "host_bandwidth.json"


def _host_memory(name: str, type_: str) -> bool:
    """Whether a ggml device is its CPU backend (type "cpu" or name "CPU"): the host's memory."""
    return str(type_).lower() == "cpu" or name == "CPU"


def gpu_bandwidth(description: str) -> float | None:
    """The table's GB/s for a device description (the longest name it contains as whole
    words, ignoring case), or None."""
    best = None
    for name, gbps in GPU_BANDWIDTH_GBPS.items():
        if re.search(r"(?<![\w])" + re.escape(name) + r"(?![\w])", description, re.IGNORECASE):
            if best is None or len(name) > len(best[0]):
                best = (name, gbps)
    return None if best is None else float(best[1])


def host_bandwidth(n_threads: int = 1, *, refresh: bool = False) -> float:
    """The host's read bandwidth in GB/s over ``n_threads`` threads
    (:func:`~.predict.measure_host_bandwidth`, ~0.5 s), measured once per machine and thread
    count and then read from ``<user cache>/host_bandwidth.json`` (``refresh`` measures again)."""
    from ...loader.artifacts import atomic_write_json, cache_root
    from .predict import measure_host_bandwidth

    path = cache_root() / _CACHE
    key = f"{platform.node()}|{os.cpu_count()}|{int(n_threads)}"
    try:
        table = json.loads(path.read_text())
        table = table if isinstance(table, dict) else {}
    except (OSError, ValueError):
        table = {}
    v = table.get(key)
    if not refresh and isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
        return float(v)
    table[key] = gbps = measure_host_bandwidth(n_threads=max(1, int(n_threads)))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, table)
    except OSError:
        pass  # a read-only cache: measured again next time
    return gbps


def device_bandwidth(
    name: str, description: str, type_: str, *, override: float | None = None, n_threads: int = 1
) -> tuple[float, str]:
    """(GB/s, where it came from) of a ggml device: ``override`` ("given"); ggml's CPU
    backend (type "cpu" or name "CPU"): the host's (:func:`host_bandwidth`, "measured");
    a GPU the table names ("table: <description>"); else :data:`UNKNOWN_GPU_GBPS`
    ("assumed: ... not in the table").

    Raises:
        ValueError: an override that is not a finite number > 0.
    """
    if override is not None:
        if (
            isinstance(override, bool)
            or not isinstance(override, (int, float))
            or not (math.isfinite(override) and override > 0)
        ):
            raise ValueError(f"device_bandwidth must be a finite bandwidth > 0 in GB/s, got {override!r}")
        return float(override), "given"
    if _host_memory(name, type_):
        return host_bandwidth(n_threads), "measured (ggml's CPU backend: the host's memory)"
    gbps = gpu_bandwidth(description or name)
    if gbps is not None:
        return gbps, f"table: {description or name}"
    return UNKNOWN_GPU_GBPS, (
        f"assumed: {description or name!r} is not in the bandwidth table (pass device_bandwidth= GB/s)"
    )


def device_reserve(name: str, type_: str) -> tuple[int, str]:
    """(bytes, where it came from) of a ggml device's memory that its backend allocates beside
    a plan's buffers, set aside inside the budget: 0 for ggml's CPU backend (its buffers are
    host memory, allocated as counted), :data:`GPU_RUNTIME_RESERVE` for any other."""
    if _host_memory(name, type_):
        return 0, "ggml's CPU backend: no runtime buffers"
    return GPU_RUNTIME_RESERVE, "the GPU backend's pool and workspace (70-104 MiB measured on an NVIDIA H200)"


def budget_after_reserve(budget: int, name: str, type_: str) -> tuple[int, int]:
    """(the bytes a plan gets, the bytes set aside) of a budget on a ggml device: the device's
    runtime reserve (:func:`device_reserve`) comes out of it, at most all of it."""
    reserve = min(budget, device_reserve(name, type_)[0])
    return budget - reserve, reserve


def device_sync(name: str, type_: str) -> tuple[float, str]:
    """(seconds, where it came from) of a ggml device's round trip per split layer and token
    (the cost model's ``sync_s``): 0 for ggml's CPU backend (the same memory, no copies; its
    thread handoff is within the cost model's error), :data:`GPU_SYNC_S` for any other."""
    if _host_memory(name, type_):
        return 0.0, "ggml's CPU backend: no copies"
    return GPU_SYNC_S, f"measured on an NVIDIA H200 ({GPU_SYNC_S * 1e3:.2f} ms per split layer)"
