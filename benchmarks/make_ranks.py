"""Build a folder of N rank traces (default 64) by replicating one real Kineto trace per rank.

Model
-----
The source (default: the real A100 NCCL fixture, rank 0 of a 2-rank DDP job, 40,573 events with
21 NCCL kernels) is parsed once. Rank ``r`` of ``N`` (8 GPUs per node, ``node = r // 8``,
``local = r % 8``) is a full copy of it with:

* ``distributedInfo``: ``rank = r``, ``world_size = N``, one default process group of all ranks
  (``pg_size = N``, ``ranks = [0..N-1]``); the NCCL kernels' ``Group size`` and ``Process Group
  Ranks`` args say the same;
* device: GPU events (``pid`` 0 in the source) move to ``pid = local`` with ``args.device =
  local``; the CPU process id and its main thread id become ``source + r``, as separate
  processes of one job would have;
* clock: every ``ts`` + ``node_skew[node] + rank_skew[r]`` with ``node_skew`` uniform in
  0..500 us (nodes' clocks disagree) and ``rank_skew`` uniform in 0..20 us;
  ``baseTimeNanoseconds`` is kept (it is the same for every rank of a real job too);
* compute stretch: every non-NCCL kernel's ``dur`` x ``f_r`` with ``f_r = 1 + U(0, 2%)``, and
  ``f_r = --slow-factor`` (default 1.08) for ``--slow-rank`` (default 13): that rank computes
  longer, like a straggler. A stretched kernel never runs into the next GPU activity of its
  stream (its end is capped at the next start, and a kernel that already overlaps keeps its
  ``dur``), so nothing else moves.

All randomness comes from ``random.Random(seed * 1_000_003 + r)``: the same seed writes the same
bytes. Files are ``node{node}_gpu{local}.pt.trace.json.gz`` (gzip level 6, mtime 0); the rank is
only in ``distributedInfo``, so readers must take it from there. Top-level values are written
with ``json.dumps`` (``"rank": 5`` with a space: HTA finds the rank with the regex
``"rank":\\s+(\\d+)``), events with orjson in Kineto's 2-space layout.

``<out>.facts.json`` beside the folder (not inside it: HTA would take any ``.json`` in the folder
for a trace) holds, per rank, numbers taken from the written events
themselves (not from tracestory): event, kernel, NCCL-kernel and memory-op counts, kernel and
NCCL-kernel duration sums in ns (``rint(dur * 1000)``, as the reader converts), the clock shift
and the stretch factor.

Limits: NCCL kernels keep the source's durations on every rank, so a slow rank does not shorten
the others' collectives as a real straggler would (the waiting is not modelled); every rank runs
the same program with the same step count.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import random
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO.parent / "shared" / "fixtures" / "public" / "kineto_a100_nccl_allreduce_rank0of2.json.gz"
DEFAULT_OUT = REPO / "benchmarks" / "_data" / "ranks64"
GPUS_PER_NODE = 8
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def facts_path(out_dir: Path) -> Path:
    return out_dir.with_name(out_dir.name + ".facts.json")


def _is_nccl(e: dict) -> bool:
    return e.get("name", "").lower().startswith("nccl")


def _plan(events: list[dict]) -> dict:
    """Which kernels stretch, and how far each may grow before it meets the next GPU activity."""
    gpu_pid = 0
    cpu_pids = {e["pid"] for e in events if e.get("cat") == "cuda_runtime"}
    if len(cpu_pids) != 1:
        raise SystemExit(f"expected one CPU process with cuda_runtime events, found {sorted(cpu_pids)}")
    cpu_pid = cpu_pids.pop()
    lanes: dict = {}
    for i, e in enumerate(events):
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS and e.get("pid") == gpu_pid:
            lanes.setdefault(e.get("tid"), []).append(i)
    room = {}  # event index -> the largest dur that does not reach the next start on its stream (inf at the end)
    for idx in lanes.values():
        idx.sort(key=lambda i: events[i]["ts"])
        for a, b in zip(idx, idx[1:] + [None]):
            e = events[a]
            if e["cat"] != "kernel" or _is_nccl(e):
                continue
            room[a] = float("inf") if b is None else events[b]["ts"] - e["ts"]
    return {"gpu_pid": gpu_pid, "cpu_pid": cpu_pid, "room": room}


def _rank_events(events: list[dict], plan: dict, r: int, world: int, shift_us: float, factor: float) -> list[dict]:
    local = r % GPUS_PER_NODE
    cpu_pid, new_cpu_pid = plan["cpu_pid"], plan["cpu_pid"] + r
    ranks_text = str(list(range(world)))
    room = plan["room"]
    out = []
    for i, e in enumerate(events):
        e = dict(e)
        if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + shift_us
        pid = e.get("pid")
        if pid == cpu_pid:
            e["pid"] = new_cpu_pid
            if e.get("tid") == cpu_pid:
                e["tid"] = new_cpu_pid
        elif pid == plan["gpu_pid"] and e.get("ph") != "M":
            e["pid"] = local
            if isinstance(e.get("args"), dict) and "device" in e["args"]:
                e["args"] = {**e["args"], "device": local}
        if i in room:
            grown = e["dur"] * factor
            if grown <= room[i]:
                e["dur"] = round(grown, 3)
            elif room[i] > e["dur"]:
                e["dur"] = room[i]
        if e.get("cat") == "kernel" and isinstance(e.get("args"), dict) and "Group size" in e["args"]:
            e["args"] = {**e["args"], "Group size": world, "Process Group Ranks": ranks_text}
        out.append(e)
    return out


def _distributed_info(src: dict | None, r: int, world: int) -> dict:
    info = copy.deepcopy(src) if src else {"backend": "nccl"}
    info["rank"] = r
    info["world_size"] = world
    info["pg_count"] = 1
    info["pg_config"] = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                          "pg_size": world, "ranks": list(range(world))}]
    return info


def _write(path: Path, doc: dict, events: list[dict]) -> int:
    order = list(doc)
    i = order.index("traceEvents")
    before, after = order[:i], order[i + 1:]
    head = "{\n" + "".join(f'  "{k}": {json.dumps(doc[k])},\n' for k in before) + '  "traceEvents": [\n'
    tail = "\n  ]" + "".join(f',\n  "{k}": {json.dumps(doc[k])}' for k in after) + "\n}\n"
    # orjson's 2-space indent of a list is Kineto's layout: "[\n  {\n    ...\n  },\n  {...}\n]".
    body = orjson.dumps(events, option=orjson.OPT_INDENT_2)[2:-2]
    data = head.encode() + body + tail.encode()
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename=path.name.removesuffix(".gz"), mode="wb", fileobj=raw,
                                               compresslevel=6, mtime=0) as gz:
        gz.write(data)
    tmp.replace(path)
    return len(data)


def _facts(events: list[dict]) -> dict:
    f = {"events": len(events), "kernels": 0, "nccl_kernels": 0, "memops": 0,
         "kernel_dur_ns": 0, "nccl_kernel_dur_ns": 0}
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat == "kernel":
            d = round(e["dur"] * 1000)
            f["kernels"] += 1
            f["kernel_dur_ns"] += d
            if _is_nccl(e):
                f["nccl_kernels"] += 1
                f["nccl_kernel_dur_ns"] += d
        elif cat in ("gpu_memcpy", "gpu_memset"):
            f["memops"] += 1
    return f


def build(out_dir: Path = DEFAULT_OUT, ranks: int = 64, source: Path = DEFAULT_SOURCE, seed: int = 0,
          slow_rank: int | None = 13, slow_factor: float = 1.08) -> dict:
    """Write ``ranks`` rank traces into ``out_dir`` and ``out_dir.facts.json`` beside it; return the facts."""
    t0 = time.monotonic()
    with gzip.open(source, "rb") as f:
        doc = orjson.loads(f.read())
    events = doc["traceEvents"]
    plan = _plan(events)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.json.gz"):
        old.unlink()
    nodes = (ranks + GPUS_PER_NODE - 1) // GPUS_PER_NODE
    node_rng = random.Random(seed)
    node_skew_us = [node_rng.uniform(0, 500) for _ in range(nodes)]
    per_rank = []
    for r in range(ranks):
        rng = random.Random(seed * 1_000_003 + r)
        shift_us = round(node_skew_us[r // GPUS_PER_NODE] + rng.uniform(0, 20), 3)
        factor = slow_factor if r == slow_rank else 1 + rng.uniform(0, 0.02)
        rank_events = _rank_events(events, plan, r, ranks, shift_us, factor)
        rank_doc = {**doc, "distributedInfo": _distributed_info(doc.get("distributedInfo"), r, ranks)}
        if "distributedInfo" not in doc:  # keep Kineto's key order: distributedInfo before traceEvents
            rank_doc = {k: rank_doc[k] for k in ["distributedInfo", *doc]}
        name = f"node{r // GPUS_PER_NODE}_gpu{r % GPUS_PER_NODE}.pt.trace.json.gz"
        json_bytes = _write(out_dir / name, rank_doc, rank_events)
        per_rank.append({"rank": r, "file": name, "shift_us": shift_us, "compute_factor": round(factor, 6),
                         "json_bytes": json_bytes, "gz_bytes": (out_dir / name).stat().st_size,
                         **_facts(rank_events)})
    facts = {
        "source": str(source), "ranks": ranks, "seed": seed, "slow_rank": slow_rank, "slow_factor": slow_factor,
        "json_bytes": sum(p["json_bytes"] for p in per_rank), "gz_bytes": sum(p["gz_bytes"] for p in per_rank),
        "events": sum(p["events"] for p in per_rank), "kernels": sum(p["kernels"] for p in per_rank),
        "build_s": round(time.monotonic() - t0, 1), "per_rank": per_rank,
    }
    facts_path(out_dir).write_text(json.dumps(facts, indent=1) + "\n")
    return facts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slow-rank", type=int, default=13, help="rank whose compute is stretched by --slow-factor (-1: none)")
    p.add_argument("--slow-factor", type=float, default=1.08)
    a = p.parse_args(argv)
    facts = build(a.out, a.ranks, a.source, a.seed, None if a.slow_rank < 0 else a.slow_rank, a.slow_factor)
    print(json.dumps({k: v for k, v in facts.items() if k != "per_rank"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
