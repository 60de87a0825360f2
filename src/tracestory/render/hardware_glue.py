"""Joins Nsight Compute metrics (or, without them, the trace's own op shapes) to the analyses
and renders the ``## Hardware Behavior Analysis`` section body and its JSON rows.

With ncu inputs: each report is joined to the first trace (name + launch order), placed on
the roofline against the GPU's peaks (datasheet, built-in measurements, a capture manifest's
``peaks``, then ``--peaks FILE``), and rendered with the four blocks per top kernel. Without
ncu inputs: a roofline estimated from the Kineto ops' FLOPs and shapes, labelled as such.
"""

from __future__ import annotations

from ..specs import peaks_for, peaks_warning


def _manifest(inputs):
    return inputs.manifests[0] if inputs.manifests else None


def hardware_results(inputs, analyses, *, peaks_path=None) -> tuple[list | None, str | None]:
    """(JSON rows for ``kernels[]`` or None, section body or None) for the ncu inputs."""
    from ..analysis.ncu_join import join_ncu
    from ..analysis.roofline import roofline
    from ..ingest.ncu import kernel_metrics_to_json
    from .hardware import render_hardware_section

    rows: list = []
    bodies: list[str] = []
    trace = analyses[0].trace if analyses else None
    for path, km in inputs.kernel_metrics:
        device = km.device_name or (trace.meta.devices[0].name if trace and trace.meta.devices else None)
        peaks = peaks_for(device, peaks_path, manifest=_manifest(inputs)) if device else None
        join = join_ncu(trace, km) if trace is not None else None
        rf = roofline(km, peaks)
        warn = peaks_warning(device) if peaks is None else None
        body = render_hardware_section(km, join, rf, peaks)
        bodies.append((f"_{warn}_\n\n" if warn else "") + body)
        for row, point in zip(kernel_metrics_to_json(km), _points_by_kernel(rf, km), strict=True):
            row["source_path"] = path
            row["roofline"] = point
            row["bound"] = point["bound"] if point else None
            rows.append(row)
    return (rows or None), ("\n".join(bodies) if bodies else None)


def _points_by_kernel(rf, km) -> list[dict | None]:
    from .jsonout import jsonable

    by_id = {p.kernel_id: p for p in rf.points}
    return [jsonable(by_id[k.id]) if k.id in by_id else None for k in km.kernels]


def estimated_roofline_section(analyses, *, peaks_path=None, manifest=None) -> str | None:
    """Roofline from the trace's ops (FLOPs recorded by the profiler, or from shapes), for traces
    without Nsight Compute data. ``None`` when no op carries enough to estimate."""
    from ..analysis.roofline import estimate_roofline
    from .hardware import render_roofline_ascii

    out = []
    for a in analyses:
        devs = a.trace.meta.devices
        device = devs[0].name if devs else None
        peaks = peaks_for(device, peaks_path, manifest=manifest) if device else None
        rf = estimate_roofline(a.trace, peaks)
        if not rf.points:
            continue
        out += ["**Roofline (estimate from op shapes; no hardware counters)**", ""]
        if rf.note:
            out += [rf.note, ""]
        if peaks is None:
            out += [f"_{peaks_warning(device)}_", ""]
        out += ["```text", render_roofline_ascii(rf, peaks), "```", ""]
        out += ["| kernel | count | FLOPs | bytes (est.) | FLOP/B | achieved | bound | % of roof |",
                "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
        for p in sorted(rf.points, key=lambda p: -(p.duration_ns or 0))[:10]:
            out.append(f"| `{p.label[:60]}` | {p.count} | {_si(p.flops, 'FLOP')} | {_si(p.dram_bytes, 'B')} | "
                       f"{'n/a' if p.arithmetic_intensity is None else f'{p.arithmetic_intensity:.3g}'} | "
                       f"{_achieved(p)} | {p.bound or 'n/a'} | "
                       f"{'n/a' if p.pct_of_roof is None else f'{p.pct_of_roof:.1f}%'} |")
        out.append("")
    return "\n".join(out) if out else None


def _si(v, unit: str) -> str:
    if v is None:
        return "n/a"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}"


def _achieved(p) -> str:
    if p.bound == "memory" and p.achieved_bytes_per_s is not None:
        return _si(p.achieved_bytes_per_s, "B/s")
    return "n/a" if p.achieved_flops_per_s is None else _si(p.achieved_flops_per_s, "FLOP/s")
