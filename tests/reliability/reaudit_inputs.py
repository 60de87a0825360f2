"""The re-audit's input cases: every reader's fixture x a damage x the commands that read it.

Damages (each applied to the plain bytes; a gzip fixture is re-compressed after, and also cut
inside its compressed stream): truncation at 8 points, byte flips at 8 fixed random draws
(``random.Random(2500 + k)``, 16 bytes each), an empty file, another format under the same
name, a directory, a FIFO, a file the user may not read (run as uid 65534: root ignores
chmod), huge numbers, missing fields, zero durations, duplicate records. What a format cannot
carry (a FIFO of a folder input, zero durations of a load summary) is left out, not faked.

The judge holds a damaged file that exits 0 without a warning to the undamaged file's numbers or
to a plain reading (python ``json``, ``sqlite3``) of the damaged file; damages that remove or
zero what the numbers are made of (``must_state``) must be refused or stated.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
import sqlite3
from pathlib import Path

from reaudit_run import REPO, Case

DATA = REPO / "tests" / "data"
CUTS = (0.001, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.999)
FLIPS = 8

# reader -> (fixture under tests/data, name in the work folder, commands)
READERS = {
    "kineto-gz": ("graphs/manual_graph_decode.trace.json.gz", "decode.trace.json.gz",
                  ("analyze", "report", "categories", "export", "compare")),
    "kineto-plain": ("graphs/manual_graph_decode.trace.json.gz", "decode_plain.trace.json",
                     ("analyze", "report", "categories", "export", "compare")),
    "kineto-one-line": ("graphs/manual_graph_decode.trace.json.gz", "decode_line.trace.json",
                        ("analyze", "report", "export")),
    "rocprof": ("corpus/kineto_public/rocm-blogs__mi210_rocprof_hip_trace_torch_add.json.gz", "rocprof_hip.json.gz",
                ("analyze", "report", "categories")),
    "nsys-sqlite": ("nsys_graphs/graph_whole.sqlite", "graph_whole.sqlite",
                    ("analyze", "report", "categories", "export", "compare")),
    "nsys-csv": ("nsys/cuda_gpu_trace_2024.csv", "cuda_gpu_trace.csv", ("analyze", "report", "categories")),
    "nsys-kernsum-csv": ("nsys/cuda_gpu_kern_sum.csv", "cuda_gpu_kern_sum.csv", ("analyze", "categories")),
    "ncu-csv": ("ncu/triton_rmsnorm_raw.csv.gz", "rmsnorm_raw.csv", ("analyze", "report")),
    "ncu-rep": ("ncu/triton_rmsnorm.ncu-rep.gz", "rmsnorm.ncu-rep.gz", ("analyze",)),
    "scheduler-log": ("telemetry/capture_throttled/torch/serve.sched.jsonl", "serve.sched.jsonl",
                      ("analyze", "report")),
    "telemetry": ("telemetry/capture_throttled/torch/telemetry.jsonl", "telemetry.jsonl", ("analyze", "report")),
    "load-summary": ("tp_serve_cpu/torch/load.summary.json", "load.summary.json", ("report",)),
}
# a reader whose file is told only beside another: that file (pristine) goes on the same command line
COMPANION = {"telemetry": "telemetry/capture_throttled/torch/rank0.trace.json",
             "load-summary": "tp_serve_cpu/torch/serve.sched.jsonl"}
FOLDERS = {   # reader -> (fixture folder, the member damaged, commands)
    "capture-folder": ("telemetry/capture_throttled", "manifest.json", ("analyze", "report")),
    "ranks": ("multigpu/tp2_even", "torch/rank1.trace.json.gz", ("ranks", "analyze")),
}
KINETO_LIKE = ("kineto-gz", "kineto-plain", "kineto-one-line", "rocprof")


def _plain(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def _flip(data: bytes, k: int) -> bytes:
    rng = random.Random(2500 + k)
    b = bytearray(data)
    for _ in range(16):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


# ---------------------------------------------------------------- structured damage per format
def _json_edit(data: bytes, what: str, reader: str) -> bytes | None:
    doc = json.loads(data)
    if reader in KINETO_LIKE or reader == "ranks":
        evs = doc["traceEvents"] if isinstance(doc, dict) else doc
        kern = [e for e in evs if isinstance(e, dict) and str(e.get("cat", "")).lower() == "kernel"]
        if not kern:
            return None
        if what == "huge":
            kern[0]["dur"] = 1e300
            kern[-1]["ts"] = 2 ** 64
        elif what == "missing":
            for e in kern:
                e.pop("dur", None)
        elif what == "zero":
            for e in kern:
                e["dur"] = 0
        elif what == "dup":
            evs.extend(dict(e) for e in kern)
        return json.dumps(doc, indent=None if reader == "kineto-one-line" else 1).encode()
    if reader == "manifest":
        cap = doc["captures"][0]
        if what == "huge":
            cap["duration_ns"] = 2 ** 70
        elif what == "missing":
            doc.pop("captures")
        elif what == "zero":
            cap["duration_ns"] = 0
        elif what == "dup":
            return data + data
        return json.dumps(doc, indent=1).encode()
    # a load summary: one JSON document
    if what == "huge":
        doc["summary"] = {k: (2 ** 70 if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                          for k, v in doc["summary"].items()}
    elif what == "missing":
        doc.pop("summary", None)
    elif what == "zero":
        doc["summary"] = {k: (0 if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                          for k, v in doc["summary"].items()}
    elif what == "dup":
        return data + data
    return json.dumps(doc, indent=1).encode()


def _jsonl_edit(data: bytes, what: str) -> bytes | None:
    lines = [json.loads(x) for x in data.splitlines() if x.strip()]
    if what == "dup":
        return b"\n".join(json.dumps(x).encode() for x in lines + lines[1:]) + b"\n"
    for x in lines[1:]:
        for k in [k for k in x if k.startswith("t_") or k.endswith("_tokens") or k == "gpus"]:
            if what == "huge":
                x[k] = 2 ** 70 if k != "gpus" else [{**g, "energy_mj": 2 ** 70, "power_w": 1e300} for g in x[k]]
            elif what == "missing":
                x.pop(k)
            elif what == "zero":
                x[k] = 0 if k != "gpus" else [{**g, "power_w": 0, "energy_mj": 0} for g in x[k]]
    return b"\n".join(json.dumps(x).encode() for x in lines) + b"\n"


def _csv_edit(data: bytes, what: str) -> bytes | None:
    lines = data.decode().splitlines()
    hi = next((i for i, ln in enumerate(lines) if "," in ln and ("Name" in ln or "ID" in ln)), None)
    if hi is None:
        return None
    head = lines[hi].split(",")
    names = [h.strip('"') for h in head]
    col = next((names.index(c) for c in ("gpu__time_duration.sum", "Duration (ns)", "Total Time (ns)") if c in names),
               None)
    rows = lines[hi + 1:]
    if what == "dup":
        return "\n".join(lines + rows).encode() + b"\n"
    if col is None:
        return None

    def cells(ln: str) -> list[str]:
        return re.findall(r'"[^"]*"|[^,]+|(?<=,)(?=,)|^(?=,)|(?<=,)$', ln)

    out = lines[:hi + 1]
    if what == "missing":
        out[-1] = ",".join(c for i, c in enumerate(cells(lines[hi])) if i != col)
    for ln in rows:
        cs = cells(ln)
        if len(cs) <= col or not re.fullmatch(r'"?[\d.,]+"?', cs[col] or "x"):
            out.append(ln)
            continue
        if what == "missing":
            cs = [c for i, c in enumerate(cs) if i != col]
        else:
            cs[col] = ('"99999999999999999999999999"' if what == "huge" else '"0"')
        out.append(",".join(cs))
    return "\n".join(out).encode() + b"\n"


def _sqlite_edit(path: Path, what: str) -> bool:
    con = sqlite3.connect(path)
    t = "CUPTI_ACTIVITY_KIND_KERNEL"
    if what == "huge":
        con.execute(f'UPDATE {t} SET "end" = 9223372036854775807 WHERE rowid = (SELECT min(rowid) FROM {t})')
    elif what == "missing":
        con.execute(f'ALTER TABLE {t} DROP COLUMN "end"')
    elif what == "zero":
        con.execute(f'UPDATE {t} SET "end" = start')
    elif what == "dup":
        con.execute(f"INSERT INTO {t} SELECT * FROM {t}")
    con.commit()
    con.close()
    return True


# ---------------------------------------------------------------- second readings
def kineto_reading(data: bytes) -> tuple[int, int] | None:
    """(kernels, summed dur in ns) by python json: events of category kernel with a numeric dur."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    evs = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(evs, list):
        return None
    n = t = 0
    for e in evs:
        if isinstance(e, dict) and str(e.get("cat", "")).lower() == "kernel" and e.get("ph") == "X":
            d = e.get("dur")
            if isinstance(d, (int, float)) and not isinstance(d, bool):
                n, t = n + 1, t + round(d * 1000)
    return n, t


def sqlite_reading(path: Path) -> tuple[int, int] | None:
    """(kernels + graph-launch rows, their summed end - start) by sqlite3 (tracestory keeps one
    opaque row per graph launch of a graph-level export among its kernels)."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        n = t = 0
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"):
            if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
                a, b = con.execute(f'SELECT count(*), sum("end" - start) FROM {table}').fetchone()
                n, t = n + int(a), t + int(b or 0)
        con.close()
        return n, t
    except (sqlite3.Error, OverflowError, TypeError, ValueError):
        return None


def gpu_trace_csv_reading(data: bytes) -> tuple[int, int] | None:
    """(kernels, summed Duration) of an ``nsys stats -r cuda_gpu_trace`` CSV by the csv module:
    rows with a grid size (kernels, not copies) and an integer duration."""
    import csv
    import io
    try:
        lines = data.decode().splitlines()
        start = next(i for i, ln in enumerate(lines) if ln.startswith("Start (ns)"))
        rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
        n = t = 0
        for r in rows:
            if (r.get("GrdX") or "").strip() and (r.get("Duration (ns)") or "").strip().isdigit():
                n, t = n + 1, t + int(r["Duration (ns)"])
        return n, t
    except (StopIteration, UnicodeDecodeError, csv.Error):
        return None


# ---------------------------------------------------------------- the cases
# damage that leaves a file a tool may write as it is: held to the numbers, not to a warning (a raw
# ncu CSV without the duration column is a narrower export; a load summary of zeros is a run that
# sent nothing)
AS_WRITTEN = {("ncu-csv", "missing"), ("load-summary", "zero")}


def _damages(reader: str, gz: bool) -> list[tuple[str, bool]]:
    """(damage, must be stated) for a reader."""
    out = [(f"cut{c * 100:g}%", False) for c in CUTS] + [(f"flip{k}", False) for k in range(FLIPS)]
    out += [("empty", True), ("wrong-format", True), ("directory", True), ("fifo", True), ("denied", True),
            ("huge", False), ("missing", (reader, "missing") not in AS_WRITTEN),
            ("zero", (reader, "zero") not in AS_WRITTEN), ("dup", False)]
    if gz:
        out += [("gz-cut50%", True), ("gz-cut90%", True)]
    return out


def _write_damaged(src: Path, dst: Path, reader: str, damage: str) -> bool:
    """Write ``src`` damaged as ``damage`` to ``dst``; False when the damage does not apply."""
    gz = src.name.endswith(".gz") and dst.name.endswith(".gz")
    plain = _plain(src) if src.name.endswith(".gz") else src.read_bytes()
    if reader == "kineto-one-line":
        plain = json.dumps(json.loads(plain), separators=(",", ":")).encode()
    if damage.startswith("gz-cut"):
        whole = gzip.compress(plain, mtime=0)
        dst.write_bytes(whole[:int(len(whole) * float(damage[6:-1]) / 100)])
        return True
    if damage == "directory":
        dst.mkdir()
        return True
    if damage == "fifo":
        import os
        os.mkfifo(dst)
        return True
    if damage.startswith("cut"):
        data = plain[:int(len(plain) * float(damage[3:-1]) / 100)]
    elif damage.startswith("flip"):
        data = _flip(plain, int(damage[4:]))
    elif damage == "empty":
        data = b""
    elif damage == "wrong-format":
        data = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    elif damage == "denied":
        data = plain
    elif reader == "nsys-sqlite":
        dst.write_bytes(plain)
        return _sqlite_edit(dst, damage)
    elif reader == "ncu-rep":
        return False
    elif dst.suffix == ".csv" or src.name.endswith(".csv.gz") or src.suffix == ".csv":
        data = _csv_edit(plain, damage)
    elif dst.name.endswith(".jsonl"):
        data = _jsonl_edit(plain, damage)
    else:
        data = _json_edit(plain, damage, reader)
    if data is None:
        return False
    dst.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    if damage == "denied":
        dst.chmod(0)
    return True


def _commands(reader: str, path: str, cmds: tuple, pristine_peer: str) -> list[tuple[str, list, list, str | None]]:
    """(command, argv, outputs, json output) for each command that reads ``path``."""
    out = []
    for c in cmds:
        if c == "analyze":
            out.append((c, ["analyze", path, "--json", "a.json"], ["a.json"], "a.json"))
        elif c == "report":
            out.append((c, ["report", path, "-o", "r.md", "--json", "r.json"], ["r.md", "r.json"], "r.json"))
        elif c == "categories":
            out.append((c, ["categories", path, "-o", "c.json"], ["c.json"], None))
        elif c == "export":
            out.append((c, ["export", "perfetto", path, "-o", "p.json.gz"], ["p.json.gz"], None))
        elif c == "compare":
            out.append((c, ["compare", path, pristine_peer, "-o", "c.md", "--json", "c.json"], ["c.md", "c.json"],
                        None))
        elif c == "ranks":
            out.append((c, ["ranks", path, "--workers", "1", "-o", "m.md", "--json", "m.json"], ["m.md", "m.json"],
                        None))
    return out


def cases(work: Path) -> list[Case]:
    """Write the damaged files under ``work`` and return the input cases (pristine ones first)."""
    pristine, damaged = work / "pristine", work / "damaged"
    pristine.mkdir(parents=True, exist_ok=True)
    damaged.mkdir(parents=True, exist_ok=True)
    out: list[Case] = []
    peer = str(pristine / "decode.trace.json.gz")
    for reader, (fixture, name, cmds) in READERS.items():
        src = DATA / fixture
        ref = pristine / name
        if not ref.exists():
            _write_damaged(src, ref, reader, "cut100%")
        for cmd, argv, outs, js in _commands(reader, str(ref), cmds, peer):
            if reader in COMPANION:
                argv = [argv[0], str(DATA / COMPANION[reader]), *argv[1:]]
            out.append(Case("inputs", f"inputs/{reader}/pristine/{cmd}", argv, inputs=[str(ref)], outputs=outs,
                            json_out=js))
        for damage, must in _damages(reader, src.name.endswith(".gz") and name.endswith(".gz")):
            d = damaged / reader / damage
            d.mkdir(parents=True, exist_ok=True)
            dst = d / name
            if not _write_damaged(src, dst, reader, damage):
                continue
            second = None
            if dst.is_file() and damage != "denied":
                if reader in KINETO_LIKE:
                    raw = dst.read_bytes()
                    try:
                        raw = gzip.decompress(raw) if name.endswith(".gz") else raw
                        second = kineto_reading(raw)
                    except (OSError, EOFError):
                        second = None
                elif reader == "nsys-sqlite":
                    second = sqlite_reading(dst)
                elif reader == "nsys-csv":
                    second = gpu_trace_csv_reading(dst.read_bytes())
            for cmd, argv, outs, js in _commands(reader, str(dst), cmds, peer):
                if reader in COMPANION:
                    argv = [argv[0], str(DATA / COMPANION[reader]), *argv[1:]]
                out.append(Case("inputs", f"inputs/{reader}/{damage}/{cmd}", argv, inputs=[str(dst)], outputs=outs,
                                damaged=True, must_state=must, reference=f"inputs/{reader}/pristine/{cmd}",
                                second=second, json_out=js, as_nobody=damage == "denied",
                                timeout_s=30 if damage == "fifo" else 60))
    for reader, (fixture, member, cmds) in FOLDERS.items():
        ref = pristine / reader
        if not ref.exists():
            shutil.copytree(DATA / fixture, ref)
        for cmd, argv, outs, js in _commands(reader, str(ref), cmds, peer):
            out.append(Case("inputs", f"inputs/{reader}/pristine/{cmd}", argv, inputs=[str(ref)], outputs=outs,
                            json_out=js))
        for damage, must in _damages(reader, member.endswith(".gz")):
            d = damaged / reader / damage / reader
            if d.exists():
                shutil.rmtree(d)
            shutil.copytree(DATA / fixture, d)
            (d / member).unlink()
            as_reader = "ranks" if reader == "ranks" else "manifest"
            if not _write_damaged(DATA / fixture / member, d / member, as_reader, damage):
                continue
            second = None
            if reader == "ranks" and (d / member).is_file() and damage != "denied":
                parts = []
                for f in sorted((d / "torch").glob("*.json.gz")):
                    try:
                        parts.append(kineto_reading(gzip.decompress(f.read_bytes())))
                    except (OSError, EOFError):
                        parts.append(None)
                if all(parts):
                    second = (sum(p[0] for p in parts), sum(p[1] for p in parts))
            for cmd, argv, outs, js in _commands(reader, str(d), cmds, peer):
                out.append(Case("inputs", f"inputs/{reader}/{damage}/{cmd}", argv, inputs=[str(d)], outputs=outs,
                                second=second,
                                damaged=True, must_state=must and damage not in ("missing", "zero", "fifo"),
                                reference=f"inputs/{reader}/pristine/{cmd}", json_out=js,
                                as_nobody=damage == "denied", timeout_s=30 if damage == "fifo" else 90))
    return out
