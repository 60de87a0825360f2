"""The analyzed timeline as a Chrome trace (JSON) that ui.perfetto.dev and chrome://tracing load.

Layout
------
One process per analysis (rank), ``pid`` = 1 + its index, named after the trace. Inside it,
tracks (Chrome "threads" with synthetic ids, named and ordered by metadata events):

* ``Phases (<source>)``: each phase of ``analysis.phases`` over its CPU range; args: family,
  step, kernel and memop counts, GPU busy/span, and the outlier ratio when the phase is one.
* ``Phases (GPU span)``: the same phases over their GPU span (first op start to last op end).
* ``GPU idle gaps``: every gap between merged busy periods of all GPU ops (the timeline's
  model, ``RunFacts.idle``), named by cause: ``idle: CPU in <op>`` for the gaps
  ``RunFacts.gaps`` explains (the longest ones), else ``idle: launch wait`` when at least half of the gap passed
  before the next op's launch call returned (``timeline``'s launch-wait split), ``idle:
  waiting`` when the op was already submitted (sync, dependency, queueing), or ``idle:
  unknown`` when its launch is not in the trace. Args carry the split in ns.
* ``GPU <d> stream <s>``: kernels and memops of that stream; ``cat`` and ``args.category``
  are the op's category (``analysis.classification``); args add launch geometry, bytes,
  correlation and external ids.
* ``GPU <d> annotations``: GPU-side ranges (``gpu_user_annotation``).
* ``CPU thread <tid>``: CPU ops, runtime/driver calls and CPU-side ranges of one thread.
* Counters ``memory (GPU <d>)`` / ``memory (host)`` from the ``[memory]`` samples.

Flows: one arrow per GPU op with a known launch call (``GpuOps.launch_row``), from the launch
call's start on its CPU thread (``ph: s``) to the op's start (``ph: f``, ``bp: e``); flow ids are
unique across the file.

Times: Chrome traces count microseconds; ``ts``/``dur`` are written as exact decimals of the
integer nanoseconds (``1234.567``), so no precision is lost. Each rank keeps its own clock.
No ``displayTimeUnit`` is written: older Perfetto releases read ``"ns"`` there as the unit of
``ts`` itself (google/perfetto#106, fixed in 2021), which would scale every time by 1000.

Nesting: the viewers build a track's slice stack from begin/end order, so two slices on one
track that overlap without one containing the other would be misdrawn or dropped. Each track's
slices are checked in one sweep (sort begins and ends, keep a running count of open slices):
a slice before whose end fewer slices are open than at its begin (plus itself) is the later
of a partly overlapping pair. Such slices move to an ``(overlap k)`` track beside it, repeated
until every track nests, so nothing is dropped. Real case: in the H200 fixture, cuBLAS's
split-K reduction kernels start ~100 ns before their GEMM ends on the same stream.

Cost: events are built column-wise (numpy for numbers, one JSON encoding per distinct name)
and joined with C-level ``map``; no Python code runs per event beyond string formatting.
The file is written gzip-compressed (level 6) when its name ends in ``.gz``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import outputs
from ..analysis.facts import RunFacts
from ..analysis.results import Results
from ..errors import UsageError
from ..trace import API_DRIVER, CPU_SIDE, MEMOP_KINDS

_SLICE = '{"ph":"X","pid":%d,"tid":%d,"ts":%s,"dur":%s,"name":%s,"cat":%s,"args":%s}'
_FLOW_S = '{"ph":"s","id":%d,"pid":%d,"tid":%d,"ts":%s,"name":"launch","cat":"launch"}'
_FLOW_F = '{"ph":"f","bp":"e","id":%d,"pid":%d,"tid":%d,"ts":%s,"name":"launch","cat":"launch"}'
_COUNTER = '{"ph":"C","pid":%d,"ts":%s,"name":%s,"args":%s}'
_TID_BASE = 10_000  # synthetic track ids; never equal to a pid (1 + rank index)


@dataclass(frozen=True)
class PerfettoExport:
    path: Path
    process_count: int
    track_count: int
    slice_count: int
    flow_count: int  # launch -> GPU op arrows (each written as one s and one f event)
    counter_count: int


# ----------------------------------------------------------------------------- formatting


def _j(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def _us(ns: np.ndarray) -> list[str]:
    """Exact decimal microseconds of integer nanoseconds: 1234567 -> '1234.567'."""
    ns = np.asarray(ns, dtype=np.int64)
    if ns.size == 0:  # np.char.zfill cannot size an empty result
        return []
    a = np.abs(ns)
    text = np.char.add(np.char.add((a // 1000).astype(str), "."), np.char.zfill((a % 1000).astype(str), 3))
    return np.where(ns < 0, np.char.add("-", text), text).tolist()


def _num(col: np.ndarray) -> np.ndarray:
    """Integers as JSON text; the missing value -1 as null."""
    col = np.asarray(col)
    return np.where(col >= 0, col.astype(np.int64).astype(str), "null")


def _fnum(col: np.ndarray) -> np.ndarray:
    col = np.asarray(col, dtype=np.float64)
    return np.where(np.isfinite(col), col.astype(str), "null")


def _names(strings: Sequence[str], codes: np.ndarray) -> np.ndarray:
    """JSON string literals of name codes; each distinct name is encoded once."""
    uniq, inv = np.unique(np.asarray(codes, dtype=np.int64), return_inverse=True)
    lit = np.array([_j(strings[c] if c >= 0 else "") for c in uniq.tolist()], dtype=object)
    return lit[inv.reshape(-1)]


def _lits(values) -> list[str]:
    """JSON literals of Python values (None -> null); each distinct value is encoded once."""
    values = list(values)
    table = {v: _j(v) for v in set(values)}
    return list(map(table.__getitem__, values))


def _groups(a: np.ndarray, b: np.ndarray):
    """``((a_value, b_value), rows)`` per distinct pair, pairs in ascending order, rows ascending."""
    ua, ia = np.unique(a, return_inverse=True)
    ub, ib = np.unique(b, return_inverse=True)
    key = ia.reshape(-1).astype(np.int64) * max(len(ub), 1) + ib.reshape(-1)
    order = np.argsort(key, kind="stable")
    cuts = np.flatnonzero(np.diff(key[order])) + 1
    for rows in np.split(order, cuts) if order.size else []:
        g = int(key[rows[0]])
        yield (int(ua[g // max(len(ub), 1)]), int(ub[g % max(len(ub), 1)])), rows


def _objects(**fields) -> list[str]:
    """One JSON object per row from columns of ready JSON text (arrays or one shared string)."""
    n = max(len(v) for v in fields.values() if not isinstance(v, str))
    keys = list(fields)
    fmt = "{" + ",".join(f'"{k}":%s' for k in keys) + "}"
    cols = [[v] * n if isinstance(v, str) else np.asarray(v, dtype=object).tolist() for v in fields.values()]
    return list(map(fmt.__mod__, zip(*cols, strict=False)))


def _dims(x, y, z) -> np.ndarray:
    text = np.char.add(
        np.char.add(np.char.add(np.char.add(np.char.add("[", x.astype(str)), ","), y.astype(str)), ","), z.astype(str)
    )
    return np.where(x >= 0, np.char.add(text, "]"), "null")


# ----------------------------------------------------------------------------- nesting


def _improper(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Mask of slices that are not properly nested with the others (see the module docstring)."""
    n = s.size
    if n < 2:
        return np.zeros(n, dtype=bool)
    idx = np.arange(n)
    t = np.concatenate([s, e])
    # At one instant: ends of non-empty slices, then begins (longer first, then by index), then
    # ends of empty slices; ends at one instant close the later-begun slice first (LIFO).
    rank = np.concatenate([np.ones(n, np.int64), np.where(e > s, 0, 2)])
    tie1 = np.concatenate([s - e, -s])
    tie2 = np.concatenate([idx, -idx])
    order = np.lexsort((tie2, tie1, rank, t))
    k = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])[order]
    before = np.cumsum(k) - k
    at = np.empty(2 * n, dtype=np.int64)
    at[order] = before
    # Fewer slices open just before its end than at its begin (+ itself): a slice that enclosed
    # its begin ended inside it, so it is the later of a partly overlapping pair. Moving these
    # keeps the earlier (usually the main) slice in place. By time symmetry with "the first
    # close that breaks stack order", a non-nested set always has one; the first slice to
    # begin never is one, so removing them makes progress and never empties the set.
    return at[n:] < at[:n] + 1


def _lanes(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Lane per slice such that every lane nests properly; 0 for all when already nested."""
    lane = np.zeros(s.size, dtype=np.int64)
    pending, level = np.arange(s.size), 0
    while pending.size:
        keep, spill = pending, []
        while True:
            bad = _improper(s[keep], e[keep])
            if not bad.any():
                break
            spill.append(keep[bad])
            keep = keep[~bad]
        lane[keep] = level
        pending = np.sort(np.concatenate(spill)) if spill else pending[:0]
        level += 1
    return lane


# ----------------------------------------------------------------------------- one process


class _Process:
    def __init__(self, pid: int, label: str):
        self.pid, self.label = pid, label
        self.events: list[str] = []
        self.tracks: list[str] = []
        self.slices = self.counters = 0

    def track(self, name: str) -> int:
        self.tracks.append(name)
        return _TID_BASE + len(self.tracks) - 1

    def slices_on(self, name: str, s, e, names, cats, args) -> np.ndarray:
        """Add slices on track ``name`` (plus overlap tracks if needed); returns each row's tid."""
        s, e = np.asarray(s, np.int64), np.asarray(e, np.int64)
        lane = _lanes(s, e)
        tids = np.empty(s.size, dtype=np.int64)
        for level in range(int(lane.max()) + 1 if s.size else 1):
            tids[lane == level] = self.track(name if level == 0 else f"{name} (overlap {level})")
        # ``cats``: one category name for all rows, or per-row JSON literals.
        cats = [_j(cats)] * s.size if isinstance(cats, str) else np.asarray(cats, dtype=object).tolist()
        self.events.extend(
            map(
                _SLICE.__mod__,
                zip(
                    [self.pid] * s.size,
                    tids.tolist(),
                    _us(s),
                    _us(e - s),
                    np.asarray(names, dtype=object).tolist(),
                    cats,
                    args,
                    strict=False,
                ),
            )
        )
        self.slices += int(s.size)
        return tids

    def metadata(self, rank_sort: int) -> list[str]:
        out = [
            _j({"ph": "M", "pid": self.pid, "name": "process_name", "args": {"name": self.label}}),
            _j({"ph": "M", "pid": self.pid, "name": "process_sort_index", "args": {"sort_index": rank_sort}}),
        ]
        for i, name in enumerate(self.tracks):
            tid = _TID_BASE + i
            out.append(_j({"ph": "M", "pid": self.pid, "tid": tid, "name": "thread_name", "args": {"name": name}}))
            out.append(
                _j({"ph": "M", "pid": self.pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": i}})
            )
        return out


def _phase_tracks(p: _Process, a) -> None:
    ph = a.phases
    if not ph.phases:
        return
    ratio = {o.phase_index: o.ratio for o in ph.outliers}
    rows = [
        {
            "family": x.family,
            "step": x.step,
            "kernel_count": x.kernel_count,
            "memop_count": x.memop_count,
            "wall_ns": x.wall_ns,
            "gpu_span_ns": x.gpu_span_ns,
            "gpu_busy_ns": x.gpu_busy_ns,
            "outlier_ratio": ratio.get(x.index),
            "source": ph.source,
        }
        for x in ph.phases
    ]
    names = [_j(x.name) for x in ph.phases]
    p.slices_on(
        f"Phases ({ph.source})",
        [x.start_ns for x in ph.phases],
        [x.end_ns for x in ph.phases],
        names,
        "phase",
        [_j(r) for r in rows],
    )
    on_gpu = [i for i, x in enumerate(ph.phases) if x.gpu_start_ns is not None]
    if on_gpu:
        p.slices_on(
            "Phases (GPU span)",
            [ph.phases[i].gpu_start_ns for i in on_gpu],
            [ph.phases[i].gpu_end_ns for i in on_gpu],
            [names[i] for i in on_gpu],
            "phase",
            [_j(rows[i]) for i in on_gpu],
        )


def _gap_track(p: _Process, f: RunFacts) -> None:
    t, gaps = f.trace, f.idle
    if not len(gaps):
        return
    g0, g1 = gaps.start_ns, gaps.end_ns
    dur = g1 - g0
    names = f.gpu_ops.name
    before, after, wait = gaps.before, gaps.after, gaps.launch_wait_ns
    L = f.gpu_ops.launch_end_ns[after]
    label = np.where(L < 0, "idle: unknown", np.where(2 * wait >= dur, "idle: launch wait", "idle: waiting"))
    cause = np.where(
        L < 0,
        "next GPU op's launch call not in the trace",
        np.where(
            2 * wait >= dur,
            "launch wait: next GPU op not yet submitted by the host",
            "submitted but waiting: synchronisation, dependency or queueing",
        ),
    )
    label, cause = label.astype(object), cause.astype(object)
    host_op = np.full(g0.size, None, dtype=object)
    for g in f.gaps:
        if g.op_name:
            i = int(np.searchsorted(g0, g.start_ns))
            label[i] = f"idle: CPU in {g.op_name}"
            cause[i] = f"host inside CPU op {g.op_name} while the GPU waited"
            host_op[i] = g.op_name
    args = _objects(
        dur_ns=_num(dur),
        launch_wait_ns=_num(wait),
        other_ns=_num(dur - wait),
        cause=_lits(cause.tolist()),
        host_op=_lits(host_op.tolist()),
        before=_names(t.strings, names[before]),
        after=_names(t.strings, names[after]),
    )
    p.slices_on("GPU idle gaps", g0, g1, _lits(label.tolist()), "idle", args)


def _gpu_tracks(p: _Process, f: RunFacts) -> np.ndarray:
    """Stream tracks; returns the tid of every GPU op (kernels then memops)."""
    t, ops = f.trace, f.gpu_ops
    k, m = t.kernels, t.memops
    lit = np.array([_j(c) for c in ops.categories], dtype=object)  # once per category
    cat_lit = lit[ops.category.astype(np.int64)]
    nk, nm = len(k), len(m)
    kind = np.asarray([_j(x) for x in MEMOP_KINDS + ("unknown",)], dtype=object)
    k_args = (
        _objects(
            category=cat_lit[:nk],
            device=_num(k["device"]),
            stream=_num(k["stream"]),
            correlation=_num(k["correlation"]),
            external_id=_num(k["external_id"]),
            grid=_dims(k["grid_x"], k["grid_y"], k["grid_z"]),
            block=_dims(k["block_x"], k["block_y"], k["block_z"]),
            registers_per_thread=_num(k["registers_per_thread"]),
            shared_mem_bytes=_num(k["shared_mem_bytes"]),
        )
        if nk
        else []
    )
    m_args = (
        _objects(
            category=cat_lit[nk:],
            device=_num(m["device"]),
            stream=_num(m["stream"]),
            correlation=_num(m["correlation"]),
            external_id=_num(m["external_id"]),
            kind=kind[np.where(m["kind"] >= 0, m["kind"], -1)],
            bytes=_num(m["bytes"]),
        )
        if nm
        else []
    )
    args = np.asarray(k_args + m_args, dtype=object)
    s, e = ops.start_ns, ops.end_ns
    dev, st = ops.device, ops.stream
    names = _names(t.strings, ops.name)
    tids = np.empty(nk + nm, dtype=np.int64)
    for (d, sid), rows in _groups(dev, st):
        rows = rows[np.argsort(s[rows], kind="stable")]
        name = f"GPU {d if d >= 0 else '?'} stream {sid if sid >= 0 else '?'}"
        tids[rows] = p.slices_on(name, s[rows], e[rows], names[rows], cat_lit[rows], args[rows].tolist())
    return tids


def _gpu_range_tracks(p: _Process, a) -> None:
    t, r = a.trace, a.trace.ranges
    gpu = np.flatnonzero(r["side"] != CPU_SIDE)
    for d in sorted(set(r["device"][gpu].tolist())):
        rows = gpu[r["device"][gpu] == d]
        p.slices_on(
            f"GPU {d if d >= 0 else '?'} annotations",
            r["start_ns"][rows],
            r["end_ns"][rows],
            _names(t.strings, r["name"][rows]),
            "gpu_annotation",
            _objects(external_id=_num(r["external_id"][rows])),
        )


def _cpu_tracks(p: _Process, a) -> np.ndarray:
    """CPU thread tracks; returns the tid of every api row (for the flows)."""
    t = a.trace
    ops, api, r = t.ops, t.api, t.ranges
    cpu_r = np.flatnonzero(r["side"] == CPU_SIDE)
    range_cat = "nvtx" if t.meta.source_format.startswith("nsys") else "user_annotation"
    n_o, n_a, n_r = len(ops), len(api), cpu_r.size
    pid = np.concatenate([ops["pid"], api["pid"], r["pid"][cpu_r]]).astype(np.int64)
    tid = np.concatenate([ops["tid"], api["tid"], r["tid"][cpu_r]]).astype(np.int64)
    s = np.concatenate([ops["start_ns"], api["start_ns"], r["start_ns"][cpu_r]]).astype(np.int64)
    e = np.concatenate([ops["end_ns"], api["end_ns"], r["end_ns"][cpu_r]]).astype(np.int64)
    names = np.concatenate(
        [_names(t.strings, ops["name"]), _names(t.strings, api["name"]), _names(t.strings, r["name"][cpu_r])]
    )
    cats = np.concatenate(
        [
            np.full(n_o, '"cpu_op"', dtype=object),
            np.where(api["kind"] == API_DRIVER, '"cuda_driver"', '"cuda_runtime"').astype(object),
            np.full(n_r, _j(range_cat), dtype=object),
        ]
    )
    args = np.asarray(
        _objects(
            external_id=_num(np.concatenate([ops["external_id"], api["external_id"], r["external_id"][cpu_r]])),
            correlation=np.concatenate([np.full(n_o, "null"), _num(api["correlation"]), np.full(n_r, "null")]),
            flops=np.concatenate([_fnum(ops["flops"]), np.full(n_a + n_r, "null")]),
        )
        if n_o + n_a + n_r
        else [],
        dtype=object,
    )
    row_tid = np.empty(s.size, dtype=np.int64)
    several = np.unique(pid).size > 1
    for (pp, tt), rows in _groups(pid, tid):
        rows = rows[np.lexsort((-(e[rows] - s[rows]), s[rows]))]
        name = f"CPU thread {tt if tt != -1 else '?'}" + (f" (pid {pp})" if several else "")
        row_tid[rows] = p.slices_on(name, s[rows], e[rows], names[rows], cats[rows], args[rows].tolist())
    return row_tid[n_o : n_o + n_a]


def _counters(p: _Process, a) -> None:
    """One counter track per device and quantity; a sample missing a quantity is left out."""
    mem = a.trace.memory
    for d in sorted(set(mem["device"].tolist())):
        on = mem["device"] == d
        name = _j(f"memory (GPU {d})" if d >= 0 else "memory (host)")
        for key in ("allocated_bytes", "reserved_bytes"):
            rows = np.flatnonzero(on & (mem[key] >= 0))
            args = _objects(**{key: _num(mem[key][rows])}) if rows.size else []
            p.events.extend(
                map(
                    _COUNTER.__mod__,
                    zip([p.pid] * rows.size, _us(mem["ts_ns"][rows]), [name] * rows.size, args, strict=False),
                )
            )
            p.counters += int(rows.size)


def _flows(p: _Process, f: RunFacts, op_tid: np.ndarray, api_tid: np.ndarray, first_id: int) -> int:
    t = f.trace
    li = f.gpu_ops.launch_row
    ok = np.flatnonzero(li >= 0)
    ids = (first_id + np.arange(ok.size)).tolist()
    pids = [p.pid] * ok.size
    p.events.extend(
        map(_FLOW_S.__mod__, zip(ids, pids, api_tid[li[ok]].tolist(), _us(t.api["start_ns"][li[ok]]), strict=False))
    )
    p.events.extend(
        map(_FLOW_F.__mod__, zip(ids, pids, op_tid[ok].tolist(), _us(f.gpu_ops.start_ns[ok]), strict=False))
    )
    return int(ok.size)


# ----------------------------------------------------------------------------- entry point


def export_perfetto(runs: Results | RunFacts | Sequence[RunFacts], path: str | Path) -> PerfettoExport:
    """Write the analyzed timeline of every run of ``runs`` (the :class:`Results` of
    ``analyze_inputs``, or the facts of one trace or of several; one process per rank) as a
    Chrome-trace JSON at ``path`` (gzip when it ends in ``.gz``). See the module docstring."""
    if isinstance(runs, Results):
        facts = [r.facts for r in runs.runs]
    elif isinstance(runs, RunFacts):
        facts = [runs]
    else:
        facts = list(runs)
    analyses = [f.analysis for f in facts]
    if not analyses:
        raise UsageError("export perfetto: no trace to export")
    flat = [a.trace.meta.source_path for a in analyses if not a.trace.meta.has_timeline]
    if flat:
        raise UsageError(
            f"{flat[0]}: has no timestamps (a summary-only input); expected a trace "
            "with a timeline (Kineto JSON or Nsight Systems SQLite)"
        )
    path = Path(path)
    chunks, n_tracks, n_slices, n_flows, n_counters = [], 0, 0, 0, 0
    for i, (a, f) in enumerate(zip(analyses, facts, strict=False)):
        p = _Process(pid=i + 1, label=a.trace.label)
        _phase_tracks(p, a)
        _gap_track(p, f)
        op_tid = _gpu_tracks(p, f)
        _gpu_range_tracks(p, a)
        api_tid = _cpu_tracks(p, a)
        _counters(p, a)
        n_flows += _flows(p, f, op_tid, api_tid, first_id=n_flows + 1)
        chunks.append(p.metadata(i))
        chunks.append(p.events)
        n_tracks += len(p.tracks)
        n_slices += p.slices
        n_counters += p.counters
    other = {
        "generator": "tracestory",
        "sources": [a.trace.meta.source_path for a in analyses],
        "taxonomy": analyses[0].classification.taxonomy.name,
    }
    head = '{"otherData":' + _j(other) + ',"traceEvents":[\n'
    # zlib's default level: level 9 (gzip.open's default) doubles the time for ~5% smaller files.
    with (
        outputs.atomic_path(path) as tmp,
        (
            gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6)
            if path.name.endswith(".gz")
            else open(tmp, "w", encoding="utf-8")
        ) as f,
    ):
        f.write(head)
        first = True
        for chunk in chunks:
            if not chunk:
                continue
            if not first:
                f.write(",\n")
            f.write(",\n".join(chunk))
            first = False
        f.write("\n]}\n")
    return PerfettoExport(
        path=path,
        process_count=len(analyses),
        track_count=n_tracks,
        slice_count=n_slices,
        flow_count=n_flows,
        counter_count=n_counters,
    )
