"""Results -> JSON (schema ``tracestory.analysis/1``, documented in ``docs/JSON.md``).

Values stay in base units (ns, bytes, FLOPs). Missing values are ``null``; NaN and infinities
are written as ``null`` too, never as 0. The document holds every result the Markdown report
prints: breakdown, timeline, phases, findings with their evidence, memory over time, the GPU's
peaks and the roofline (Nsight Compute rows under ``kernels``, else the shape estimate), so
every number in the report's prose can be traced to a value here (tested in
``tests/unit/test_report_contract.py``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

SCHEMA = "tracestory.analysis/1"


def jsonable(obj: Any) -> Any:
    """Dataclasses, numpy scalars, tuples -> plain JSON values. Numpy arrays and fields marked
    ``compare=False`` (row-index helpers, full sample series) are left out."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if not f.compare:
                continue
            v = getattr(obj, f.name)
            if isinstance(v, np.ndarray):
                continue
            out[f.name] = jsonable(v)
        return out
    if isinstance(obj, dict) or (hasattr(obj, "items") and hasattr(obj, "keys")):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    return obj


def cuda_version(v) -> str | None:
    """CUDA's integer version (12060) as ``"12.6"``; other values as text."""
    if v is None:
        return None
    try:
        v = int(v)
    except (TypeError, ValueError):
        return str(v)
    return f"{v // 1000}.{(v % 1000) // 10}"


def source_json(trace) -> dict:
    m = trace.meta
    ex = dict(m.extra)
    return {
        "path": m.source_path,
        "format": m.source_format,
        "format_version": m.format_version,
        "rank": m.rank,
        "world_size": m.world_size,
        "process_id": m.process_id,
        "process_name": m.process_name,
        "has_timeline": m.has_timeline,
        "devices": [{**jsonable(d), "compute_capability": d.compute_capability} for d in m.devices],
        "distributed": jsonable(dict(m.distributed)) if m.distributed else None,
        "cuda_runtime": cuda_version(ex.get("cuda_runtime_version")),
        "cuda_driver": cuda_version(ex.get("cuda_driver_version")),
        "extra": jsonable(ex),
    }


def finding_json(f) -> dict:
    return {"rule": f.rule, "severity": f.severity, "title": f.title,
            "evidence": [{"label": e.label, "value": jsonable(e.value), "unit": e.unit} for e in f.evidence],
            "implication": f.implication, "recommendation": f.recommendation}


def peaks_json(peaks) -> dict | None:
    if peaks is None:
        return None
    out = jsonable(peaks)
    out["ridge_flop_per_byte"] = {k: peaks.ridge_flop_per_byte(k) for k in sorted(peaks.flops_per_s)}
    return out


def _device_peaks(trace, peaks):
    if peaks is not None:
        return peaks
    from ..specs import peaks_for

    devs = trace.meta.devices
    return peaks_for(devs[0].name) if devs and devs[0].name else None


def kernel_families_json(a) -> list[dict]:
    """The report's kernel-family table (:mod:`tracestory.analysis.families`): ops, time,
    share of GPU op time and top kernel per family."""
    from ..analysis.families import family_table

    fams = family_table(a.trace)
    total = sum(f[2] for f in fams) or 1
    return [{"family": f, "ops": n, "time_ns": t, "share": t / total, "top_kernel": k} for f, n, t, k in fams]


def launch_configs_json(a, top: int = 10) -> list[dict]:
    """Launch configuration of the top kernels (first launch of each name), as the trace
    records it: grid, block, registers per thread, shared memory, and blocks per SM (grid
    blocks / the device's SM count)."""
    k = a.trace.kernels
    sms = next((d.sm_count for d in a.trace.meta.devices if d.sm_count), None)
    out = []
    for ks in a.breakdown.kernels[:top]:
        rows = np.flatnonzero(k["name"] == a.trace.code_of(ks.name))
        if rows.size == 0:
            continue  # a memop
        i = int(rows[0])

        def val(c, i=i):
            return int(k[c][i]) if k[c][i] >= 0 else None

        grid = [val("grid_x"), val("grid_y"), val("grid_z")]
        blocks = grid[0] * grid[1] * grid[2] if None not in grid else None
        out.append({"name": ks.name, "mean_ns": ks.mean_ns, "grid": grid,
                    "block": [val("block_x"), val("block_y"), val("block_z")],
                    "registers_per_thread": val("registers_per_thread"),
                    "shared_mem_bytes": val("shared_mem_bytes"),
                    "blocks_per_sm": blocks / sms if blocks and sms else None})
    return out


def analysis_json(a, *, hardware: list | None = None, kernel_metrics=None, peaks=None,
                  findings=None, memory=None) -> dict:
    """One trace's results. ``gpu`` sums: ``kernel_time_ns + memop_time_ns`` equals the sum of
    ``categories[].time_ns``; ``busy_ns`` is the union of kernel and memop intervals.

    ``findings`` / ``memory`` default to ``derive_findings`` / ``memory_timeline`` of ``a`` (pass
    the report's own to save the work); ``kernel_metrics`` and ``peaks`` are handed to
    ``derive_findings`` and, without ncu input, to the roofline estimate."""
    from ..analysis.findings import derive_findings
    from ..analysis.memory import memory_timeline
    from ..analysis.roofline import estimate_roofline

    b, t = a.breakdown, a.timeline
    gpu = {
        "kernel_count": b.kernel_count,
        "kernel_time_ns": b.kernel_time_ns,
        "memop_count": b.memop_count,
        "memop_time_ns": b.memop_time_ns,
        "busy_ns": t.busy_ns if t else None,
        "window_ns": t.window_ns if t else None,
        "idle_ns": t.idle_ns if t else None,
        "sum_ns": t.sum_ns if t else None,
        "busy_fraction": t.busy_ns / t.window_ns if t and t.window_ns else None,
    }
    if memory is None:
        memory = memory_timeline(a.trace, a.phases)
    if findings is None:
        findings = derive_findings(a, kernel_metrics=kernel_metrics, peaks=peaks, memory=memory)
    dev_peaks = _device_peaks(a.trace, peaks)
    estimate = None
    if not kernel_metrics:
        rf = estimate_roofline(a.trace, dev_peaks)
        if rf.points:
            estimate = {"note": rf.note, "points": [jsonable(p) for p in rf.points]}
    timeline = jsonable(t) if t else None
    if timeline is not None:
        for g in timeline["largest_gaps"]:   # the report prints where each gap is in the window
            g["offset_ns"] = g["start_ns"] - t.start_ns
    out = {
        "source": source_json(a.trace),
        "gpu": gpu,
        "taxonomy": b.taxonomy,
        "speedup_factor": b.speedup_factor,
        "categories": [jsonable(c) for c in b.categories],
        "top_kernels": [jsonable(k) for k in b.kernels],
        "timeline": timeline,
        "phases": jsonable(a.phases),
        "phase_count": len(a.phases.phases),
        "kernel_families": kernel_families_json(a),
        "launch_configs": launch_configs_json(a),
        "findings": [finding_json(f) for f in findings],
        "memory": jsonable(memory) if memory is not None else None,
        "peaks": peaks_json(dev_peaks),
        "roofline_estimate": estimate,
    }
    if hardware is not None:
        out["kernels"] = hardware
    return out


def _with_waves(row: dict) -> dict:
    """An ncu ``kernels[]`` row plus ``waves`` (grid blocks / (SMs x resident blocks per SM),
    ``analyze.hardware.waves``: CSV exports round ncu's own value to 0.00 for small grids) and
    ``first_wave_fill_fraction`` (how full the first wave is: ``min(waves, 1)``)."""
    from types import SimpleNamespace

    from ..analysis.hardware import waves

    fields = ("grid_size", "sm_count", "waves_per_sm", "occupancy_limit_registers",
              "occupancy_limit_shared_mem", "occupancy_limit_warps", "occupancy_limit_blocks")
    w = waves(SimpleNamespace(**{f: row.get(f) for f in fields}))
    return {**row, "waves": w, "first_wave_fill_fraction": None if w is None else min(w, 1.0)}


def document(analyses, *, hardware: list | None = None, extra: dict | None = None,
             kernel_metrics=None, peaks=None) -> dict:
    """The whole JSON document. ``kernel_metrics``: the Nsight Compute results (``Inputs.
    kernel_metrics`` pairs or ``KernelMetrics``) the report used, so findings match it; without
    any trace their findings go to ``ncu_findings``."""
    from ..specs import peaks_for

    analyses = list(analyses)
    doc = {"schema": SCHEMA,
           "traces": [analysis_json(a, kernel_metrics=kernel_metrics, peaks=peaks) for a in analyses]}
    names: set[str] = set()
    if hardware is not None:
        doc["kernels"] = [_with_waves(r) for r in hardware]
        names |= {r["device_name"] for r in hardware if r.get("device_name")}
    if kernel_metrics:
        from ..analysis.findings import ncu_findings
        from ..analysis.rules_hardware import metrics_list

        names |= {km.device_name for km in metrics_list(kernel_metrics) if km.device_name}
        if not analyses:
            doc["ncu_findings"] = [finding_json(f) for f in ncu_findings(kernel_metrics, peaks=peaks)]
    if names:
        doc["ncu_peaks"] = {n: peaks_json(peaks or peaks_for(n)) for n in sorted(names)}
    if extra:
        doc.update(jsonable(extra))
    return doc
