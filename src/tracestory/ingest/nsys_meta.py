"""Nsight Systems SQLite exports: what the export says about itself (metadata, GPUs, era).

``EXPORT_META_DATA`` (2022) / ``META_DATA_EXPORT`` (2024+) are ``name, value`` pairs (product
and schema version). GPUs come from ``TARGET_INFO_CUDA_GPU`` (2021 and older: CUPTI's device
record, bandwidth in kB/s and clock in kHz) or ``TARGET_INFO_GPU`` (2022+, bytes/s and Hz);
a ``TARGET_INFO_GPU`` row without an SM count is a display adapter without CUDA and is
skipped. A device listed in both keeps the 2021 table's properties.

``META_DATA_CAPTURE`` (2024+) holds the capture's options as ``name, value`` pairs; the CUDA
graph trace mode is ``CUDA_GRAPH_TRACE_OPTIONS:MODE`` (``PROCESS_<n>:`` prefixed in some
exports), ``Graph`` for nsys's default ``--cuda-graph-trace=graph`` (one activity per graph
launch, the kernels inside not traced) or ``Node`` (every node traced as its own kernel).
"""

from __future__ import annotations

from ..trace import DeviceInfo
from .nsys_db import Db


def metadata(db: Db) -> dict[str, str]:
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in db.tables and {"name", "value"} <= db.columns(table):
            return {str(k): str(v) for k, v in db.rows(f"SELECT name, value FROM {table}")}
    return {}


def graph_trace_mode(db: Db) -> str | None:
    """``"graph"`` or ``"node"``: the CUDA graph trace mode the capture recorded; None when the
    export does not say (older exports have no ``META_DATA_CAPTURE``)."""
    table = "META_DATA_CAPTURE"
    if table not in db.tables or not {"name", "value"} <= db.columns(table):
        return None
    for name, value in db.rows(f"SELECT name, value FROM {table} WHERE name LIKE '%CUDA_GRAPH_TRACE_OPTIONS:MODE'"):
        mode = str(value or "").strip().lower()
        if mode in ("graph", "node"):
            return mode
    return None


def gpus(db: Db) -> dict[int, DeviceInfo]:
    def get(row: dict, *keys, scale=1):
        for k in keys:
            v = row.get(k)
            if v is not None and v != 0:
                return v * scale if scale != 1 else v
        return None

    out: dict[int, DeviceInfo] = {}
    for table, scale_bw, scale_clk in (("TARGET_INFO_CUDA_GPU", 1000, 1000), ("TARGET_INFO_GPU", 1, 1)):
        if table not in db.tables:
            continue
        cur = db.con.execute(f"SELECT * FROM {table}")
        keys = [d[0] for d in cur.description]
        for values in cur.fetchall():
            row = dict(zip(keys, values))
            did = next((row[k] for k in ("id", "deviceId", "cuDevice") if row.get(k) is not None), None)
            if did is None or int(did) in out:
                continue  # the 2021 CUDA table comes first: it has the properties
            sm = get(row, "smCount", "numMultiprocessors")
            if sm is None and table == "TARGET_INFO_GPU" and "smCount" in row:
                continue  # a display adapter without CUDA (Intel, Basic Render Driver)
            out[int(did)] = DeviceInfo(
                id=int(did), name=str(row.get("name") or "unknown"), sm_count=sm,
                cc_major=get(row, "computeMajor", "computeCapabilityMajor"),
                cc_minor=row.get("computeMinor", row.get("computeCapabilityMinor")),
                total_memory_bytes=get(row, "totalMemory", "globalMemorySize"),
                l2_cache_bytes=get(row, "l2CacheSize"),
                memory_bandwidth_bytes_per_s=(float(v) if (v := get(row, "memoryBandwidth", "globalMemoryBandwidth", scale=scale_bw)) else None),
                clock_hz=(float(v) if (v := get(row, "clockRate", "coreClockRate", scale=scale_clk)) else None),
            )
    return out


def era(db: Db) -> str:
    """Which export layout: "2021" (no metadata table), "2022" or "2024+"."""
    if "META_DATA_EXPORT" in db.tables:
        return "2024+"
    if "EXPORT_META_DATA" in db.tables:
        return "2022"
    return "2021"
