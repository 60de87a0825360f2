"""List the distinct GPU activity names of every trace fixture in tests/data, with their time.

Reads the files with json/gzip/sqlite3/tarfile/csv only (no tracestory code), so the names and
durations it prints are an independent reading of the fixtures. Output (stdout, TSV):
name, source file, count, total duration in ns. Run from the repository root:

    python3 tests/data/kernel_names/extract_names.py > /tmp/names.tsv
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import sqlite3
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

DATA = Path(__file__).resolve().parents[1]
# Kineto categories of GPU activities, every era (2021 'Kernel'/'Memcpy'/'Memset').
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}


def kineto_events(doc):
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            yield e["name"], round(float(e.get("dur", 0)) * 1000)


def kineto_gpu_names(raw: bytes):
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return kineto_events(json.loads(raw))


def sqlite_gpu_names(path: Path):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("select name from sqlite_master where type in ('table','view')")}
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        cols = {r[1] for r in con.execute("pragma table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
        col = "demangledName" if "demangledName" in cols else "shortName"
        yield from con.execute(
            f"select s.value, k.end - k.start from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds s on s.id = k.{col}"
        )
    con.close()


def ncu_csv_names(text: str):
    rows = list(csv.reader(io.StringIO(text)))
    head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    k = rows[head].index("Kernel Name")
    seen = set()
    for r in rows[head + 1:]:
        if len(r) > k and r[k] and r[k] not in seen and not r[0].startswith("="):
            if r[k] in ("", "Kernel Name"):
                continue
            seen.add(r[k])
            yield r[k], 0


def sources():
    for p in sorted(DATA.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(DATA).as_posix()
        if rel.startswith(("kernel_names/", "corpus/", "nsys_graphs/")):
            # the field corpus is checked by its own expectations (tests/corpus); nsys_graphs
            # holds synthetic exports (a made-up run, names modeled on real kernels: its README)
            continue
        if p.name.endswith((".json.gz", ".json")) and ("trace" in p.name or p.parent.name in ("public", "field")):
            yield rel, kineto_gpu_names(p.read_bytes())
        elif p.suffix == ".sqlite":
            yield rel, sqlite_gpu_names(p)
        elif p.name.endswith(".tar.gz"):
            with tarfile.open(p) as tar:
                for m in tar.getmembers():
                    if m.isfile() and m.name.endswith(".trace.json.gz"):
                        yield f"{rel}:{m.name}", list(kineto_gpu_names(tar.extractfile(m).read()))
                    elif m.isfile() and m.name.endswith("_raw.csv"):
                        yield f"{rel}:{m.name}", list(ncu_csv_names(tar.extractfile(m).read().decode()))
        elif p.name.endswith(("_raw.csv", "_raw.csv.gz")):
            raw = p.read_bytes()
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            yield rel, ncu_csv_names(raw.decode())


def main() -> None:
    w = csv.writer(sys.stdout, delimiter="\t", lineterminator="\n")
    w.writerow(["name", "source", "count", "dur_ns"])
    for rel, items in sources():
        agg = defaultdict(lambda: [0, 0])
        for name, dur in items:
            agg[name][0] += 1
            agg[name][1] += int(dur or 0)
        for name, (n, d) in sorted(agg.items()):
            w.writerow([name, rel, n, d])


if __name__ == "__main__":
    main()
