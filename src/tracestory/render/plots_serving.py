"""PNG figures of a serving run, from its scheduler log (matplotlib, imported lazily).

Three figures, x = seconds since the first iteration started (each iteration at its end):

* ``<stem>_serving_batch.png``: sequences in each iteration's batch (the sequence limit dashed)
  and tokens per iteration, prefill and decode stacked (the token budget dashed); a limit more
  than 3x above the data is named in the title instead of drawn;
* ``<stem>_serving_kv.png``: KV cache blocks in use after each iteration (the pool size named in
  the title, drawn only when it is within 3x of the peak, so the axis fits the data);
* ``<stem>_serving_latency.png``: iteration wall time per iteration (log scale; engine stalls
  and the iterations charged with a profiler hold marked) and each request's TTFT and end-to-end
  latency at its arrival time.

Legends sit outside the axes, right of them. :func:`write_serving_plots` returns the paths written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analysis.batching import BatchingResult
from .mpl import pyplot as _pyplot
from .mpl import save as _save

KIND_COLORS = {"prefill-only": "tab:red", "mixed": "tab:orange", "decode-only": "tab:blue", "empty": "0.6"}


def _legend(ax) -> None:
    if not ax.get_legend_handles_labels()[0]:
        return
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _x(r: BatchingResult, t_ns) -> np.ndarray:
    return (np.asarray(t_ns, dtype=np.float64) - r.log.iterations[0].t_start_ns) / 1e9


def plot_batch(r: BatchingResult, path: Path) -> Path | None:
    its = r.log.iterations
    if len(its) < 2:
        return None
    plt = _pyplot()
    x = _x(r, [i.t_end_ns for i in its])
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    seqs = [len(i.members) for i in its]
    ax.step(x, seqs, where="pre", lw=0.8, color="tab:blue", label="sequences in the batch")
    m = r.log.meta
    limits = []
    if m.max_num_seqs and m.max_num_seqs <= 3 * max(max(seqs), 1):
        ax.axhline(m.max_num_seqs, color="0.3", ls="--", lw=0.8, label=f"--max-num-seqs {m.max_num_seqs}")
    elif m.max_num_seqs:  # far above the data: named, not drawn, so the axis fits the points
        limits.append(f"--max-num-seqs {m.max_num_seqs}")
    ax.set_ylabel("sequences")
    ax.set_ylim(0, None)
    _legend(ax)
    pre = np.array([i.prefill_tokens for i in its], dtype=np.float64)
    dec = np.array([i.decode_seqs for i in its], dtype=np.float64)
    bx.step(x, pre + dec, where="pre", lw=0.8, color="tab:orange", label="prefill + decode tokens")
    bx.step(x, dec, where="pre", lw=0.8, color="tab:blue", label="decode tokens")
    if m.max_batch_tokens and m.max_batch_tokens <= 3 * max(float((pre + dec).max()), 1.0):
        bx.axhline(m.max_batch_tokens, color="0.3", ls="--", lw=0.8, label=f"token budget {m.max_batch_tokens}")
    elif m.max_batch_tokens:
        limits.append(f"token budget {m.max_batch_tokens}")
    bx.set_ylabel("tokens per iteration")
    bx.set_ylim(0, None)
    bx.set_xlabel("time since the first iteration (s)")
    _legend(bx)
    off = f"; off the scale: {', '.join(limits)}" if limits else ""
    ax.set_title(f"Batch per scheduler iteration ({len(its)} iterations{off})", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def plot_kv(r: BatchingResult, path: Path) -> Path | None:
    pts = [(i.t_end_ns, i.kv_in_use) for i in r.log.iterations if i.kv_in_use is not None]
    if len(pts) < 2:
        return None
    plt = _pyplot()
    t, v = (np.array(c) for c in zip(*pts, strict=True))
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.step(_x(r, t), v, where="pre", lw=0.8, color="tab:purple", label="KV blocks in use")
    total = r.kv_total
    if total and total <= 3 * max(int(v.max()), 1):
        ax.axhline(total, color="0.3", ls="--", lw=0.8, label=f"KV pool {total} blocks")
    ax.set_ylim(0, None)
    ax.set_ylabel("KV blocks")
    ax.set_xlabel("time since the first iteration (s)")
    pool = f" of {total}" if total else ""
    ax.set_title(f"KV cache blocks in use (peak {int(v.max())}{pool})", fontsize=10)
    _legend(ax)
    fig.tight_layout()
    return _save(fig, path)


def plot_latency(r: BatchingResult, path: Path) -> Path | None:
    its = r.log.iterations
    if len(its) < 2:
        return None
    plt = _pyplot()
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(10, 5.5))
    x = _x(r, [i.t_end_ns for i in its])
    ms = np.array([i.duration_ns for i in its]) / 1e6
    kinds = np.array([i.kind for i in its])
    for kind, color in KIND_COLORS.items():
        on = kinds == kind
        if on.any():
            ax.scatter(x[on], ms[on], s=4, color=color, label=kind, linewidths=0)
    row = {it.iter: k for k, it in enumerate(its)}
    stalls = [row[s.iter] for s in r.stalls if s.iter in row]
    if stalls:
        ax.scatter(x[stalls], ms[stalls], s=60, facecolors="none", edgecolors="black", label="engine stall")
    held = sorted({row[h.charged_iter] for h in (r.story.profiler if r.story else ()) if h.charged_iter in row})
    if held:
        ax.scatter(
            x[held], ms[held], s=60, marker="s", facecolors="none", edgecolors="tab:green", label="profiler start/stop"
        )
    ax.set_yscale("log")
    ax.set_ylabel("iteration time (ms)")
    ax.set_xlabel("time since the first iteration (s)")
    _legend(ax)
    req = [q for q in r.requests if q.arrival_ns is not None]
    if req:
        xa = _x(r, [q.arrival_ns for q in req])
        for attr, color, lab in (("ttft_ns", "tab:red", "TTFT"), ("e2e_ns", "tab:blue", "end to end")):
            ok = np.array([getattr(q, attr) is not None for q in req])
            if ok.any():
                vals = np.array([getattr(q, attr) or 0 for q in req], dtype=np.float64)[ok] / 1e6
                bx.scatter(xa[ok], vals, s=8, color=color, label=lab, linewidths=0)
        bx.set_yscale("log")
        bx.set_ylabel("latency (ms)")
        bx.set_xlabel("arrival time since the first iteration (s)")
        _legend(bx)
    else:
        bx.set_visible(False)
    ax.set_title("Iteration time and request latency (server side, from the scheduler log)", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def write_serving_plots(r: BatchingResult, out_dir: Path, *, stem: str = "report") -> list[Path]:
    """The serving figures of ``r`` (see the module docstring); the paths written."""
    if not r.log.iterations:
        return []
    out = []
    for fn, name in ((plot_batch, "batch"), (plot_kv, "kv"), (plot_latency, "latency")):
        p = fn(r, Path(out_dir) / f"{stem}_serving_{name}.png")
        if p is not None:
            out.append(p)
    return out
