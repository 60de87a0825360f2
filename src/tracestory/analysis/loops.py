"""Loops in a trace: which numbered family of ranges is a loop of steps over the work, and the
forward / backward / optimizer structure of a training loop. The rules are stated in
:mod:`.phases` (Steps a-c; phase source 3), which uses them.

* :func:`split_step`: ``"decode_3"`` -> ``("decode", 3)``.
* :func:`not_a_loop`: why a family is not steps (a model's layer index, numbers that restart or
  do not grow with time, members that overlap or launch different kernels), None when it is.
* :func:`family_verdicts`: that verdict for every numbered family of a level of ranges.
* :func:`training_phases`: ``forward#i`` / ``backward#i`` / ``optimizer#i`` from optimizer steps
  (``Optimizer.step#*``, ``## optimizer ##``) and backward work (``## backward ##``, autograd ops).

Limits: the layer-index test reads the name (``layer``, ``layers``, ``block``, ``blocks``,
``h``); a loop named otherwise is judged only on its structure. The training structure assumes
one optimizer step ends each iteration (gradient accumulation shows as one long forward /
backward); work between the backward and the optimizer step (gradient clipping, all-reduce
waits) and before the first launch is in no phase.
"""

from __future__ import annotations

import re
from itertools import pairwise

import numpy as np

from ..trace import CPU_SIDE, Trace
from . import intervals

_STEP = re.compile(r"^(.*?)[\s_#:.\-]*(\d+)$")
_LAYER_INDEX = re.compile(r"(?:layers?|blocks?|(?:^|[._/\s-])h)$", re.IGNORECASE)
_OPTIMIZER = re.compile(r"^(?:Optimizer\.step#|## optimi[sz]er? ##$)")
_BACKWARD = re.compile(r"^(?:## backward ##$|autograd::engine::evaluate_function: |torch::autograd::AccumulateGrad$)"
                       r"|Backward\d*$")
_FORWARD = "## forward ##"


def split_step(name: str) -> tuple[str, int | None]:
    """``"decode_3"`` -> ``("decode", 3)``; a name without a trailing number is its own family."""
    m = _STEP.match(name)
    if m is None or not m.group(1):
        return name, None
    return m.group(1), int(m.group(2))


def family_verdicts(trace: Trace, names: list[str], starts: np.ndarray, ends: np.ndarray,
                     member_of_kernel: np.ndarray) -> dict[str, str | None]:
    """For each numbered family with >= 2 members among ``names`` (ranges in time order), why it
    is not a loop of steps (None when it is one); ``member_of_kernel``: range index per kernel, -1."""
    split = [split_step(n) for n in names]
    by_fam: dict[str, list[int]] = {}
    for i, (f, _) in enumerate(split):
        by_fam.setdefault(f, []).append(i)
    k = trace.kernels
    order = np.argsort(k["start_ns"], kind="stable")
    m = member_of_kernel[order]
    rows, mm = order[m >= 0], m[m >= 0]
    srt = np.argsort(mm, kind="stable")
    rows, mm = rows[srt], mm[srt]
    bounds = np.searchsorted(mm, np.arange(len(names) + 1))
    out: dict[str, str | None] = {}
    for f, idx in by_fam.items():
        if len(idx) < 2 or all(split[i][1] is None for i in idx):
            continue
        seqs = [tuple(k["name"][rows[bounds[i]:bounds[i + 1]]].tolist()) for i in idx]
        out[f] = not_a_loop(f, seqs, starts[idx], ends[idx], [split[i][1] for i in idx])
    return out


def not_a_loop(family: str, kernel_seqs: list[tuple], starts: np.ndarray, ends: np.ndarray,
                steps: list[int | None]) -> str | None:
    """Why a numbered family is not a loop of steps over the work (tests a-c of :mod:`.phases`), or None when it is one. Members in time order."""
    if _LAYER_INDEX.search(family):
        return "its name indexes a model's layers: a loop over the layers of one pass, not over the work"
    nums = [x for x in steps if x is not None]
    if len(set(nums)) < len(nums):
        return "its numbers restart: it is nested in a repeated range that is the step"
    order = np.argsort(starts, kind="stable")
    if (starts[order][1:] < ends[order][:-1]).any():
        return "its members overlap in time: they do not run one after the other"
    seq_nums = [steps[i] for i in order if steps[i] is not None]
    if any(b <= a for a, b in pairwise(seq_nums)):
        return "its numbers do not grow with time"
    if any(kernel_seqs):
        _, counts = np.unique(np.array([hash(q) for q in kernel_seqs]), return_counts=True)
        if int(counts.max()) * 2 < len(kernel_seqs):
            return "its members launch different kernels: different work, not iterations"
    return None


def cpu_intervals(trace: Trace) -> tuple[np.ndarray, ...]:
    """Every CPU interval, ops then CPU-side ranges: (start, end, name code, pid, tid), int64."""
    o, r = trace.ops, trace.ranges
    cpu = np.flatnonzero(r["side"] == CPU_SIDE) if len(r) else np.zeros(0, dtype=np.int64)
    return tuple(np.concatenate([np.asarray(o[c], dtype=np.int64), np.asarray(r[c][cpu], dtype=np.int64)])
                 for c in ("start_ns", "end_ns", "name", "pid", "tid"))


def training_phases(trace: Trace, launch: np.ndarray, ok: np.ndarray):
    """Forward / backward / optimizer phases of a training loop (source 3 of :mod:`.phases`): (names, starts, ends) in time order, or None without optimizer steps and
    backward work."""
    st, en, nm, _, _ = cpu_intervals(trace)
    if st.size == 0:
        return None
    names = {int(c): trace.name(int(c)) for c in np.unique(nm) if c >= 0}

    def pick(test) -> np.ndarray:
        return np.isin(nm, [c for c, n in names.items() if test(n)])

    is_opt, is_bwd, is_fwd = pick(_OPTIMIZER.match), pick(_BACKWARD.search), pick(lambda n: n == _FORWARD)
    if not is_opt.any() or not is_bwd.any():
        return None
    o0, o1 = intervals.union(st[is_opt], en[is_opt])
    bo = np.argsort(st[is_bwd], kind="stable")
    b0, b1 = st[is_bwd][bo], en[is_bwd][bo]
    fo = np.argsort(st[is_fwd], kind="stable")
    f0, f1 = st[is_fwd][fo], en[is_fwd][fo]
    first = int(launch[ok].min()) if ok.any() else int(st.min())
    out: list[tuple[str, int, int]] = []
    prev = min(first, int(b0[0]), int(f0[0]) if f0.size else first)
    bounds = list(zip(o0.tolist(), o1.tolist()))
    if b0[-1] >= o1[-1]:  # backward work after the last optimizer step: an iteration without one
        bounds.append((int(max(b1.max(), b0[-1] + 1)), None))
    for i, (lo_opt, hi_opt) in enumerate(bounds):
        j0, j1 = np.searchsorted(b0, [prev, lo_opt])
        if j1 > j0:
            bs, be = int(b0[j0]), int(min(b1[j0:j1].max(), lo_opt))
            k0, k1 = np.searchsorted(f0, [prev, bs])
            fs, fe = (int(f0[k0]), int(min(f1[k0], bs))) if k1 > k0 else (prev, bs)
            if fe > fs:
                out.append((f"forward#{i}", fs, fe))
            out.append((f"backward#{i}", bs, be))
        if hi_opt is not None:
            out.append((f"optimizer#{i}", int(lo_opt), int(hi_opt)))
            prev = int(hi_opt)
    if not out:
        return None
    return ([n for n, _, _ in out], np.array([s for _, s, _ in out], dtype=np.int64),
            np.array([e for _, _, e in out], dtype=np.int64))
