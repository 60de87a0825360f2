"""GPU Telemetry: clocks, power, energy and throttle reasons over the traced window, the clock
drop finding, joules per token of a serving run, and a clocks/power timeline (ASCII, with the
traced window marked). Shown only when the inputs hold a telemetry file (the registry marks the
section optional; the Limitations list says when a capture ran with the sampler off)."""

from __future__ import annotations

import numpy as np

from ...units import fmt_ns, fmt_si, sig
from ..ascii import time_axis
from ..md import md_table
from . import Context

WIDTH = 80  # chart columns
HEIGHT = 5  # chart rows per metric
MAX_CHARTS = 4  # GPUs charted (the busiest first)


def _v(x, unit: str = "", digits: int = 3) -> str:
    return "n/a" if x is None else f"{sig(x, digits)}{(' ' + unit) if unit else ''}"


def _three(s, unit: str) -> str:
    if s.median is None:
        return "n/a (not reported)"
    return f"{sig(s.min, 4)} / {sig(s.median, 4)} / {sig(s.max, 4)} {unit}"


def _binned(t: np.ndarray, v: np.ndarray, t0: int, t1: int, n: int) -> np.ndarray:
    """Column values: the sample held at each column's centre (sample and hold), NaN before
    the first sample."""
    centres = t0 + (np.arange(n) + 0.5) * (t1 - t0) / n
    idx = np.searchsorted(t, centres, side="right") - 1
    out = np.where(idx >= 0, v[np.clip(idx, 0, None)], np.nan)
    return out


def _chart(title: str, unit: str, vals: np.ndarray, indent: int = 9) -> list[str]:
    ok = vals[np.isfinite(vals)]
    if ok.size == 0:
        return [f"{title}: not reported"]
    lo, hi = float(ok.min()), float(ok.max())
    if hi - lo < 1e-9:
        lo = hi - 1.0
    levels = np.where(np.isfinite(vals), np.ceil((vals - lo) / (hi - lo) * (HEIGHT - 1)) + 1, 0)
    rows = [f"{title} ({unit})"]
    for r in range(HEIGHT, 0, -1):
        label = sig(hi, 4) if r == HEIGHT else sig(lo, 4) if r == 1 else ""
        rows.append(f"{label:>{indent - 2}} |" + "".join("#" if lv >= r else " " for lv in levels).rstrip())
    return rows


def _timeline(res, g: int) -> list[str]:
    log = res.log
    t = log.t_unix_ns
    if t.size < 2:
        return []
    t0, t1 = int(t[0]), int(t[-1])
    if res.window_unix_ns:
        t0, t1 = min(t0, res.window_unix_ns[0]), max(t1, res.window_unix_ns[1])
    out = _chart(
        f"GPU {log.devices[g].get('index', g)} SM clock", "MHz", _binned(t, log.readings["sm_mhz"][g], t0, t1, WIDTH)
    )
    out += _chart(
        f"GPU {log.devices[g].get('index', g)} power", "W", _binned(t, log.readings["power_w"][g], t0, t1, WIDTH)
    )
    if res.window_unix_ns:
        w0, w1 = res.window_unix_ns
        cols = (np.arange(WIDTH) + 0.5) * (t1 - t0) / WIDTH + t0
        inside = (cols >= w0) & (cols <= w1)
        marks = ["=" if x else " " for x in inside]
        if inside.any():
            first, last = int(np.argmax(inside)), WIDTH - 1 - int(np.argmax(inside[::-1]))
            marks[first], marks[last] = "[", "]"
        else:  # narrower than one column: mark the column that holds it
            col = min(WIDTH - 1, max(0, int((w0 - t0) / max(t1 - t0, 1) * WIDTH)))
            marks[col] = "|"
        out.append(f"{'window':>7} |" + "".join(marks).rstrip())
    out += time_axis(0, t1 - t0, WIDTH, 9)
    return out


def _tokens(tok) -> list[str]:
    out = [
        (
            "**Energy per token** (serving, from the scheduler event log's iterations): "
            f"decode {_v(tok.decode_j_per_token, 'J/token')} over {tok.decode_only_iterations} decode-only "
            f"iterations ({tok.decode_tokens} tokens); prefill {_v(tok.prefill_j_per_token, 'J/token')} over "
            f"{tok.prefill_iterations} iterations with prefill ({tok.prefill_tokens} prompt tokens); "
            f"all-in {_v(tok.all_in_j_per_token, 'J/token')} (idle between iterations included). "
            f"Energy of {', '.join('GPU ' + str(g) for g in tok.gpus)}, from the {tok.energy_method}."
            + (
                f" {tok.outside_iterations} iterations outside the telemetry were left out."
                if tok.outside_iterations
                else ""
            )
        ),
        "",
        (
            "Model: an iteration's energy is the GPUs' energy between its start and end (interpolated between "
            "samples). Decode J/token = energy of decode-only iterations / their tokens; prefill J/token = "
            "(energy of iterations with prefill - their decode tokens x decode J/token) / their prompt tokens."
        ),
        "",
    ]
    return out


def render(c: Context) -> list[str] | None:
    res = getattr(c.results, "telemetry", None)
    if res is None:
        return None
    out = [
        f"GPU telemetry from `{res.path.rsplit('/', 1)[-1]}`: {res.n_samples} samples at "
        f"{_v(res.rate_hz, 'Hz')} over {fmt_ns(res.span_ns)}; statistics over {res.window_source}"
        + (f", {fmt_ns(res.window_ns)}." if res.window_ns is not None else "."),
        "",
    ]
    if not res.overlaps:
        out += ["n/a: the telemetry does not cover the traced window (it was recorded at another time).", ""]
    if res.gpus:
        rows = [
            [
                f"{g.index}" + (f" {g.name}" if g.name else ""),
                g.samples,
                _three(g.sm_mhz, "MHz"),
                _three(g.mem_mhz, "MHz"),
                _three(g.power_w, "W"),
                "n/a (no counter or power)" if g.energy_j is None else f"{fmt_si(g.energy_j, 'J')} ({g.energy_method})",
                _v(g.temp_c.max, "C"),
                _v(g.util_gpu_median, "%"),
            ]
            for g in res.gpus
        ]
        out += [
            *md_table(
                [
                    "GPU",
                    "samples",
                    "SM clock min/median/max",
                    "memory clock min/median/max",
                    "power min/median/max",
                    "energy in window",
                    "max temp",
                    "median util",
                ],
                rows,
            ),
            "",
        ]
        reasons = [
            [g.index, r.description, "slowdown" if r.slowdown else "setting/idle", fmt_ns(r.duration_ns), r.samples]
            for g in res.gpus
            for r in g.reasons
        ]
        if reasons:
            out += [
                "Clock event (throttle) reasons set in the window (time held, sample and hold):",
                "",
                *md_table(["GPU", "reason", "kind", "time in window", "samples"], reasons),
                "",
            ]
        else:
            out += ["No clock event (throttle) reason was set in the window.", ""]
    for f in res.findings:
        out += [f"- **{f.severity}**: {f.title}. {f.implication} {f.recommendation}"]
    if res.findings:
        out.append("")
    elif res.gpus:
        out += [
            f"No clock drop: no busy time below {res.clock_drop_fraction:.0%} of the run's highest SM clock "
            "and no power or thermal slowdown reason in the window.",
            "",
        ]
    if res.tokens is not None:
        out += _tokens(res.tokens)
    busiest = sorted(range(len(res.gpus)), key=lambda i: -(res.gpus[i].util_gpu_median or 0))[:MAX_CHARTS]
    charts = [line for g in sorted(busiest) for line in _timeline(res, g) + [""]]
    plot = next((p for p in c.plots if p.name.endswith("telemetry.png")), None)
    if charts:  # the fence names its PNG twin: the HTML page shows the PNG only
        twin = f" png={plot.name}" if plot is not None else ""
        out += ["Timeline (whole telemetry; `[===]` marks the window):", "", f"```text{twin}", *charts[:-1], "```", ""]
    if plot is not None:
        out += [f"![GPU telemetry]({plot.name})", ""]
    for w in res.warnings:
        out.append(f"- note: {w}")
    return out + ([""] if res.warnings else [])
