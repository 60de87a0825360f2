"""Results -> JSON (schema ``tracestory.analysis/1``, documented in ``docs/JSON.md``).

Values stay in base units (ns, bytes, FLOPs). Missing values are ``null``; NaN and infinities
are written as ``null`` too, never as 0.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

SCHEMA = "tracestory.analysis/1"


def jsonable(obj: Any) -> Any:
    """Dataclasses, numpy scalars, tuples -> plain JSON values. Numpy arrays and fields marked
    ``compare=False`` (row-index helpers) are left out."""
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
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    return obj


def source_json(trace) -> dict:
    m = trace.meta
    return {
        "path": m.source_path,
        "format": m.source_format,
        "format_version": m.format_version,
        "rank": m.rank,
        "world_size": m.world_size,
        "process_id": m.process_id,
        "process_name": m.process_name,
        "has_timeline": m.has_timeline,
        "devices": [jsonable(d) for d in m.devices],
        "extra": jsonable(dict(m.extra)),
    }


def analysis_json(a, *, hardware: list | None = None) -> dict:
    """One trace's results. ``gpu`` sums: ``kernel_time_ns + memop_time_ns`` equals the sum of
    ``categories[].time_ns``; ``busy_ns`` is the union of kernel and memop intervals."""
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
    }
    out = {
        "source": source_json(a.trace),
        "gpu": gpu,
        "taxonomy": b.taxonomy,
        "speedup_factor": b.speedup_factor,
        "categories": [jsonable(c) for c in b.categories],
        "top_kernels": [jsonable(k) for k in b.kernels],
        "timeline": jsonable(t) if t else None,
        "phases": jsonable(a.phases),
    }
    if hardware is not None:
        out["kernels"] = hardware
    return out


def document(analyses, *, hardware: list | None = None, extra: dict | None = None) -> dict:
    doc = {"schema": SCHEMA, "traces": [analysis_json(a) for a in analyses]}
    if hardware is not None:
        doc["kernels"] = hardware
    if extra:
        doc.update(jsonable(extra))
    return doc
