"""Results -> JSON (schema ``tracestory.analysis/1``, documented in ``docs/JSON.md``).

Values stay in base units (ns, bytes, FLOPs). Missing values are ``null``; NaN and infinities
are written as ``null`` too, never as 0. The document holds every result the Markdown report
prints: breakdown, timeline, phases, findings with their evidence, memory over time, the GPU's
peaks and the roofline (Nsight Compute rows under ``kernels``, else the shape estimate), so
every number in the report's prose can be traced to a value here (tested in
``tests/unit/test_report_contract.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..lazy import entry
from .jsonable import jsonable
from .tables_out import table_records
from .window import window_json

SCHEMA = "tracestory.analysis/1"


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
        "warnings": list(m.stated_warnings),  # what a reader dropped or repaired, and why
        "devices": [{**jsonable(d), "compute_capability": d.compute_capability} for d in m.devices],
        "distributed": jsonable(dict(m.distributed)) if m.distributed else None,
        "cuda_runtime": cuda_version(ex.get("cuda_runtime_version")),
        "cuda_driver": cuda_version(ex.get("cuda_driver_version")),
        "extra": jsonable(ex),
    }


def finding_json(f) -> dict:
    return {
        "rule": f.rule,
        "severity": f.severity,
        "title": f.title,
        "evidence": [{"label": e.label, "value": jsonable(e.value), "unit": e.unit} for e in f.evidence],
        "implication": f.implication,
        "recommendation": f.recommendation,
        "basis": list(f.basis),
    }


def workload_json(facts) -> dict:
    """The workload kind with its evidence and signals, and what the program already uses."""
    w = facts.workload
    return {
        "kind": w.kind,
        "evidence": list(w.evidence),
        "signals": {k: v for k, v in w.signals},
        "in_use": jsonable(facts.in_use),
    }


def peaks_json(peaks) -> dict | None:
    if peaks is None:
        return None
    out = jsonable(peaks)
    out["ridge_flop_per_byte"] = {k: peaks.ridge_flop_per_byte(k) for k in sorted(peaks.flops_per_s)}
    return out


def kernel_families_json(run) -> list[dict]:
    """The report's kernel-family table (``RunResults.families``): ops, time, share of GPU op
    time and top kernel per family."""
    fams = run.families
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
        out.append(
            {
                "name": ks.name,
                "mean_ns": ks.mean_ns,
                "grid": grid,
                "block": [val("block_x"), val("block_y"), val("block_z")],
                "registers_per_thread": val("registers_per_thread"),
                "shared_mem_bytes": val("shared_mem_bytes"),
                "blocks_per_sm": blocks / sms if blocks and sms else None,
            }
        )
    return out


def analysis_json(run) -> dict:
    """One trace's results (a ``RunResults``). ``gpu`` sums: ``kernel_time_ns + memop_time_ns``
    equals the sum of ``categories[].time_ns``; ``busy_ns`` is the union of kernel and memop
    intervals."""
    a = run.analysis
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
    rf = run.roofline_estimate
    estimate = {"note": rf.note, "points": [jsonable(p) for p in rf.points]} if rf is not None and rf.points else None
    timeline = jsonable(t) if t else None
    if timeline is not None:
        for g in timeline["largest_gaps"]:  # the report prints where each gap is in the window
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
        "kernel_families": kernel_families_json(run),
        "launch_configs": launch_configs_json(a),
        "findings": [finding_json(f) for f in run.findings],
        "memory": jsonable(run.memory) if run.memory is not None else None,
        "peaks": peaks_json(run.peaks),
        "roofline_estimate": estimate,
        "roofline_estimate_dropped": [{"kernel": k, "pct_of_roof": v} for k, v in rf.dropped] if rf is not None else [],
        "producer": producer_json(run.producer),
        "trace_kind": {"kind": run.facts.kind.kind, "evidence": list(run.facts.kind.evidence)},
        "workload": workload_json(run.facts),
        "launch_bound": run.facts.launch_bound,
        "long_gap_share": run.facts.long_gap_share,
        "kernel_facts": kernel_facts_json(run.kernel_facts),
        "exposure": jsonable(run.exposure) if run.exposure is not None else None,
        "critical_path": critical_path_json(run.critical_path, run.critical_path_scope),
        "phase_coverage": phase_coverage_json(run.facts),
        "warnings": list(a.trace.meta.stated_warnings),
        "operators": operators_json(run),
        "nsys_tables": nsys_tables_json(run),
    }
    return out


def nsys_tables_json(run) -> dict:
    """The ``nsys stats`` summary tables of the trace (``analysis.nsys_tables``): per table its
    rows (one object per row, base units) and a note of what they leave out, or ``missing``:
    why this input cannot give it (never an empty table that reads as zero)."""
    out = {}
    for name, t in run.nsys_tables.items():
        out[name] = {"missing": t.missing} if t.missing is not None else {"rows": table_records(t), "note": t.note}
    return out


REPORT_OPS = 10  # rows of GPU time per top-level op in the report and here


def operators_json(run) -> dict:
    """GPU time per top-level CPU op (``analysis.operators``): the report's rows (the
    :data:`REPORT_OPS` largest groups of name, input dims and types), the GPU time no op can be
    given, and the counts. For a trace with more than ``REPORT_MAX_OPS`` CPU ops and ranges it
    is not computed for the report: ``computed`` is false with the counts that decided it."""
    ops = run.report_operators
    if ops is None:
        return {"computed": False, "op_count": run.op_count, "op_limit": run.op_limit}
    return {
        "computed": True,
        "op_count": run.op_count,
        "op_limit": run.op_limit,
        "op_source": ops.op_source,
        "shapes_recorded": ops.shapes_recorded,
        "gpu_op_count": ops.gpu_op_count,
        "total_gpu_ns": ops.total_gpu_ns,
        "top_level_groups": len(ops.top_level),
        "top_level": [
            {
                "name": s.name,
                "kind": s.kind,
                "input_dims": s.input_dims,
                "input_types": s.input_types,
                "calls": s.calls,
                "launches": s.launches,
                "gpu_op_count": s.gpu_op_count,
                "kernel_count": s.kernel_count,
                "gpu_ns": s.gpu_ns,
                "share": s.share,
                "top_kernels": [{"name": n, "gpu_ns": t} for n, t in s.top_kernels],
            }
            for s in ops.top_level[:REPORT_OPS]
        ],
        "unattributed_count": ops.unattributed_count,
        "unattributed_ns": ops.unattributed_ns,
        "unattributed_share": ops.unattributed_ns / ops.total_gpu_ns if ops.total_gpu_ns else None,
        "outside_ops_count": ops.outside_ops_count,
        "outside_ops_ns": ops.outside_ops_ns,
        "outside_ops_share": ops.outside_ops_ns / ops.total_gpu_ns if ops.total_gpu_ns else None,
    }


def producer_json(p) -> dict | None:
    """What made the trace (``analysis.producer``), with the graph-replay counts."""
    if p is None:
        return None
    return {
        "framework": p.framework,
        "engine": p.engine,
        "compiled": p.compiled,
        "mode": p.mode,
        "platform": p.platform,
        "evidence": list(p.evidence),
        "graphs": {
            **jsonable(p.graphs),
            "graph_time_fraction": p.graphs.graph_time_fraction,
            "replays_graphs": p.replays_graphs,
        },
    }


def kernel_facts_json(f) -> dict | None:
    if f is None:
        return None
    return {
        "execution_mode": f.execution_mode,
        "precisions": [{"precision": p, "share": sh} for p, sh in f.precisions],
        "attention": [{"implementation": i, "launches": n, "time_ns": t} for i, n, t in f.attention],
    }


def critical_path_json(cp, scope: str) -> dict | None:
    if cp is None:
        return None
    return {
        "scope": scope,
        "start_ns": cp.start_ns,
        "end_ns": cp.end_ns,
        "span_ns": cp.span_ns,
        "dominant": cp.dominant,
        "by_label_ns": dict(cp.by_label),
        "share": {label: cp.share(label) for label, _ in cp.by_label},
        "gpu_ops_on_path": cp.gpu_ops_on_path,
        "cpu_calls_on_path": cp.cpu_calls_on_path,
    }


def phase_coverage_json(f) -> dict | None:
    c = f.phase_coverage
    return (
        None
        if c is None
        else {
            "share_of_kernel_time": c.share,
            "kernels_outside": c.kernels_outside,
            "kernel_time_outside_ns": c.kernel_time_outside_ns,
        }
    )


def kernel_rows(hardware) -> list[dict]:
    """One row per Nsight Compute kernel of every input (``Results.hardware``): its metrics, the
    input's path, its roofline point (against the report's resolved peaks), its bound, ``waves``
    (grid blocks / (SMs x resident blocks per SM), ``analysis.hardware.waves``: CSV exports
    round ncu's own value to 0.00 for small grids) and ``first_wave_fill_fraction`` (how full
    the first wave is: ``min(waves, 1)``)."""
    rows = []
    for h in hardware:
        by_id = {p.kernel_id: p for p in h.roofline.points}
        for row, k, w in zip(h.metrics.json_rows(), h.metrics.kernels, h.waves, strict=True):
            point = jsonable(by_id[k.id]) if k.id in by_id else None
            row["source_path"] = h.path
            row["roofline"] = point
            row["bound"] = point["bound"] if point else None
            row["waves"] = w
            row["first_wave_fill_fraction"] = None if w is None else min(w, 1.0)
            rows.append(row)
    return rows


def document(results) -> dict:
    """The whole JSON document of ``results`` (:class:`~tracestory.analysis.results.Results`).
    Nsight Compute rows go under ``kernels`` with the peaks of their GPUs under ``ncu_peaks``;
    without any trace their findings go to ``ncu_findings``."""
    doc: dict[str, Any] = {"schema": SCHEMA, "traces": [analysis_json(run) for run in results.runs]}
    if getattr(results.inputs, "window", None) is not None:
        doc["window"] = window_json(results.inputs.window)
    if results.hardware:
        rows = kernel_rows(results.hardware)
        doc["kernels"] = rows
        names = {r["device_name"] for r in rows if r.get("device_name")}
        names |= {h.metrics.device_name for h in results.hardware if h.metrics.device_name}
        if not results.runs:
            doc["ncu_findings"] = [finding_json(f) for f in results.ncu_findings]
        if names:
            doc["ncu_peaks"] = {n: peaks_json(results.peaks.get(n)) for n in sorted(names)}
    if results.multigpu is not None:
        doc["multigpu"] = entry("tracestory.render.multigpu", "multigpu_json")(
            results.multigpu, results.multigpu_findings
        )
    if results.batching is not None:
        doc["batching"] = entry("tracestory.render.batch_story", "batch_json")(results.batching)
    if getattr(results, "telemetry", None) is not None:
        doc["telemetry"] = telemetry_json(results.telemetry)
    doc["limitations"] = [{"analysis": x.analysis, "reason": x.reason} for x in results.limitations]
    doc["answers"] = [jsonable(x) for x in results.answers]
    if results.ranks is not None:
        doc["ranks"] = {
            "given": results.ranks.given,
            "declared": results.ranks.declared,
            "partial": results.ranks.partial,
        }
    if results.selection is not None:
        doc["told_once"] = jsonable(results.selection)
    ncu_warn = [{"path": h.path, "warnings": list(getattr(h.metrics, "warnings", ()) or ())} for h in results.hardware]
    if any(w["warnings"] for w in ncu_warn):
        doc["kernel_metrics_warnings"] = ncu_warn
    return doc


TELEMETRY_TIMELINE_POINTS = 200


def telemetry_json(t) -> dict:
    """The ``telemetry`` key: the window statistics, findings, joules per token, and the timeline
    (at most :data:`TELEMETRY_TIMELINE_POINTS` samples, evenly picked, Unix epoch ns)."""
    doc = jsonable(t)
    doc["findings"] = [finding_json(f) for f in t.findings]
    log = t.log
    n = log.n_samples
    idx = (
        np.unique(np.linspace(0, n - 1, min(n, TELEMETRY_TIMELINE_POINTS)).round().astype(np.int64))
        if n
        else np.zeros(0, dtype=np.int64)
    )
    doc["timeline"] = {
        "t_unix_ns": [int(x) for x in log.t_unix_ns[idx]] if n else [],
        "gpus": [
            {
                "index": int(d.get("index", g)),
                **{k: jsonable(log.readings[k][g][idx]) if n else [] for k in ("sm_mhz", "mem_mhz", "power_w")},
                "reasons_mask": [int(x) if x >= 0 else None for x in log.reasons_mask[g][idx]] if n else [],
            }
            for g, d in enumerate(log.devices)
        ],
    }
    return doc
