"""Build a large Kineto trace by replicating a real one: the input of the ingest benchmark.

Model
-----
The source trace (a real torch.profiler capture) is parsed once. Copy ``k`` (k = 0, 1, ...) of
its events is the source shifted in time and in id space so that every copy is a distinct,
valid, time-ordered part of ONE longer trace:

* ``ts`` + ``offset_us[k]``, where ``offset_us[k] = sum_{j<k} (span_us + gap_us[j])``, ``span_us``
  is the source's time span (first ``ts`` to last ``ts + dur``, rounded up to whole microseconds)
  and ``gap_us[j]`` is a small deterministic jitter (20..200 us from ``random.Random(seed)``),
  so copy k starts after copy k-1 ends and the copies do not tile exactly;
* every id -- ``args.correlation``, ``args["External id"]``, ``args["Record function id"]``,
  ``args["Ev Idx"]``, ``args["Sequence number"]`` and the flow ``id`` -- + ``k * (max_id + 1)``
  with ONE ``max_id`` over all of those fields, so equalities between them (a flow id equals
  the correlation it links) survive and no id of copy k collides with one of copy j;
* ``ProfilerStep#N`` is renumbered ``N + k * n_steps`` so iterations stay distinct.

Events that describe the whole capture are written once: metadata (``ph`` "M"), the
``PyTorch Profiler`` span (``cat`` "Trace", its ``dur`` stretched over all copies) and the
``Iteration Start`` instant go with copy 0; ``Record Window End`` goes with the last copy.
``dur`` is never changed, so sums of durations scale exactly with the copy count.

The top-level keys of the source (``deviceProperties``, ``distributedInfo``, ...) are kept in
their order. Output is streamed: the header, then each copy's events serialized with orjson in
Kineto's layout (``  {\\n    "ph": ...\\n  }`` separated by ``,\\n``), then the trailer, written at
the same time to ``NAME.json`` and gzip'ed to ``NAME.json.gz``. At most one copy (about 10 MB of
text and its dicts) is held in memory.

Limits
------
Timestamps are float microseconds as in Kineto; adding an integer offset to an epoch-scale
``ts`` (~4.5e12 us) rounds to the float64 grid there (about 1 ns), as the source already does.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import re
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO / "tests" / "data" / "public" / "kineto_a100_nccl_allreduce_rank0of2.json.gz"

ID_ARGS = ("correlation", "External id", "Record function id", "Ev Idx", "Sequence number")
_STEP = re.compile(r"ProfilerStep#(\d+)$")


def _load(source: Path) -> dict:
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rb") as f:
        return orjson.loads(f.read())


def _plan(events: list[dict]) -> dict:
    """Everything a copy needs, computed once from the source events."""
    timed = [e for e in events if e.get("ph") != "M" and "ts" in e]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + e.get("dur", 0) for e in timed)
    max_id = 0
    for e in events:
        if "id" in e and isinstance(e["id"], int):
            max_id = max(max_id, e["id"])
        args = e.get("args")
        if args:
            for k in ID_ARGS:
                v = args.get(k)
                if isinstance(v, int):
                    max_id = max(max_id, v)
    steps = [int(m.group(1)) for e in events if (m := _STEP.match(e.get("name", "")))]
    n_steps = (max(steps) - min(steps) + 1) if steps else 0
    return {"t0": t0, "span_us": math.ceil(t1 - t0), "id_stride": max_id + 1, "n_steps": n_steps}


def _role(e: dict) -> str:
    """'first': written with copy 0 only; 'last': with the last copy only; 'each': every copy."""
    if e.get("ph") == "M" or e.get("cat") == "Trace" or e.get("name", "").startswith("Iteration Start"):
        return "first"
    if e.get("name") == "Record Window End":
        return "last"
    return "each"


def _shift(e: dict, ts_off: int, id_off: int, step_off: int) -> dict:
    out = dict(e)
    if "ts" in out and out.get("ph") != "M":
        out["ts"] = out["ts"] + ts_off
    if id_off:
        if isinstance(out.get("id"), int):
            out["id"] = out["id"] + id_off
        args = out.get("args")
        if args and any(k in args for k in ID_ARGS):
            args = dict(args)
            for k in ID_ARGS:
                if isinstance(args.get(k), int):
                    args[k] = args[k] + id_off
            out["args"] = args
    if step_off and "name" in out and (m := _STEP.match(out["name"])):
        out["name"] = f"ProfilerStep#{int(m.group(1)) + step_off}"
    return out


def _copy_bytes(events: list[dict], k: int, n_copies: int, ts_off: int, plan: dict, total_span_us: int,
                one_line: bool = False) -> tuple[bytes, list[dict]]:
    picked = []
    for e in events:
        role = _role(e)
        if (role == "first" and k != 0) or (role == "last" and k != n_copies - 1):
            continue
        if role == "first" and e.get("cat") == "Trace":
            e = {**e, "dur": float(total_span_us)}
        picked.append(_shift(e, ts_off, k * plan["id_stride"], k * plan["n_steps"]))
    if one_line:   # what json.dump writes: no newline anywhere
        return orjson.dumps(picked)[1:-1], picked
    # orjson's 2-space indent of a list is Kineto's layout: "[\n  {\n    ...\n  },\n  {...}\n]".
    text = orjson.dumps(picked, option=orjson.OPT_INDENT_2)
    return text[2:-2], picked


def _header_trailer(doc: dict, one_line: bool = False) -> tuple[bytes, bytes]:
    keys = list(doc)
    i = keys.index("traceEvents")
    if one_line:
        head = b"{" + b"".join(orjson.dumps(k) + b":" + orjson.dumps(doc[k]) + b"," for k in keys[:i]) + b'"traceEvents":['
        tail = b"]" + b"".join(b"," + orjson.dumps(k) + b":" + orjson.dumps(doc[k]) for k in keys[i + 1:]) + b"}"
        return head, tail

    def entries(ks):
        return [b'  "' + k.encode() + b'": ' + orjson.dumps(doc[k]) for k in ks]

    head = b"{\n" + b"".join(x + b",\n" for x in entries(keys[:i])) + b'  "traceEvents": [\n'
    tail_entries = entries(keys[i + 1:])
    tail = b"\n  ]" + b"".join(b",\n" + x for x in tail_entries) + b"\n}\n"
    return head, tail


def build(out_stem: Path, target_bytes: int, source: Path = DEFAULT_SOURCE, seed: int = 0,
          compresslevel: int = 6, one_line: bool = False) -> dict:
    """Write ``out_stem.json`` and ``out_stem.json.gz`` of at least ``target_bytes`` (uncompressed).

    Returns a dict of facts about what was written, for the benchmark's record and cross-checks:
    copies, event counts per category, kernel/memop duration sums (ns, from ``rint(dur * 1000)``
    of the source events times the copy count), sizes, build time. ``one_line``: the whole document
    on one line, as ``json.dump`` writes it (the same events, fewer bytes), instead of Kineto's
    indented layout.
    """
    t_start = time.monotonic()
    doc = _load(source)
    events = doc["traceEvents"]
    plan = _plan(events)
    head, tail = _header_trailer(doc, one_line)

    # Size a middle copy (no once-only events) to decide the copy count up front: the last copy
    # must be known before it is written (it carries "Record Window End").
    probe, _ = _copy_bytes(events, 1, 3, plan["span_us"], plan, 0, one_line)
    n_copies = max(1, math.ceil((target_bytes - len(head) - len(tail)) / (len(probe) + 2)))
    rng = random.Random(seed)
    gaps = [rng.randint(20, 200) for _ in range(n_copies)]
    offsets = [0]
    for k in range(1, n_copies):
        offsets.append(offsets[-1] + plan["span_us"] + gaps[k - 1])
    total_span_us = offsets[-1] + plan["span_us"]

    # Independent facts from the source events themselves (not from tracestory's reader).
    per_copy = {"kernel": [0, 0], "gpu_memcpy": [0, 0], "gpu_memset": [0, 0]}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in per_copy:
            per_copy[e["cat"]][0] += 1
            per_copy[e["cat"]][1] += int(round(e["dur"] * 1000))

    json_path = out_stem.with_suffix(".json")
    gz_path = out_stem.with_suffix(".json.gz")
    tmp_json = json_path.with_suffix(".json.part")
    tmp_gz = gz_path.with_suffix(".gz.part")
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    n_events = 0
    with open(tmp_json, "wb") as fj, open(tmp_gz, "wb") as raw_gz, \
            gzip.GzipFile(filename=json_path.name, mode="wb", fileobj=raw_gz, compresslevel=compresslevel, mtime=0) as fz:
        def write(b: bytes) -> None:
            fj.write(b)
            fz.write(b)

        write(head)
        for k in range(n_copies):
            text, picked = _copy_bytes(events, k, n_copies, offsets[k], plan, total_span_us, one_line)
            n_events += len(picked)
            write(text if k == 0 else (b"," if one_line else b",\n") + text)
            del text, picked
        write(tail)
    tmp_json.replace(json_path)
    tmp_gz.replace(gz_path)

    facts = {
        "source": str(source),
        "source_events": len(events),
        "target_bytes": target_bytes,
        "copies": n_copies,
        "events": n_events,
        "kernels": per_copy["kernel"][0] * n_copies,
        "kernel_time_ns": per_copy["kernel"][1] * n_copies,
        "memcpy": per_copy["gpu_memcpy"][0] * n_copies,
        "memset": per_copy["gpu_memset"][0] * n_copies,
        "memop_time_ns": (per_copy["gpu_memcpy"][1] + per_copy["gpu_memset"][1]) * n_copies,
        "span_us_per_copy": plan["span_us"],
        "id_stride": plan["id_stride"],
        "json_bytes": json_path.stat().st_size,
        "gz_bytes": gz_path.stat().st_size,
        "gzip_level": compresslevel,
        "build_s": round(time.monotonic() - t_start, 1),
        "layout": "one line" if one_line else "Kineto (indented)",
    }
    out_stem.with_suffix(".facts.json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_stem", type=Path, help="output path without suffix (writes .json, .json.gz, .facts.json)")
    p.add_argument("--mb", type=float, default=1024, help="target uncompressed size in MiB (default 1024)")
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    p.add_argument("--gzip-level", type=int, default=6)
    p.add_argument("--one-line", action="store_true", help="the whole document on one line (json.dump's layout)")
    a = p.parse_args(argv)
    facts = build(a.out_stem, int(a.mb * (1 << 20)), a.source, compresslevel=a.gzip_level, one_line=a.one_line)
    print(json.dumps(facts, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
