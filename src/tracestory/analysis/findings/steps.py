"""Step rules: the first iteration against the rest, one-off slow steps, and the per-step
trend (inter-token latency against the KV-cache length for decode).

Step time is the phases' own measure (GPU span when the step launched GPU ops, else its CPU
wall time), so these findings agree with the phase table and the Execution Story.

* ``first_step``: in a family of >= 3 steps, the first step's time against the median of the
  others. ``>= 1.5x`` is the warm-up signature (JIT compilation, autotuning, allocator growth,
  cold caches); ``<= 1/1.5`` is the reverse surprise: every later step pays a cost the first did
  not (typically a new input shape each step, so per-shape plans or kernels are rebuilt).
* ``step_outlier``: other steps >= 1.5x their family median (``phases.outliers``).
* ``step_trend``: least squares of step time against the KV length when every step's attention
  op recorded its key shape (``record_shapes``), else against the step number: slope, intercept,
  r2; "grows" when r2 >= 0.5 and the fitted change over the run is >= 10% of the mean step. The
  same fit of the GPU busy time per step says whether device work grows with the cache even
  when host time hides it.

KV length: the key tensor's sequence dimension of the largest attention call inside the step's
CPU range: ``aten::scaled_dot_product_attention`` (and its ``_scaled_dot_product_*`` variants,
layout B,H,S,D: ``dims[1][-2]``), ``_flash_attention_forward`` / ``_efficient_attention_forward``
and ``flash_attn`` ops (B,S,H,D: ``dims[1][1]``).
"""

from __future__ import annotations

import numpy as np

from ..facts import RunFacts
from .base import Evidence, Finding, linear_fit
from ...units import fmt_ns, fmt_pct
from ...ingest.kineto import parse_json_field

RATIO = 1.5


def step_time(ph) -> int:
    return ph.gpu_span_ns if ph.gpu_span_ns is not None else ph.wall_ns


def _members(a) -> dict[str, list]:
    fams = {f.family for f in a.phases.families}
    out: dict[str, list] = {}
    for ph in a.phases.phases:
        if ph.family in fams:
            out.setdefault(ph.family, []).append(ph)
    for ms in out.values():
        ms.sort(key=lambda p: (p.step if p.step is not None else -1, p.start_ns))
    return out


def _kv_layout(name: str) -> int | None:
    """Index of the key's sequence dimension (from the end when negative) for attention ops."""
    if name in ("aten::_flash_attention_forward", "aten::_efficient_attention_forward") or "flash_attn" in name:
        return 1
    if "scaled_dot_product" in name:
        return -2
    return None


def kv_lengths(trace, phases) -> list[int | None]:
    """KV length per phase (see the module docstring); None where no attention op with a key
    shape ran inside the phase's CPU range."""
    o = trace.ops
    if len(o) == 0:
        return [None] * len(phases)
    codes = np.unique(o["name"])
    layout = {int(c): _kv_layout(trace.name(int(c))) for c in codes}
    att = [c for c, lay in layout.items() if lay is not None]
    if not att:
        return [None] * len(phases)
    rows = np.flatnonzero(np.isin(o["name"], att))
    cache: dict = {}
    kv = np.full(rows.size, -1, dtype=np.int64)
    for j, r in enumerate(rows.tolist()):
        raw = o["input_dims"][r]
        key = (layout[int(o["name"][r])], bytes(raw) if isinstance(raw, (bytes, bytearray)) else str(raw))
        if key not in cache:
            dims = parse_json_field(raw) if raw is not None else None
            k = dims[1] if isinstance(dims, list) and len(dims) > 1 else None
            ok = isinstance(k, list) and len(k) >= 3 and all(isinstance(x, int) for x in k)
            cache[key] = int(k[key[0]]) if ok else -1
        kv[j] = cache[key]
    known = kv >= 0
    starts, kv = o["start_ns"][rows][known], kv[known]
    order = np.argsort(starts, kind="stable")
    starts, kv = starts[order], kv[order]
    out: list[int | None] = []
    for ph in phases:  # a binary search per phase: linear in the ops however many steps there are
        lo, hi = np.searchsorted(starts, (ph.start_ns, ph.end_ns), "left")
        out.append(int(kv[lo:hi].max()) if hi > lo else None)
    return out


def rule_first_step(f: RunFacts) -> list[Finding]:
    a = f.analysis
    out = []
    for fam, ms in _members(a).items():
        if len(ms) < 3:
            continue
        first, rest = ms[0], ms[1:]
        t0 = step_time(first)
        med = float(np.median([step_time(p) for p in rest]))
        if med <= 0 or t0 <= 0:
            continue
        ratio = t0 / med
        ev = [Evidence("first step", first.name, "text"),
              Evidence("first step time", t0, "ns"),
              Evidence("median of the other steps", med, "ns"),
              Evidence("other steps", len(rest), "count")]
        if ratio >= RATIO:
            ev += [Evidence("first / median of the rest", ratio, "x"),
                   Evidence("extra time in the first step", t0 - med, "ns")]
            out.append(Finding(
                "first_step", "medium",
                f"First {fam} step ({first.name}) is {ratio:.1f}x the median of the rest",
                tuple(ev),
                f"{first.name} pays a one-off cost of {fmt_ns(t0 - med)} (warm-up: JIT compilation, "
                "kernel autotuning, allocator growth, cold caches) that skews totals and means "
                "over the capture.",
                "Warm up before measuring (a torch.profiler schedule with wait/warmup steps, or a "
                "few untimed iterations) and leave this step out of steady-state numbers."))
        elif ratio <= 1 / RATIO:
            kvs = kv_lengths(a.trace, ms)
            ev += [Evidence("median of the rest / first", 1 / ratio, "x"),
                   Evidence("extra time per later step", med - t0, "ns")]
            why = "each later step"
            if all(k is not None for k in kvs) and len(set(kvs)) == len(kvs):
                ev += [Evidence("first step KV length", kvs[0], "count"),
                       Evidence("last step KV length", kvs[-1], "count")]
                why = (f"every step has a new KV length ({kvs[0]}..{kvs[-1]}), so each later step "
                       f"runs a new input shape and")
            out.append(Finding(
                "first_step", "medium",
                f"Surprise: the first {fam} step ({first.name}) is {1 / ratio:.1f}x faster than "
                f"the median of the rest",
                tuple(ev),
                f"The later steps pay about {fmt_ns(med - t0)} each that {first.name} did not: {why} "
                "pays a per-shape cost (a plan, autotuning or compilation) the warm-up already "
                "paid for the first step's shapes.",
                "Make later steps reuse what the first one had: pad or bucket the growing "
                "dimension to a few sizes, pick a backend without per-shape planning, or warm up "
                "with the shapes the run will see (the cpu_stall finding names the op when one "
                "host op holds the GPU)."))
    return out


def rule_step_outlier(f: RunFacts) -> list[Finding]:
    a = f.analysis
    firsts = {ms[0].name for ms in _members(a).values() if len(ms) >= 3}
    out = []
    for o in a.phases.outliers:
        if o.name in firsts:
            continue  # rule_first_step tells it with its cause
        out.append(Finding(
            "step_outlier", "medium",
            f"{o.name} took {o.ratio:.1f}x its family median ({fmt_ns(o.time_ns)})",
            (Evidence("step time", o.time_ns, "ns"),
             Evidence("family median", o.family_median_ns, "ns"),
             Evidence("ratio", o.ratio, "x")),
            "A one-off slow step (a sync, a recompilation, allocator growth, another process on "
            "the GPU) skews means and totals computed over the capture.",
            "Look at this step's kernel sequence and gaps in the Execution Story and exclude it "
            "from steady-state numbers."))
    return out


def rule_step_trend(facts: RunFacts) -> list[Finding]:
    a, w, use = facts.analysis, facts.workload, facts.in_use
    out = []
    members = _members(a)
    for f in a.phases.families:
        steps = members.get(f.family, [])
        if len(steps) < 3:
            continue
        t = np.array([step_time(p) for p in steps], dtype=np.float64)
        busy = np.array([p.gpu_busy_ns for p in steps], dtype=np.float64)
        kvs = kv_lengths(a.trace, steps)
        by_kv = all(k is not None for k in kvs) and len(set(kvs)) > 1
        x = np.array(kvs if by_kv else [p.step if p.step is not None else i for i, p in enumerate(steps)],
                     dtype=np.float64)
        fit, bfit = linear_fit(x, t), linear_fit(x, busy)
        slope, intercept, r2 = fit if fit else (0.0, float(t.mean()), None)
        mean_t, mean_busy = float(t.mean()), float(busy.mean())
        change = abs(slope) * float(np.ptp(x))
        grows = r2 is not None and r2 >= 0.5 and change >= 0.1 * mean_t
        per = "KV token" if by_kv else "step"
        ev = [Evidence("steps", len(steps), "count"),
              Evidence("mean step time", mean_t, "ns"),
              Evidence("min step time", int(t.min()), "ns"),
              Evidence("max step time", int(t.max()), "ns")]
        if by_kv:
            ev += [Evidence("first step KV length", kvs[0], "count"),
                   Evidence("last step KV length", kvs[-1], "count"),
                   Evidence("step time added per KV token", slope, "ns")]
            if grows:  # the intercept of a fit that explains little is noise
                ev.append(Evidence("fitted step time at KV length 0", intercept, "ns"))
        else:
            ev.append(Evidence("slope per step", slope, "ns_per_step"))
        ev += [Evidence("r2 of the linear fit", r2, "ratio"),
               Evidence("mean GPU busy per step", mean_busy, "ns")]
        busy_share = mean_busy / mean_t if mean_t > 0 else None
        if busy_share is not None:
            ev.append(Evidence("GPU busy share of step time", busy_share, "fraction"))
        busy_grows = False
        if bfit is not None:
            ev += [Evidence(f"GPU busy added per {per}", bfit[0], "ns"),
                   Evidence("r2 of the GPU busy fit", bfit[2], "ratio")]
            # a trend claim needs more than a handful of points
            busy_grows = len(steps) >= 5 and bfit[2] is not None and bfit[2] >= 0.5 and bfit[0] > 0
        what = f"{f.family} step time (ITL)" if by_kv else f"{f.family} step time"
        if grows and slope < 0:
            # the KV length only grows, so it cannot explain a falling step time
            title = f"{what} shrinks by {fmt_ns(abs(slope))} per {per} (r2 {r2:.2f})"
            imp = ("Step time falls from step to step: the early steps carry work or waits the later ones do not "
                   "(warm-up, a profiler's start, a queue that drains, waiting on another GPU); a growing KV "
                   "cache cannot explain a falling step time.")
            rec = ("Compare the first and the last steps' kernel sequences in the Execution Story to find what the "
                   "early steps add.")
            sev = "low"
        elif grows:
            title = f"{what} grows by {fmt_ns(abs(slope))} per {per} (r2 {r2:.2f})"
            if by_kv:
                imp = ("Step time follows the KV-cache length: attention reads the whole cache every step, so "
                       "per-token latency rises with context.")
            elif w.decodes:
                imp = "Step time follows the step number: in decode, work that scales with the KV length."
            else:
                imp = ("Step time follows the step number: something grows from step to step (more work per "
                       "step, allocator growth, a host-side structure that grows).")
            if w.decodes and (by_kv or not use.split_kv):
                rec = ("Expect per-token latency to keep rising with context" + (
                    f"; the decode kernel already splits the KV length ({use.split_kv}): look at what else grows"
                    if use.split_kv else
                    "; a decode kernel that splits the KV length across blocks (split-KV / flash-decoding) keeps it "
                    "flatter" + ("" if use.paged_kv else ", and a paged KV cache avoids copying it as it grows")) + ".")
            else:
                rec = ("Compare the first and the last steps' kernel sequences in the Execution Story to find the "
                       "work that grows.")
            sev = "medium"
        else:
            spread = float(t.max() / t.min()) if t.min() > 0 else None
            title = (f"{f.family}: {len(steps)} steps, {fmt_ns(t.min())}-{fmt_ns(t.max())} per step, "
                     f"no linear trend" + (" with KV length" if by_kv else "")
                     + (f" (r2 {r2:.2f})" if r2 is not None else ""))
            imp = "Step time does not follow the " + ("KV length" if by_kv else "step number")
            if spread is not None and spread >= 2:
                imp += f"; it varies {spread:.1f}x between the fastest and the slowest step"
            imp += "."
            rec = "Compare the fastest and slowest steps' kernel sequences in the Execution Story."
            sev = "low"
            if spread is not None:
                ev.append(Evidence("slowest / fastest step", spread, "x"))
        if busy_grows and not grows:
            imp += (f" GPU busy time does grow, {fmt_ns(bfit[0])} per {per} (r2 {bfit[2]:.2f}): the "
                    + ("device work scales with the cache" if by_kv else "device work grows step by step")
                    + ", but other time hides it.")
        if busy_share is not None and busy_share < 0.2:
            imp += (f" The GPU is busy only {fmt_pct(busy_share)} of each step: step time is host "
                    f"time, not kernel time.")
            sev = "medium" if sev == "low" else sev
        out.append(Finding("step_trend", sev, title, tuple(ev), imp, rec))
    return out
