"""One row of docs/BENCHMARKS.md's "Serving under load" table from a serving run's files.

Reads a folder holding ``serve.sched.jsonl`` (the server's event log) and ``load.summary.json``
(``tracestory load --json``), or a capture folder's ``torch/`` (or ``failed-torch/``) holding both:

* TTFT p50/p99, TPOT p50 (per request the mean inter-token gap of ``load.requests.jsonl``, as
  vLLM's TPOT; else the ITL p50), output tok/s,
  refused requests (failed requests by reason; HTTP 429 is the refusal) from the summary;
* from the event log, iterations after the first ``--skip`` (warm-up), less those whose launch a
  profiler's start/stop held (``profiler_ns``) and the one after each: time = ``t_end - t_start``;
  p50 of decode-only iterations and of iterations with prefill tokens (prefill or mixed); the
  longest iteration and how many exceed 3x the median of their kind; where the log has them
  (``gc_ns``, ``gpu_ns``: tracestory serve since the stall attribution), the longest iteration's
  Python GC and GPU time (``longest_cell``, e.g. ``24.1 ms (GPU 3.20 ms, GC 18.0 ms gen 2)``) and
  each over-3x iteration's (``over_3x_detail``; ``over_3x_with_gc``: how many of them had a
  collection, None when the log has no ``gc_ns``);
* prefill cost per token: least squares ``time = a + b * prefill_tokens + c * decode_tokens`` over
  those iterations; ``b`` in us/token, and the dense rate it means, ``2 * layer params * layers /
  b`` over the GPU count (attention FLOPs left out), for the roof comparison.

Usage: python benchmarks/gpu/serve_table.py FOLDER --gpus N [--skip 20] [--roofs roofs.json] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np


def _find(folder: Path) -> tuple[Path, Path]:
    for d in (folder, folder / "torch", folder / "failed-torch"):
        if (d / "serve.sched.jsonl").is_file():
            return d / "serve.sched.jsonl", d / "load.summary.json"
    sys.exit(f"{folder}: expected serve.sched.jsonl (and load.summary.json), found none")


def _cell(x: dict, ms: float, nxt: dict | None = None) -> dict:
    """One iteration's time with what its event-log line and the next one's say of it (none: time
    only): its device time and Python GC time, and the host steps inside its wall time (overlapped
    engine, serve/engine.py): the next iteration's hand-out of the one before, admissions, launch
    (and its plan send, TP) and this one's wait for its tokens, each named when over 1 ms."""
    out = {"iter": x.get("iter"), "ms": round(ms, 2)}
    say = []
    if x.get("gpu_ns") is not None:
        out["gpu_ms"] = round(x["gpu_ns"] / 1e6, 2)
        say.append(f"GPU {out['gpu_ms']:.2f} ms")
    if x.get("gc_ns") is not None:
        out["gc_ms"] = round(x["gc_ns"] / 1e6, 2)
        out["gc_passes"] = x.get("gc_passes")
        gen = x.get("gc_generation")
        say.append(f"GC {out['gc_ms']:.1f} ms" + (f" gen {gen}" if gen is not None else ""))
    steps = [(nxt or {}, "handout_before_ns", "hand-out"), (nxt or {}, "drain_ns", "admissions"),
             (nxt or {}, "launch_ns", "next launch"), (nxt or {}, "plan_send_ns", "its plan send"),
             (nxt or {}, "input_wait_ns", "its input wait"), (nxt or {}, "replay_ns", "its graph replay"),
             (x, "result_wait_ns", "result wait")]
    for line, key, label in steps:
        if line.get(key) is not None:
            own = key in ("launch_ns", "plan_send_ns", "input_wait_ns", "replay_ns")
            name = ("next_" if line is nxt and own else "") + key[:-3] + "_ms"
            out[name] = round(line[key] / 1e6, 2)
            if line[key] > 1e6:
                say.append(f"{label} {line[key] / 1e6:.1f} ms")
    out["cell"] = f"{ms:.1f} ms" + (f" ({', '.join(say)})" if say else "")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--skip", type=int, default=20)
    ap.add_argument("--roofs")
    ap.add_argument("--json")
    a = ap.parse_args()
    log, summ = _find(a.folder)
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    meta = next(x for x in lines if x["type"] == "meta")
    its = [x for x in lines if x["type"] == "iteration"][a.skip:]
    s = json.loads(summ.read_text())["summary"] if summ.is_file() else {}
    t = np.array([(x["t_end_ns"] - x["t_start_ns"]) / 1e6 for x in its])
    pf = np.array([x.get("prefill_tokens", 0) for x in its], dtype=float)
    dc = np.array([x.get("decode_tokens", 0) for x in its], dtype=float)
    prof = np.array([x.get("profiler_ns", 0) > 0 for x in its])
    # the iteration whose launch held the profiler's start/stop, and the one resolved after it
    # (overlapped engine), are the profiler's, not the engine's: left out of medians and stalls
    prof = prof | np.roll(prof, -1)
    kept = [x for x, p in zip(its, prof, strict=True) if not p]
    t_all, t, pf, dc = t, t[~prof], pf[~prof], dc[~prof]
    dec, mix = t[pf == 0], t[pf > 0]
    med = {"decode": float(np.median(dec)) if len(dec) else None, "mixed": float(np.median(mix)) if len(mix) else None}
    over = int(sum((v > 3 * med["decode"]) for v in dec) if len(dec) else 0) + \
        int(sum((v > 3 * med["mixed"]) for v in mix) if len(mix) else 0)
    by_iter = {x.get("iter"): x for x in lines if x["type"] == "iteration"}
    detail = [_cell(x, v, by_iter.get(x.get("iter", -2) + 1)) for x, v, p in zip(kept, t, pf, strict=True)
              if v > 3 * (med["decode"] if p == 0 else med["mixed"])]
    A = np.stack([np.ones_like(t), pf, dc], 1)
    coef = np.linalg.lstsq(A, t, rcond=None)[0] if len(t) >= 3 else [None] * 3
    from tracestory.models.llama_config import LlamaConfig, layer_params

    cfg = LlamaConfig.from_name(meta.get("preset", "llama-3-8b"))
    flops_tok = 2 * layer_params(cfg) * meta.get("layers", 32)
    b_us = coef[1] * 1e3 if coef[1] is not None else None
    ttft = s.get("ttft", {})
    recs = summ.with_name("load.requests.jsonl")
    tpots = []
    if recs.is_file():          # TPOT of a request: the mean of its inter-token gaps (vLLM's)
        for x in recs.read_text().splitlines():
            r = json.loads(x)
            if r.get("ok") and r.get("itl_ns"):
                tpots.append(statistics.fmean(r["itl_ns"]))
    tpot = {"p50_ns": statistics.median(tpots)} if tpots else s.get("itl", {})
    row = {"gpus": a.gpus, "iterations": len(its), "ttft_p50_ms": ttft.get("p50_ns", 0) / 1e6,
           "ttft_p99_ms": ttft.get("p99_ns", 0) / 1e6, "tpot_p50_ms": tpot.get("p50_ns", 0) / 1e6,
           "output_tok_s": s.get("output_tokens_per_s"), "ok": s.get("ok"), "sent": s.get("sent"),
           "failed": s.get("failed"), "failures": s.get("failures"),
           "prefill_us_per_token": b_us, "fit_ms": [float(c) if c is not None else None for c in coef],
           "iteration_p50_ms": med, "longest_ms": float(t.max()) if len(t) else None,
           "profiler_iterations": int(prof.sum()),
           "longest_ms_with_profiler": float(t_all.max()) if len(t_all) else None,
           "longest_cell": _cell(kept[int(np.argmax(t))], float(t.max()),
                                 by_iter.get(kept[int(np.argmax(t))].get("iter", -2) + 1))["cell"] if len(t) else None,
           "over_3x_median": over, "over_3x_detail": detail,
           "over_3x_with_gc": (sum(1 for d in detail if d.get("gc_ms", 0) > 0)
                               if any("gc_ms" in d for d in detail) else None),
           "n_decode": int(len(dec)), "n_mixed": int(len(mix)),
           "max_batch_tokens": meta.get("max_batch_tokens"), "startup": meta.get("startup")}
    if b_us:
        row["prefill_tflops_per_gpu"] = flops_tok / (b_us * 1e-6) / a.gpus / 1e12
        if a.roofs:
            r = json.loads(Path(a.roofs).read_text())
            key = "fp8_rowwise_gemm_tflops" if meta.get("fp8", "off") != "off" else "bf16_gemm_tflops"
            if r.get(key):
                row["prefill_of_gemm_roof"] = row["prefill_tflops_per_gpu"] / r[key]
    print(json.dumps(row, indent=1, default=str))
    if a.json:
        Path(a.json).write_text(json.dumps(row, indent=1, default=str))


if __name__ == "__main__":
    main()
