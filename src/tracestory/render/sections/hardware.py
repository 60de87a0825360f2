"""Hardware Behavior Analysis: the Nsight Compute inputs' kernels (``render.hardware``), else
the top kernels' launch configurations from the trace and the roofline estimated from op shapes."""

from __future__ import annotations

import numpy as np

from ...units import fmt_bytes, fmt_ns
from ..hardware import estimated_roofline_section, hardware_section
from ..md import label, md_table, short_name
from . import Context


def _hardware(runs) -> list[str]:
    analyses = [r.analysis for r in runs]
    amd = all(r.facts.platform == "ROCm" for r in runs)
    why = (
        "n/a: no hardware-counter input (rocprof-compute output is not read yet)"
        if amd
        else "n/a: no Nsight Compute input; pass an .ncu-rep or ncu CSV"
    )
    decodes = any(r.facts.workload.decodes for r in runs)
    unit = "CU" if amd else "SM"
    out = [why + ". What the trace itself says about the top kernels' launch configurations:", ""]
    for a in analyses:
        if len(analyses) > 1:
            out += [f"### {label(a)}", ""]
        k = a.trace.kernels
        sms = next((d.sm_count for d in a.trace.meta.devices if d.sm_count), None)
        rows = []
        below = 0  # top kernels with fewer blocks than SMs/CUs
        for ks in a.breakdown.kernels[:10]:
            code = a.trace.code_of(ks.name)
            i = np.flatnonzero(k["name"] == code)
            if i.size == 0:
                continue  # a memop
            known = i[k["grid_x"][i] >= 0]  # graph replays may carry no launch configuration
            i = known[0] if known.size else i[0]
            blocks = int(k["grid_x"][i]) * int(k["grid_y"][i]) * int(k["grid_z"][i]) if k["grid_x"][i] >= 0 else None
            grid = f"{k['grid_x'][i]}x{k['grid_y'][i]}x{k['grid_z'][i]}" if blocks else "n/a"
            block = f"{k['block_x'][i]}x{k['block_y'][i]}x{k['block_z'][i]}" if k["block_x"][i] >= 0 else "n/a"
            regs = int(k["registers_per_thread"][i]) if k["registers_per_thread"][i] >= 0 else "n/a"
            smem = fmt_bytes(int(k["shared_mem_bytes"][i])) if k["shared_mem_bytes"][i] >= 0 else "n/a"
            per_sm = f"{blocks / sms:.2f}" if blocks and sms else "n/a"
            below += bool(blocks and sms and blocks < sms)
            rows.append((f"`{short_name(ks.name, 50)}`", fmt_ns(ks.mean_ns), grid, block, regs, smem, per_sm))
        if rows and all(cell == "n/a" for row in rows for cell in row[2:]):
            out += [
                "The trace records no launch configuration (grid, block, registers, shared memory) for these kernels."
            ]
        elif rows:
            out += md_table(
                ("kernel (top by time)", "mean", "grid", "block", "regs/thread", "shared mem", f"blocks per {unit}"),
                rows,
                "lrrrrrr",
            )
            if below:
                out += [
                    "",
                    f"{below} of these kernels launch fewer blocks than the device has {unit}s: "
                    f"blocks per {unit} below 1 leaves {unit}s idle for the kernel's whole duration "
                    "(a small-grid, latency-bound launch"
                    + (", typical of decode GEMV-like kernels)." if decodes else ")."),
                ]
        out.append("")
    return out


def render(c: Context) -> list[str] | None:
    r = c.results
    if r.hardware:
        return [hardware_section(r.hardware).strip(), ""]
    if c.serving_only:
        return None
    if c.no_trace:
        return [c.no_trace, ""]
    estimate = estimated_roofline_section(r.runs)
    return _hardware(list(c.shown)) + ([estimate.strip(), ""] if estimate else [])
