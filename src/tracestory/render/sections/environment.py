"""Environment: the capture manifest's environment, else each trace's devices and profiler metadata."""

from __future__ import annotations

import os

from ...units import fmt_bytes
from ..batch_story import serving_environment
from ..manifest_sections import render_environment
from ..md import label, md_table
from . import Context


def _environment(runs) -> list[str]:
    out = []
    analyses = [r.analysis for r in runs]
    for run, a in zip(runs, analyses, strict=True):
        m = a.trace.meta
        amd = run.facts.platform == "ROCm"
        if len(analyses) > 1:
            out += [f"### {label(a)}", ""]
        rows = [
            (
                d.id,
                d.name,
                d.sm_count if d.sm_count is not None else "n/a",
                d.compute_capability or "n/a",
                fmt_bytes(d.total_memory_bytes),
            )
            for d in m.devices
        ]
        if rows:
            out += md_table(
                ("device", "name", "CUs" if amd else "SMs", "gfx version" if amd else "compute capability", "memory"),
                rows,
                "rlrrr",
            )
        else:
            out.append("Devices: n/a (the trace carries no device properties)")
        out.append("")
        ex = dict(m.extra)
        items = [
            f"- Source: {m.source_format} trace `{os.path.basename(m.source_path)}`"
            + (f", schema {m.format_version}" if m.format_version else "")
        ]
        for key, what in (
            ("cuda_runtime_version", "CUDA runtime"),
            ("cuda_driver_version", "CUDA driver"),
            ("cupti_version", "CUPTI"),
        ):
            if key in ex:
                items.append(f"- {what}: {_cuda_version(ex[key]) if key != 'cupti_version' else ex[key]}")
        flags = [
            k for k in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules") if ex.get(k)
        ]
        if flags:
            items.append("- Profiler options: " + ", ".join(flags))
        if m.process_name:
            items.append(f"- Process: {m.process_name}")
        if m.rank is not None or m.world_size is not None:
            items.append(
                f"- Rank {m.rank if m.rank is not None else 'n/a'} of world size "
                f"{m.world_size if m.world_size is not None else 'n/a'}"
            )
        if m.distributed:
            d = m.distributed
            items.append(
                f"- Distributed: backend {d.get('backend', 'n/a')}"
                + (f", NCCL {d['nccl_version']}" if d.get("nccl_version") else "")
            )
        if "event_count" in ex:
            items.append(f"- Events in the file: {ex['event_count']}")
        out += items + [""]
    return out


def _cuda_version(v) -> str:
    try:
        v = int(v)
    except (TypeError, ValueError):
        return str(v)
    return f"{v // 1000}.{(v % 1000) // 10}"


def render(c: Context) -> list[str] | None:
    m = c.results.manifest
    if m:
        return [render_environment(m).strip(), ""]
    if c.serving_only:
        assert c.results.batching is not None
        return serving_environment(c.results.batching)
    return [c.no_trace, ""] if c.no_trace else _environment(list(c.shown))
