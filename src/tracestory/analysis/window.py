"""Restrict a trace to part of its time before it is analysed: a time window, a run of steps, or
the steady state.

Three requests (:class:`WindowSpec`), one per command line flag:

* ``--window START:END``: milliseconds from the **trace start**, the earliest start of any row
  of the trace (kernels, memops, API calls, CPU ops, ranges, memory samples); the processes of
  one Nsight Systems report count from the earliest of them (one file, one clock), each Kineto
  file (rank) from its own. An empty side is the trace's edge (``5:`` = from 5 ms to the end).
* ``--steps A:B``: the steps numbered A to B (inclusive, the numbers of their names:
  ``ProfilerStep#5``, ``decode_12``) of the step family the phases analysis finds
  (:mod:`.phases`): ``ProfilerStep`` when the phases come from it, ``forward#i`` / ``backward#i``
  / ``optimizer#i`` of a training loop (step i is the three of them), else the most numerous
  numbered family that passes the loop tests (``Phases.families``). No such family: refused.
* ``--steady-state``: the steps of that family minus warm-up and a cut last step, by this rule
  (at least 3 steps are needed):

  1. the first step is dropped (warm-up: JIT compilation, autotuning, allocator growth, cold
     caches);
  2. the last step is dropped when it launches fewer GPU ops than the median of the steps
     between the first and the last (the capture stopped during it);
  3. of the steps left, leading steps whose time is at least ``WARMUP_RATIO`` (1.5x) the median
     of the steps left are dropped too, one after another from the start (a warm-up longer than
     one step); at least one step is kept.

  A step's time is what a caller timing it with a device sync sees: its CPU start to the later
  of its CPU end and the end of its last GPU op (as in :mod:`.compare`).

The window of steps has a CPU part, the first kept step's CPU start to the last kept step's CPU
end, and a GPU part, the first start to the last end of the GPU ops launched in the kept steps:
the GPU runs a step after the CPU has queued it. A time window uses one interval for both.

Rows at the edge (the rule, for every table):

* GPU ops (kernels, memops) are kept when they **start** inside the GPU interval ``[start,
  end)``, whole: a kernel that starts inside and ends after the edge keeps its full duration;
  one that started before the edge is dropped even if it runs into the window.
* CPU ops, ranges and API calls are kept when they **overlap** the CPU interval (start before
  its end, end after its start), whole, not clipped: a ``ProfilerStep`` range cut by a time
  window is kept with its full span, holding only the GPU ops inside the window (the phases
  then show it as a short step).
* Memory samples are kept when their time is inside the CPU interval.
* Collective records follow their kernel (renumbered to the kept rows); those without a kernel
  follow their own start.

Limits: a GPU op kept whose launch call starts outside the CPU interval loses its launch link
(counted as unlinked by the analyses). Ranks in separate Kineto files each count ``--window``
from their own first event, so their windows are aligned only as far as their starts are;
``--steps`` aligns ranks by step number. Nsight Compute inputs are joined to the trace by kernel
order and are not windowed (the command refuses them with a window); a scheduler event log, a
load summary and GPU telemetry are not restricted (the selection lists them in ``not_restricted``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from ..trace import Trace
from .phases import phases as find_phases

WARMUP_RATIO = 1.5
MIN_STEADY_STEPS = 3
_NS_PER_MS = 1_000_000
_TRAINING = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class WindowSpec:
    """What the user asked for: ``kind`` is "window" (``start_ms``/``end_ms``, None = the edge),
    "steps" (``first``..``last``) or "steady-state"."""

    kind: str
    start_ms: float | None = None
    end_ms: float | None = None
    first: int | None = None
    last: int | None = None

    @classmethod
    def from_flags(
        cls, window: str | None = None, steps: str | None = None, steady_state: bool = False
    ) -> WindowSpec | None:
        """The window ``--window``/``--steps``/``--steady-state`` ask for (at most one is given),
        or None (the whole trace). A malformed value is refused here, before anything is read."""
        if window is not None:
            return parse_window(window)
        if steps is not None:
            return parse_steps(steps)
        return cls("steady-state") if steady_state else None

    @property
    def request(self) -> str:
        """The flag as a user would type it."""
        if self.kind == "window":
            f = lambda v: "" if v is None else f"{v:g}"
            return f"--window {f(self.start_ms)}:{f(self.end_ms)}"
        if self.kind == "steps":
            return f"--steps {self.first}:{self.last}"
        return "--steady-state"


@dataclass(frozen=True)
class Step:
    """One step of the step family (one or several phases of the same number)."""

    name: str
    number: int
    start_ns: int  # CPU start
    cpu_end_ns: int
    gpu_start_ns: int | None
    gpu_end_ns: int | None
    gpu_ops: int  # kernels + memops launched in it
    time_ns: int  # max(CPU end, GPU end) - CPU start


@dataclass(frozen=True)
class TraceWindow:
    """The part of one trace kept. Times are on the trace's clock; ``*_ms`` from its start."""

    trace: str  # the trace's label
    trace_start_ns: int
    start_ns: int  # CPU interval
    end_ns: int
    gpu_start_ns: int  # GPU interval (= the CPU one for a time window)
    gpu_end_ns: int
    start_ms: float
    end_ms: float
    start_offset_ns: int  # start_ns - trace_start_ns
    end_offset_ns: int
    span_ns: int  # end_ns - start_ns (the CPU interval)
    family: str | None  # step family (steps, steady state)
    steps_kept: tuple[str, ...]
    steps_dropped: tuple[tuple[str, str], ...]  # (step, why)
    kernels_kept: int
    kernels_total: int


@dataclass(frozen=True)
class WindowSelection:
    """What part of the inputs the analysis describes (``Inputs.window``)."""

    request: str  # "--steps 5:7"
    rule: str  # the rule, one sentence
    traces: tuple[TraceWindow, ...]
    not_restricted: tuple[str, ...] = ()  # inputs the window does not apply to


# ------------------------------------------------------------------ parsing


def parse_window(text: str) -> WindowSpec:
    """``"START:END"`` in ms from the trace start; either side may be empty."""
    m = re.fullmatch(r"\s*([0-9.eE+]*)\s*:\s*([0-9.eE+]*)\s*", text or "")
    try:
        if m is None:
            raise ValueError
        lo = float(m.group(1)) if m.group(1) else None
        hi = float(m.group(2)) if m.group(2) else None
    except ValueError:
        raise UsageError(
            f"--window: expected START:END in ms from the trace start (e.g. 10:250), found {text!r}"
        ) from None
    if lo is not None and hi is not None and hi <= lo:
        raise UsageError(f"--window: expected END after START, found {text!r}")
    if any(v is not None and not np.isfinite(v) for v in (lo, hi)):
        raise UsageError(f"--window: expected finite ms, found {text!r}")
    return WindowSpec("window", start_ms=lo, end_ms=hi)


def parse_steps(text: str) -> WindowSpec:
    """``"A:B"`` (inclusive step numbers) or ``"A"`` (one step)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text or "")
    if m is None:
        raise UsageError(
            f"--steps: expected A:B, the step numbers of the first and last step (e.g. 5:7), found {text!r}"
        )
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) is not None else a
    if b < a:
        raise UsageError(f"--steps: expected A <= B, found {text!r}")
    return WindowSpec("steps", first=a, last=b)


# ------------------------------------------------------------------ the trace's edges


def trace_span(trace: Trace) -> tuple[int, int] | None:
    """Earliest start and latest end over every row of every table (memory samples by time)."""
    lo, hi = [], []
    for t in (trace.kernels, trace.memops, trace.api, trace.ops, trace.ranges):
        if len(t):
            lo.append(int(t["start_ns"].min()))
            hi.append(int(t["end_ns"].max()))
    if len(trace.memory):
        lo.append(int(trace.memory["ts_ns"].min()))
        hi.append(int(trace.memory["ts_ns"].max()))
    return (min(lo), max(hi)) if lo else None


def restrict(
    trace: Trace, start_ns: int, end_ns: int, gpu_start_ns: int | None = None, gpu_end_ns: int | None = None
) -> Trace:
    """A new trace holding the rows of ``trace`` inside the window, by the rule of the module
    docstring. The GPU interval defaults to the CPU one."""
    gs = start_ns if gpu_start_ns is None else gpu_start_ns
    ge = end_ns if gpu_end_ns is None else gpu_end_ns

    def starts_in(t, lo, hi):
        s = t["start_ns"]
        return (s >= lo) & (s < hi)

    def overlaps(t):
        s, e = t["start_ns"], t["end_ns"]
        # a zero-length row overlaps when its instant is inside
        return (s < end_ns) & ((e > start_ns) | ((e == s) & (s >= start_ns)))

    k_keep = starts_in(trace.kernels, gs, ge)
    kernels = trace.kernels.take(k_keep)
    memops = trace.memops.take(starts_in(trace.memops, gs, ge))
    mem = trace.memory
    memory = mem.take((mem["ts_ns"] >= start_ns) & (mem["ts_ns"] < end_ns))
    coll = trace.collectives
    if len(coll):
        ki = coll["kernel_index"]
        has = (ki >= 0) & (ki < len(k_keep))
        keep = np.where(has, k_keep[np.where(has, ki, 0)], starts_in(coll, gs, ge))
        new_row = np.cumsum(k_keep) - 1
        coll = coll.take(keep)
        ki = coll["kernel_index"]
        has = (ki >= 0) & (ki < len(k_keep))
        coll = coll.with_columns(kernel_index=np.where(has, new_row[np.where(has, ki, 0)], -1).astype(np.int64))
    return dataclasses.replace(
        trace,
        kernels=kernels,
        memops=memops,
        api=trace.api.take(overlaps(trace.api)),
        ops=trace.ops.take(overlaps(trace.ops)),
        ranges=trace.ranges.take(overlaps(trace.ranges)),
        memory=memory,
        collectives=coll,
        osrt=trace.osrt.take(overlaps(trace.osrt)),
    )


# ------------------------------------------------------------------ steps


def steps(trace: Trace) -> tuple[str | None, tuple[Step, ...], str]:
    """(family, steps in time order, why there are none) of the trace's step family."""
    ph = find_phases(trace)
    if ph.source == "none" or not ph.phases:
        return None, (), f"its phases are {ph.reason or 'one phase'}"
    if ph.source == "ProfilerStep":
        fams = ("ProfilerStep",)
    elif ph.source == "training":
        fams = _TRAINING
    elif ph.families:
        counts = {f.family: f.count for f in ph.families}
        fams = (max(counts, key=counts.get),)
    else:
        nots = "; ".join(f"{f}: {why}" for f, why in ph.not_steps[:2])
        return (
            None,
            (),
            (
                f"its phases ({ph.source}) hold no ProfilerStep markers and no loop of numbered "
                "ranges" + (f" ({nots})" if nots else "")
            ),
        )
    by_num: dict[int, list] = {}
    for p in ph.phases:
        if p.family in fams and p.step is not None:
            by_num.setdefault(p.step, []).append(p)
    out = []
    for n, members in by_num.items():
        start = min(p.start_ns for p in members)
        cpu_end = max(p.end_ns for p in members)
        gs = [p.gpu_start_ns for p in members if p.gpu_start_ns is not None]
        ge = [p.gpu_end_ns for p in members if p.gpu_end_ns is not None]
        gpu_end = max(ge) if ge else None
        name = members[0].name if len(members) == 1 else f"iteration {n} ({', '.join(p.name for p in members)})"
        out.append(
            Step(
                name=name,
                number=n,
                start_ns=start,
                cpu_end_ns=cpu_end,
                gpu_start_ns=min(gs) if gs else None,
                gpu_end_ns=gpu_end,
                gpu_ops=sum(p.kernel_count + p.memop_count for p in members),
                time_ns=max(cpu_end, gpu_end if gpu_end is not None else cpu_end) - start,
            )
        )
    out.sort(key=lambda s: (s.start_ns, s.number))
    family = fams[0] if len(fams) == 1 else "training iteration"
    return family, tuple(out), ""


def steady_steps(all_steps: tuple[Step, ...]) -> tuple[tuple[Step, ...], tuple[tuple[Step, str], ...]]:
    """(kept, dropped with why) by the steady-state rule of the module docstring."""
    dropped: list[tuple[Step, str]] = [(all_steps[0], "first step, warm-up")]
    rest = list(all_steps[1:])
    middle = [s.gpu_ops for s in all_steps[1:-1]]
    last = all_steps[-1]
    if middle and last.gpu_ops < float(np.median(middle)):
        rest.pop()
        why = (
            f"cut by the trace end: {last.gpu_ops} GPU ops, the steps before it a median of "
            f"{float(np.median(middle)):g}"
        )
        dropped.append((last, why))
    med = float(np.median([s.time_ns for s in rest]))
    while len(rest) > 1 and rest[0].time_ns >= WARMUP_RATIO * med:
        s = rest.pop(0)
        dropped.append((s, f"warm-up, {s.time_ns / med:.2f}x the median step time of the steps left"))
    return tuple(rest), tuple(sorted(dropped, key=lambda d: d[0].start_ns))


# ------------------------------------------------------------------ one trace, all inputs


def _refuse(trace: Trace, what: str) -> UsageError:
    return UsageError(f"{trace.meta.source_path}: {what}")


def window_trace(trace: Trace, spec: WindowSpec, origin_ns: int | None = None) -> tuple[Trace, TraceWindow]:
    """``trace`` restricted by ``spec``, and what was kept. ``origin_ns``: the time ``--window``
    counts from (default: the trace's first event). Refuses (one line) a request the trace
    cannot answer: no timeline, no steps, steps it does not have, a window holding no GPU op."""
    if not trace.meta.has_timeline:
        raise _refuse(
            trace,
            f"{spec.request}: expected a trace with a timeline, found a summary without start "
            "times (an nsys stats table)",
        )
    span = trace_span(trace)
    if span is None:
        raise _refuse(trace, f"{spec.request}: expected a trace with events, found none")
    t0 = span[0] if origin_ns is None else origin_ns
    family, kept, dropped = None, (), ()
    if spec.kind == "window":
        lo = t0 + (round(spec.start_ms * _NS_PER_MS) if spec.start_ms is not None else 0)
        hi = t0 + round(spec.end_ms * _NS_PER_MS) if spec.end_ms is not None else span[1] + 1
        cpu = gpu = (lo, hi)
    else:
        family, all_steps, why = steps(trace)
        if not all_steps:
            raise _refuse(trace, f"{spec.request} needs steps: {why}")
        if spec.kind == "steps":
            sel = tuple(s for s in all_steps if spec.first <= s.number <= spec.last)
            if not sel:
                nums = sorted(s.number for s in all_steps)
                raise _refuse(
                    trace,
                    f"--steps {spec.first}:{spec.last}: expected step numbers of {family}, "
                    f"found steps {nums[0]}..{nums[-1]} ({len(nums)} steps)",
                )
            kept, dropped = sel, ()
        else:
            if len(all_steps) < MIN_STEADY_STEPS:
                raise _refuse(
                    trace,
                    f"--steady-state: expected at least {MIN_STEADY_STEPS} steps of {family}, found {len(all_steps)}",
                )
            kept, dropped = steady_steps(all_steps)
        cpu = (min(s.start_ns for s in kept), max(s.cpu_end_ns for s in kept))
        g_lo = [s.gpu_start_ns for s in kept if s.gpu_start_ns is not None]
        g_hi = [s.gpu_end_ns for s in kept if s.gpu_end_ns is not None]
        gpu = (min(g_lo), max(g_hi)) if g_lo else cpu
    out = restrict(trace, cpu[0], cpu[1], gpu[0], gpu[1])
    if len(out.kernels) + len(out.memops) == 0:
        k = trace.kernels
        where = (
            f"the trace's kernels run {(int(k['start_ns'].min()) - t0) / _NS_PER_MS:.3f}.."
            f"{(int(k['end_ns'].max()) - t0) / _NS_PER_MS:.3f} ms"
            if len(k)
            else "the trace has no kernel"
        )
        raise _refuse(
            trace,
            f"{spec.request}: expected GPU ops inside the window "
            f"{(cpu[0] - t0) / _NS_PER_MS:.3f}..{(cpu[1] - t0) / _NS_PER_MS:.3f} ms, found none "
            f"({where})",
        )
    tw = TraceWindow(
        trace=trace.label,
        trace_start_ns=t0,
        start_ns=int(cpu[0]),
        end_ns=int(cpu[1]),
        gpu_start_ns=int(gpu[0]),
        gpu_end_ns=int(gpu[1]),
        start_ms=(cpu[0] - t0) / _NS_PER_MS,
        end_ms=(cpu[1] - t0) / _NS_PER_MS,
        start_offset_ns=int(cpu[0] - t0),
        end_offset_ns=int(cpu[1] - t0),
        span_ns=int(cpu[1] - cpu[0]),
        family=family,
        steps_kept=tuple(s.name for s in kept),
        steps_dropped=tuple((s.name, why) for s, why in dropped),
        kernels_kept=len(out.kernels),
        kernels_total=len(trace.kernels),
    )
    return out, tw


RULES = {
    "window": (
        "GPU ops that start inside the window and CPU ops, ranges and API calls that overlap it, "
        "whole; memory samples inside it; times from the first event of each trace file"
    ),
    "steps": (
        "steps {a}..{b} of the step family: CPU ops, ranges and API calls overlapping their CPU span, "
        "GPU ops starting inside the span of the GPU ops they launched"
    ),
    "steady-state": (
        "the step family without its first step (warm-up), without a last step that launches "
        "fewer GPU ops than the median of the steps before it (cut by the trace end), and "
        "without leading steps >= 1.5x the median step time of the rest"
    ),
}


def rule_text(spec: WindowSpec) -> str:
    return RULES[spec.kind].format(a=spec.first, b=spec.last)


def window_traces(traces, spec: WindowSpec) -> tuple[tuple[Trace, ...], WindowSelection]:
    """Every trace restricted by ``spec``. Time windows count from the first event of the trace's
    file: the processes of one Nsight Systems report share one origin (one clock, one file), and
    each Kineto file (one per rank) has its own."""
    origin: dict[str, int] = {}
    for t in traces:
        span = trace_span(t)
        if span is not None:
            key = t.meta.source_path
            origin[key] = min(origin.get(key, span[0]), span[0])
    pairs = [window_trace(t, spec, origin.get(t.meta.source_path)) for t in traces]
    return (
        tuple(p[0] for p in pairs),
        WindowSelection(request=spec.request, rule=rule_text(spec), traces=tuple(p[1] for p in pairs)),
    )


def window_inputs(inputs, spec: WindowSpec | None):
    """``inputs`` (:class:`~tracestory.ingest.Inputs`) with every trace restricted and
    ``window`` set; unchanged when ``spec`` is None. Refused: no trace, or Nsight Compute
    metrics (joined by kernel order, which a window breaks)."""
    if spec is None:
        return inputs
    if not inputs.traces:
        raise UsageError(
            f"{inputs.paths[0] if inputs.paths else 'inputs'}: {spec.request} restricts a trace "
            "(Kineto or Nsight Systems); these inputs hold none"
        )
    if inputs.kernel_metrics:
        raise UsageError(
            f"{inputs.kernel_metrics[0][0]}: {spec.request} cannot restrict Nsight Compute kernel "
            "metrics (joined to the trace by kernel order); report them without the window"
        )
    traces, sel = window_traces(inputs.traces, spec)
    others = [
        what
        for what, v in (
            ("scheduler event log", inputs.scheduler_log),
            ("load summary", inputs.load_summary),
            ("GPU telemetry", inputs.telemetry),
        )
        if v is not None
    ]
    sel = dataclasses.replace(sel, not_restricted=tuple(others))
    return dataclasses.replace(inputs, traces=traces, window=sel)
