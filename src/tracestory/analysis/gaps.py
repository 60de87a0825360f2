"""Idle gaps of the GPU and the CPU work the host was doing while the GPU waited.

The cause of a gap ``[g0, g1)`` is the innermost CPU op (same thread as the launch call) that
encloses the launch call of the GPU op starting at ``g1`` and lasts at least half the gap: the host
was inside it while the GPU waited.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace import Trace
from . import intervals
from .links import gpu_ops_column, launch_index

STALL_MIN_NS = 1_000_000


def gpu_ops(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of every GPU op (kernels then memops)."""
    return gpu_ops_column(trace, "start_ns"), gpu_ops_column(trace, "end_ns")


@dataclass(frozen=True)
class GapCause:
    start_ns: int
    dur_ns: int
    launch_wait_ns: int
    after: str               # GPU op that ended the gap
    op_name: str | None      # CPU op the host was inside while the GPU waited
    op_dur_ns: int | None



def gap_causes(trace: Trace, *, min_ns: int = STALL_MIN_NS, limit: int = 50) -> tuple[GapCause, ...]:
    """The longest idle gaps (>= ``min_ns``, at most ``limit``, longest first) with the CPU op
    the host was inside while the GPU waited (see the module docstring); ``op_name`` is None
    when no enclosing op lasts half the gap or the next op's launch is unknown."""
    s, e = gpu_ops(trace)
    g0, g1 = intervals.gaps(s, e)
    dur = g1 - g0
    keep = np.flatnonzero(dur >= min_ns)
    keep = keep[np.argsort(-dur[keep], kind="stable")][:limit]
    if keep.size == 0:
        return ()
    k, m = trace.kernels, trace.memops
    k_launch, m_launch = launch_index(trace, k), launch_index(trace, m)
    api, ops = trace.api, trace.ops
    out = []
    for gi in keep:
        a, b = int(g0[gi]), int(g1[gi])
        # The op starting at the gap end: a kernel if one starts there, else a memop.
        hit = np.flatnonzero(k["start_ns"] == b)
        if hit.size:
            row, li, name_code = hit[0], k_launch[hit[0]], k["name"][hit[0]]
        else:
            hit = np.flatnonzero(m["start_ns"] == b)
            row = hit[0] if hit.size else -1
            li = m_launch[row] if row >= 0 else -1
            name_code = m["name"][row] if row >= 0 else -1
        after = trace.name(int(name_code)) if row >= 0 else ""
        wait, op_name, op_dur = 0, None, None
        if li >= 0:
            ls, le, tid = api["start_ns"][li], api["end_ns"][li], api["tid"][li]
            wait = int(np.clip(le - a, 0, b - a))
            od = ops["end_ns"] - ops["start_ns"]
            enc = (ops["start_ns"] <= ls) & (ops["end_ns"] >= le) & (od >= (b - a) // 2)
            if tid >= 0:
                enc &= ops["tid"] == tid
            cand = np.flatnonzero(enc)
            if cand.size:
                j = cand[np.argmin(od[cand])]
                op_name, op_dur = trace.name(int(ops["name"][j])), int(od[j])
        out.append(GapCause(a, b - a, wait, after, op_name, op_dur))
    return tuple(out)
