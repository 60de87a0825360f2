"""Shared pieces of the ``tracestory bench`` workloads: device info, measured peaks, regions,
result lines next to the roofline, JSON output. Dtype names and device resolution are
:mod:`tracestory.models.runtime`'s (re-exported here).

Peaks: :func:`peaks` asks :func:`tracestory.specs.peaks_for` for the device (measured values
override datasheet ones there). When the device is unknown there, the H200 numbers
measured for this project are used and the source says so: device-to-device copy 4.27e12 B/s
(bytes read + written), bf16 dense GEMM 790e12 FLOP/s, fp8 1258e12 FLOP/s. On a CPU the peaks
are ``None`` and no percentage is printed.

Roofline line: ``achieved / peak`` for bandwidth (bytes moved / time) and for arithmetic
(FLOPs / time); ``floor_ns = max(bytes / bw, flops / rate)`` is the fastest the work could run.
"""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import outputs, specs
from ..capture.region import region  # noqa: F401  (the workloads' regions, used as common.region)
from ..models.runtime import (  # noqa: F401  (the workloads' dtype and device helpers, used as common.X)
    DTYPE_ALIASES,
    DTYPE_BYTES,
    DTYPES,
    dtype_name,
    require_package,
    resolve_device,
    torch_dtype,
)

H200_COPY_BPS = 4.27e12
H200_BF16_FLOPS = 790e12
H200_FP8_FLOPS = 1258e12


@dataclass(frozen=True)
class BenchPeaks:
    """Ceilings used for the roofline columns; ``None`` where unknown."""

    device: str
    copy_bytes_per_s: float | None
    flops_per_s: dict                # dtype -> FLOP/s
    source: str


@dataclass(frozen=True)
class DeviceInfo:
    device: str                      # "cuda" | "cpu"
    name: str
    capability: tuple[int, int] | None
    torch_version: str
    cuda_version: str | None
    triton_version: str | None
    python_version: str


@dataclass(frozen=True)
class BenchDevice:
    """The device a workload runs on, with the peaks its roofline columns use."""

    info: DeviceInfo
    peaks: BenchPeaks

    @property
    def device(self) -> str:
        return self.info.device


def open_device(requested: str | None) -> BenchDevice:
    """Resolve ``auto``/``cpu``/``cuda[:N]`` and look up its peaks."""
    info = device_info(resolve_device(requested))
    return BenchDevice(info, peaks(info))


def device_info(device: str) -> DeviceInfo:
    import torch

    try:
        import triton

        tv = triton.__version__
    except Exception:
        tv = None
    if device.startswith("cuda"):
        idx = torch.device(device).index or 0
        name = torch.cuda.get_device_name(idx)
        cap = tuple(torch.cuda.get_device_capability(idx))
    else:
        name, cap = platform.processor() or platform.machine() or "cpu", None
    return DeviceInfo(device, name, cap, torch.__version__, torch.version.cuda, tv, sys.version.split()[0])


def peaks(info: DeviceInfo) -> BenchPeaks:
    if not info.device.startswith("cuda"):
        return BenchPeaks(info.name, None, {}, "cpu: no peaks")
    p = specs.peaks_for(info.name)
    if p is not None:
        return BenchPeaks(info.name, p.dram_bytes_per_s, dict(p.flops_per_s), p.source)
    return BenchPeaks(info.name, H200_COPY_BPS, {"bf16": H200_BF16_FLOPS, "fp8": H200_FP8_FLOPS},
                      "H200 measured peaks (fallback: device not in tracestory.specs)")


def pct(x: float | None, peak: float | None) -> str:
    return "-" if x is None or not peak else f"{100.0 * x / peak:.1f}%"


def roofline_line(time_ns: float, *, bytes_moved: float | None, flops: float | None,
                  pk: BenchPeaks, dtype: str = "bf16") -> str:
    """One line: achieved GB/s and TFLOP/s with their share of the peaks and the floor time."""
    parts = []
    bw = pk.copy_bytes_per_s
    rate = pk.flops_per_s.get(dtype)
    if bytes_moved:
        gbs = bytes_moved / time_ns  # bytes/ns == GB/s
        parts.append(f"{gbs:,.0f} GB/s ({pct(gbs * 1e9, bw)} of copy peak)")
    if flops:
        tf = flops / time_ns / 1e3  # FLOP/ns / 1e3 == TFLOP/s
        parts.append(f"{tf:,.1f} TFLOP/s ({pct(tf * 1e12, rate)} of {dtype} peak)")
    floors = []
    if bytes_moved and bw:
        floors.append(bytes_moved / bw * 1e9)
    if flops and rate:
        floors.append(flops / rate * 1e9)
    if floors:
        parts.append(f"floor {max(floors) / 1e3:,.1f} us")
    return ", ".join(parts)


def header(info: DeviceInfo, pk: BenchPeaks) -> str:
    cap = f" (SM{info.capability[0]}{info.capability[1]})" if info.capability else ""
    peak = ""
    if pk.copy_bytes_per_s:
        rates = ", ".join(f"{k} {v / 1e12:,.0f} TFLOP/s" for k, v in sorted(pk.flops_per_s.items())
                          if k in ("bf16", "fp8"))
        peak = f"\npeaks: copy {pk.copy_bytes_per_s / 1e12:.2f} TB/s, {rates} [{pk.source}]"
    return (f"device: {info.name}{cap}; torch {info.torch_version}, CUDA {info.cuda_version}, "
            f"triton {info.triton_version}, python {info.python_version}{peak}")


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON through the output boundary (atomic, ``-`` is stdout)."""
    if path:
        outputs.write_text(path, json.dumps(payload, indent=1, default=_default) + "\n")


def _default(o):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "__dataclass_fields__"):
        return {k: getattr(o, k) for k in o.__dataclass_fields__}
    return str(o)


def print_table(headers: list[str], rows: list[list[Any]], out: Callable[[str], Any] = print) -> None:
    """A plain markdown-style table (pastes into docs as is)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    out("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    out("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells:
        out("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |")
