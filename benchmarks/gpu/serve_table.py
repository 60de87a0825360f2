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

* decode-only iterations' p50 per batch size, the cost of an added sequence (least squares over
  them, those over 3x left out), batch 1 against the copy roof (``weight_bytes_per_gpu`` / time /
  the roofs' ``copy_tbps``), and the over-3x iterations grouped in time (``stall_clusters``).
The JSON row goes to ``--json``; stdout has it without ``startup`` and then one summary line.

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
        for name in ("serve.sched.jsonl", "serve.sched.jsonl.gz"):
            if (d / name).is_file():
                return d / name, d / "load.summary.json"
    print(f"{folder}: expected serve.sched.jsonl[.gz] (and load.summary.json), found none", file=sys.stderr)
    sys.exit(2)


def _read_lines(log: Path) -> list[dict]:
    import gzip

    text = gzip.open(log, "rt").read() if log.suffix == ".gz" else log.read_text()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def stall_clusters(starts_s: list[float], gap_s: float = 0.3) -> dict:
    """Stalls (their start times, s) grouped into clusters (a gap over ``gap_s`` starts a new
    one): how many, when each starts and the intervals between cluster starts, so a periodic
    source shows (session 12 read a 1.5 s period in calls 13 and 20 this way)."""
    firsts: list[float] = []
    last = None
    for t in sorted(starts_s):
        if last is None or t - last > gap_s:
            firsts.append(t)
        last = t
    gaps = [round(b - a, 2) for a, b in zip(firsts, firsts[1:])]
    return {"clusters": len(firsts), "starts_s": [round(t, 2) for t in firsts], "intervals_s": gaps,
            "interval_p50_s": round(statistics.median(gaps), 2) if gaps else None}


def weight_bytes_per_gpu(meta: dict, gpus: int) -> float:
    """Bytes of weights one GPU reads per decode step: the layers' weights as stored
    (``layer_weight_bytes``: FP8 projections with their fp32 scales, bf16 norms; bf16 throughout
    without FP8) and the bf16 LM head, split over the ``gpus`` ranks (vocab-parallel head under TP;
    the norms, which every rank holds whole, split too: 16 KB a layer); the embedding is a gather,
    not read whole."""
    from tracestory.models.llama_config import LlamaConfig, layer_weight_bytes

    cfg = LlamaConfig.from_name(meta.get("preset", "llama-3-8b"))
    layers = layer_weight_bytes(cfg, 2, meta.get("fp8", "off") or "off") * meta.get("layers", 32)
    head = meta.get("vocab", 128256) * cfg.dim * 2
    return (layers + head) / gpus


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


def summary_line(row: dict) -> str:
    """The row in one line (the end of a device log shows it)."""
    med, b = row["iteration_p50_ms"], row.get("decode_p50_ms_by_batch", {})
    parts = [f"{row['gpus']} GPU(s)", f"decode p50 {med['decode'] or 0:.2f} ms", f"mixed p50 {med['mixed'] or 0:.1f} ms"]
    if b.get(1):
        parts.append(f"batch-1 decode {b[1]:.3f} ms" + (f" = {100 * row['batch1_of_copy_roof']:.1f}% of the copy roof"
                                                     if row.get("batch1_of_copy_roof") else ""))
    if row.get("per_added_sequence_ms") is not None:
        parts.append(f"+{row['per_added_sequence_ms']:.3f} ms a sequence")
    if row.get("prefill_us_per_token"):
        parts.append(f"prefill {row['prefill_us_per_token']:.1f} us/token"
                     + (f" = {100 * row['prefill_of_gemm_roof']:.1f}% of the GEMM roof" if row.get("prefill_of_gemm_roof") else ""))
    c = row["stall_clusters"]
    parts.append(f"{row['over_3x_median']} over 3x in {c['clusters']} clusters"
                 + (f" (interval p50 {c['interval_p50_s']} s)" if c["interval_p50_s"] else ""))
    return "row: " + ", ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--skip", type=int, default=20)
    ap.add_argument("--roofs")
    ap.add_argument("--json")
    a = ap.parse_args()
    log, summ = _find(a.folder)
    lines = _read_lines(log)
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
    # decode-only iterations per batch size (p50), the cost of an added sequence (least squares
    # over them, those over 3x left out), batch 1 against the copy roof
    dec_its = [(x, v) for x, v, p in zip(kept, t, pf, strict=True) if p == 0]
    by_batch: dict[int, list[float]] = {}
    for x, v in dec_its:
        by_batch.setdefault(len(x.get("members", ())), []).append(v)
    decode_by_batch = {b: round(float(np.median(v)), 3) for b, v in sorted(by_batch.items())}
    fit = [(len(x.get("members", ())), v) for x, v in dec_its if med["decode"] and v <= 3 * med["decode"]]
    per_seq = None
    if len({b for b, _ in fit}) >= 2:
        B = np.array([[1.0, b] for b, _ in fit])
        per_seq = float(np.linalg.lstsq(B, np.array([v for _, v in fit]), rcond=None)[0][1])
    t0 = kept[0]["t_start_ns"] if kept else 0
    stall_starts = [(x["t_start_ns"] - t0) / 1e9 for x, v, p in zip(kept, t, pf, strict=True)
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
           "stall_clusters": stall_clusters(stall_starts),
           "decode_p50_ms_by_batch": decode_by_batch, "per_added_sequence_ms": per_seq,
           "weight_gb_per_gpu": round(weight_bytes_per_gpu(meta, a.gpus) / 1e9, 3),
           "n_decode": int(len(dec)), "n_mixed": int(len(mix)),
           "max_batch_tokens": meta.get("max_batch_tokens"), "startup": meta.get("startup")}
    if b_us:
        row["prefill_tflops_per_gpu"] = flops_tok / (b_us * 1e-6) / a.gpus / 1e12
        if a.roofs:
            r = json.loads(Path(a.roofs).read_text())
            key = "fp8_rowwise_gemm_tflops" if meta.get("fp8", "off") != "off" else "bf16_gemm_tflops"
            if r.get(key):
                row["prefill_of_gemm_roof"] = row["prefill_tflops_per_gpu"] / r[key]
    if a.roofs and decode_by_batch.get(1):
        copy = json.loads(Path(a.roofs).read_text()).get("copy_tbps")
        if copy:
            row["batch1_of_copy_roof"] = weight_bytes_per_gpu(meta, a.gpus) / (decode_by_batch[1] * 1e-3) / (copy * 1e12)
    print(json.dumps({k: v for k, v in row.items() if k != "startup"}, indent=1, default=str))
    print(summary_line(row))
    if a.json:
        Path(a.json).write_text(json.dumps(row, indent=1, default=str))


if __name__ == "__main__":
    main()
