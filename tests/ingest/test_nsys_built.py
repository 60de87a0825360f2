"""Small SQLite databases BUILT here (not captured) from the documented schema
(docs/FORMATS.md): a 2021-era export (no metadata table, device properties in
TARGET_INFO_CUDA_GPU, eventClass 67 backtrace duplicates, no mangledName) and a two-process
report. Expected values are written by hand next to the rows."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from conftest import NSYS_2022

from tracestory.ingest import nsys_btree, nsys_db, nsys_sqlite
from tracestory.ingest.nsys_sqlite import load_nsys_sqlite
from tracestory.trace import API_DRIVER, API_RUNTIME

VM = 1 << 56  # top byte: vm id, as in the real exports


def gpid(pid):
    return VM | (pid << 24)


def gtid(pid, tid):
    return gpid(pid) | tid


def build(path, tables: dict[str, tuple[str, list[tuple]]]):
    con = sqlite3.connect(path)
    for name, (cols, rows) in tables.items():
        con.execute(f"CREATE TABLE {name} ({cols})")
        if rows:
            marks = ",".join("?" * len(rows[0]))
            con.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)
    con.commit()
    con.close()
    return path


KERNEL_COLS = ("start INT, end INT, deviceId INT, contextId INT, streamId INT, correlationId INT, globalPid INT, "
               "demangledName INT, shortName INT, gridX INT, gridY INT, gridZ INT, blockX INT, blockY INT, blockZ INT, "
               "registersPerThread INT, staticSharedMemory INT, dynamicSharedMemory INT")
RUNTIME_COLS = "start INT, end INT, eventClass INT, globalTid INT, correlationId INT, nameId INT, returnValue INT"


@pytest.fixture
def db2021(tmp_path):
    p = gpid(4242)
    return build(tmp_path / "old2021.sqlite", {
        "StringIds": ("id INTEGER PRIMARY KEY, value TEXT", [(1, "gemm_kernel(float*)"), (2, "gemm_kernel"),
                                                               (3, "cudaLaunchKernel_v7000"), (4, "cuLaunchKernel"),
                                                               (5, "step")]),
        "CUPTI_ACTIVITY_KIND_KERNEL": (KERNEL_COLS, [
            (100, 150, 0, 1, 7, 10, p, 1, 2, 4, 1, 1, 128, 1, 1, 32, 0, 1024),
            (200, 290, 0, 1, 7, 11, p, 1, 2, 4, 1, 1, 128, 1, 1, 32, 512, 0),
        ]),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (RUNTIME_COLS, [
            (90, 95, 0, gtid(4242, 7), 10, 3, 0), (90, 95, 67, gtid(4242, 7), 10, 3, 0),  # 67: backtrace duplicate
            (190, 196, 1, gtid(4242, 7), 11, 4, 0),
        ]),
        "NVTX_EVENTS": (("start INT, end INT, eventType INT, rangeId INT, category INT, color INT, text TEXT, "
                         "globalTid INT, endGlobalTid INT, textId INT, domainId INT"), [
            (80, 300, 59, None, None, None, None, gtid(4242, 7), None, 5, 0),  # registered string (textId)
            (120, None, 34, None, None, None, "mark", gtid(4242, 7), None, None, 0),
            (310, None, 59, None, None, None, "unterminated", gtid(4242, 7), None, None, 0),
        ]),
        "TARGET_INFO_GPU": ("vmId INT, deviceId INT, name TEXT, busLocation TEXT, isDiscrete INT",
                            [(VM, 0, "Tesla V100-SXM2-16GB", "0000:00:1e.0", 1)]),
        # CUPTI device record units: bandwidth kB/s, clock kHz
        "TARGET_INFO_CUDA_GPU": (("deviceId INT, name TEXT, computeCapabilityMajor INT, computeCapabilityMinor INT, "
                                  "numMultiprocessors INT, globalMemorySize INT, globalMemoryBandwidth INT, "
                                  "coreClockRate INT, l2CacheSize INT"),
                                 [(0, "Tesla V100-SXM2-16GB", 7, 0, 80, 16945512448, 898048000, 1530000, 6291456)]),
        "PROCESSES": ("globalPid INT, pid INT, name TEXT", [(p, 4242, "train.py")]),
    })


def test_2021_layout(db2021):
    t, = load_nsys_sqlite(db2021)
    assert t.meta.format_version is None and t.meta.extra["export_era"] == "2021"
    assert (t.meta.process_id, t.meta.process_name) == (4242, "train.py")
    k = t.kernels
    assert len(k) == 2 and int(k.dur_ns.sum()) == 50 + 90
    assert list(t.names(k["name"])) == ["gemm_kernel(float*)"] * 2
    assert list(k["shared_mem_bytes"]) == [1024, 512]
    assert (list(k["grid_x"]), list(k["block_x"]), list(k["registers_per_thread"])) == ([4, 4], [128, 128], [32, 32])
    assert t.meta.extra["kernel_short_names"] == {"gemm_kernel(float*)": "gemm_kernel"}
    # eventClass 67 dropped; runtime/driver kept with the version suffix stripped
    assert len(t.api) == 2
    assert list(t.names(t.api["name"])) == ["cudaLaunchKernel", "cuLaunchKernel"]
    assert list(t.api["kind"]) == [API_RUNTIME, API_DRIVER]
    assert list(t.api["tid"]) == [7, 7] and list(t.api["pid"]) == [4242, 4242]
    d, = t.meta.devices
    assert (d.name, d.sm_count, d.compute_capability) == ("Tesla V100-SXM2-16GB", 80, "7.0")
    assert d.memory_bandwidth_bytes_per_s == 898048000 * 1000 and d.clock_hz == 1530000 * 1000
    assert d.total_memory_bytes == 16945512448 and d.l2_cache_bytes == 6291456
    # ranges: textId name, the mark is zero-length and nested at depth 1, the unterminated one dropped
    r = t.ranges
    assert list(t.names(r["name"])) == ["step", "mark"]
    assert list(r.dur_ns) == [220, 0] and list(r["depth"]) == [0, 1]
    assert t.meta.extra["nvtx_unterminated"] == 1
    assert len(t.memops) == 0 and len(t.memory) == 0


def test_two_processes_become_two_traces(tmp_path):
    a, b = gpid(100), gpid(200)
    path = build(tmp_path / "two.sqlite", {
        "StringIds": ("id INTEGER PRIMARY KEY, value TEXT", [(1, "k_a"), (2, "k_b"), (3, "cudaLaunchKernel_v7000")]),
        "CUPTI_ACTIVITY_KIND_KERNEL": (KERNEL_COLS, [
            (10, 20, 0, 1, 7, 1, a, 1, 1, 1, 1, 1, 32, 1, 1, 8, 0, 0),
            (12, 30, 1, 1, 7, 1, b, 2, 2, 1, 1, 1, 32, 1, 1, 8, 0, 0),  # same correlation id, other process
            (40, 45, 1, 1, 7, 2, b, 2, 2, 1, 1, 1, 32, 1, 1, 8, 0, 0),
        ]),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (RUNTIME_COLS, [
            (5, 6, 0, gtid(100, 1), 1, 3, 0), (7, 8, 0, gtid(200, 2), 1, 3, 0), (35, 36, 0, gtid(200, 2), 2, 3, 0)]),
        "CUPTI_ACTIVITY_KIND_MEMCPY": (("start INT, end INT, deviceId INT, streamId INT, correlationId INT, "
                                        "globalPid INT, bytes INT, copyKind INT, srcKind INT, dstKind INT"),
                                       [(50, 60, 1, 7, 3, b, 4096, 10, 2, 2)]),  # 10 = PtoP
        "TARGET_INFO_GPU": ("vmId INT, id INT, name TEXT, smCount INT, computeMajor INT, computeMinor INT",
                            [(VM, 0, "GPU-A", 132, 9, 0), (VM, 1, "GPU-B", 132, 9, 0)]),
        "PROCESSES": ("globalPid INT, pid INT, name TEXT", [(a, 100, "rank0"), (b, 200, "rank1")]),
    })
    t0, t1 = load_nsys_sqlite(path)
    assert (t0.meta.process_id, t0.meta.rank, t0.meta.world_size) == (100, 0, 2)
    assert (t1.meta.process_id, t1.meta.rank, t1.meta.process_name) == (200, 1, "rank1")
    assert len(t0.kernels) == 1 and len(t1.kernels) == 2
    assert int(t0.kernels.dur_ns.sum()) == 10 and int(t1.kernels.dur_ns.sum()) == 18 + 5
    assert [d.name for d in t0.meta.devices] == ["GPU-A"] and [d.name for d in t1.meta.devices] == ["GPU-B"]
    assert len(t0.api) == 1 and len(t1.api) == 2
    assert len(t0.memops) == 0 and t1.names(t1.memops["name"])[0] == "Memcpy PtoP (Device -> Device)"
    from tracestory.analysis.links import launch_start_ns

    # correlation id 1 exists in both processes: each kernel links to its own process's call
    assert list(launch_start_ns(t0, t0.kernels)) == [5]
    assert list(launch_start_ns(t1, t1.kernels)) == [7, 35]


def test_chunked_parallel_read_equals_single_read(monkeypatch):
    whole, = load_nsys_sqlite(NSYS_2022)
    monkeypatch.setattr(nsys_sqlite, "_PAGE_READER", False)
    monkeypatch.setattr(nsys_db, "_CHUNK_ROWS", 7)  # many chunks, read by the thread pool
    chunked, = load_nsys_sqlite(NSYS_2022)
    for table in ("kernels", "memops", "api", "ranges", "memory"):
        a, b = getattr(whole, table), getattr(chunked, table)
        for c in a.columns:
            if a[c].dtype != object:
                np.testing.assert_array_equal(a[c], b[c], err_msg=f"{table}.{c}")
    assert whole.strings == chunked.strings


# --------------------------------------------------------------------------- the page reader
# Databases built here to reach every branch of ingest/nsys_btree.py; the expected values are
# the rows as written (or a plain SELECT ... ORDER BY rowid on the same file).
# one value per SQLite integer serial type: 0 and 1 (types 8, 9), 1/2/3/4/6/8-byte integers
# at both ends of their range, and NULL (read as -1)
EDGE = [0, 1, -1, 127, -128, 128, 32767, -32768, 32768, 2**23 - 1, -2**23, 2**23, 2**31 - 1, -2**31, 2**31,
        2**47 - 1, -2**47, 2**47, 2**63 - 1, -2**63, None]


def _table(path, cols: str, rows: list[tuple], page_size: int = 4096, name: str = "T"):
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA page_size = {page_size}")
    con.execute(f"CREATE TABLE {name} ({cols})")
    con.executemany(f"INSERT INTO {name} VALUES ({','.join('?' * len(rows[0]))})", rows)
    con.commit()
    con.close()
    return path


def _fast(path, table: str, columns: list[str]):
    """The page reader's result for ``columns`` (None: it declined)."""
    con = sqlite3.connect(path)
    root, = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    info = con.execute(f"PRAGMA table_info({table})").fetchall()
    n, = con.execute(f"SELECT count(*) FROM {table}").fetchone()
    con.close()
    names = [r[1] for r in info]
    pk = [r for r in info if r[5]]
    alias = names.index(pk[0][1]) if len(pk) == 1 and pk[0][2].upper() == "INTEGER" else None
    return nsys_btree.read_columns(path, root, len(names), {c: names.index(c) for c in columns}, n, rowid_alias=alias)


def _select(path, table: str, columns: list[str]) -> dict[str, list]:
    con = sqlite3.connect(path)
    rows = con.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY rowid").fetchall()
    con.close()
    return {c: [-1 if r[i] is None else r[i] for r in rows] for i, c in enumerate(columns)}


def test_page_reader_every_integer_serial_type(tmp_path):
    # each column cycles through EDGE with a different phase: every row mixes widths
    rows = [tuple(EDGE[(i + 3 * j) % len(EDGE)] for j in range(5)) for i in range(len(EDGE) * 4)]
    path = _table(tmp_path / "edge.sqlite", "a INT, b INT, c INT, d INT, e INT", rows)
    got = _fast(path, "T", ["a", "b", "c", "d", "e"])
    assert got is not None
    for j, c in enumerate("abcde"):
        assert got[c].tolist() == [-1 if r[j] is None else r[j] for r in rows], c


def test_page_reader_deep_tree_many_steps_and_threads(tmp_path, monkeypatch):
    # 512-byte pages: 20 000 rows make a B-tree of 1084 leaves under two interior levels; 3 pages per step
    # make hundreds of steps, read by the thread pool and reassembled in rowid order
    rows = [(i * 1_000_003, i * 1_000_003 + (i % 977), i % 5, -i, None if i % 11 == 0 else i % 300)
            for i in range(20_000)]
    path = _table(tmp_path / "deep.sqlite", "start INT, end INT, k INT, neg INT, maybe INT", rows, page_size=512)
    monkeypatch.setattr(nsys_btree, "_CHUNK_BYTES", 3 * 512)
    monkeypatch.setattr(nsys_btree, "_THREADS", 3)
    cols = ["start", "end", "k", "neg", "maybe"]
    got = _fast(path, "T", cols)
    assert got is not None
    exp = {"start": [r[0] for r in rows], "end": [r[1] for r in rows], "k": [r[2] for r in rows],
           "neg": [r[3] for r in rows], "maybe": [-1 if r[4] is None else r[4] for r in rows]}
    for c in cols:
        assert got[c].tolist() == exp[c], c


def test_page_reader_after_deletes_and_updates(tmp_path):
    # freed space inside pages, cells moved by updates, leaves no longer in file order
    path = _table(tmp_path / "churn.sqlite", "a INT, b INT",
                  [(i, i * 7) for i in range(3000)], page_size=1024)
    con = sqlite3.connect(path)
    con.execute("DELETE FROM T WHERE a % 3 = 0")
    con.execute("UPDATE T SET b = b * 100000 WHERE a % 5 = 0")  # wider values: cells move
    con.executemany("INSERT INTO T VALUES (?, ?)", [(-i, i) for i in range(500)])
    con.commit()
    con.close()
    got = _fast(path, "T", ["a", "b"])
    assert got is not None
    exp = _select(path, "T", ["a", "b"])
    assert got["a"].tolist() == exp["a"] and got["b"].tolist() == exp["b"]
    assert len(exp["a"]) == 3000 - 1000 + 500


def test_page_reader_reads_past_short_text_and_declines_what_it_cannot_verify(tmp_path):
    short = [(i, f"r{i}", i * 2) for i in range(50)]
    path = _table(tmp_path / "text.sqlite", "a INT, s TEXT, b INT", short)
    got = _fast(path, "T", ["a", "b"])  # short text: one-byte serial types, values after it read
    assert got is not None and got["b"].tolist() == [i * 2 for i in range(50)]
    # text longer than 57 bytes: a two-byte serial type
    path = _table(tmp_path / "long.sqlite", "a INT, s TEXT, b INT", [(1, "x" * 100, 2)])
    assert _fast(path, "T", ["a", "b"]) is None
    # a payload that spills to overflow pages
    path = _table(tmp_path / "blob.sqlite", "a INT, s BLOB", [(1, b"\0" * 9000)])
    assert _fast(path, "T", ["a"]) is None
    # a float in an integer column
    path = _table(tmp_path / "real.sqlite", "a INT, b INT", [(1, 2), (3, 4.5)])
    assert _fast(path, "T", ["a"])["a"].tolist() == [1, 3]  # column a is fine
    assert _fast(path, "T", ["b"]) is None
    # an INTEGER PRIMARY KEY column is the rowid (stored as NULL in the record)
    path = _table(tmp_path / "pk.sqlite", "id INTEGER PRIMARY KEY, b INT", [(5, 6)])
    assert _fast(path, "T", ["id"]) is None
    assert _fast(path, "T", ["b"])["b"].tolist() == [6]


def test_page_reader_declines_rows_from_before_add_column(tmp_path):
    path = _table(tmp_path / "alter.sqlite", "a INT, b INT", [(1, 2)])
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE T ADD COLUMN c INT DEFAULT 9")
    con.execute("INSERT INTO T VALUES (3, 4, 5)")
    con.commit()
    con.close()
    assert _fast(path, "T", ["a", "c"]) is None  # the old row's record has 2 columns, not 3
    db = nsys_db.Db(path)
    try:  # the SQLite path gives the default for the old row
        assert db.read("T", {"c": "c"})["c"].tolist() == [9, 5] and "T" not in db.fast_tables
    finally:
        db.close()


def test_page_reader_declines_a_wal_database(tmp_path):
    path = _table(tmp_path / "wal.sqlite", "a INT", [(1,)])
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode = WAL")
    con.execute("INSERT INTO T VALUES (2)")
    con.commit()
    assert _fast(path, "T", ["a"]) is None  # committed rows may be in the -wal file
    db = nsys_db.Db(path)
    try:  # SQLite reads the journal
        assert db.read("T", {"a": "a"})["a"].tolist() == [1, 2]
    finally:
        db.close()
    con.close()


def test_full_load_of_a_built_export_with_many_kernels(tmp_path, monkeypatch):
    """3000 kernels over ~30 pages read one page per step, out of start order on purpose: the
    loader's result equals the rows sorted by start, and each reader gives the same trace."""
    p = gpid(77)
    rows = []
    for i in range(3000):
        s = (i * 7919) % 3000 * 100  # a permutation of starts
        rows.append((s, s + 10 + i % 13, 0, 1, 7, i, p, 1 + i % 3, 1 + i % 3, 1 + i % 4, 1, 1, 64 * (1 + i % 2), 1, 1,
                     32, 0, 0 if i % 5 else 256))
    path = build(tmp_path / "many.sqlite", {
        "StringIds": ("id INTEGER PRIMARY KEY, value TEXT", [(1, "k1"), (2, "k2"), (3, "k3")]),
        "CUPTI_ACTIVITY_KIND_KERNEL": (KERNEL_COLS, rows),
    })
    monkeypatch.setattr(nsys_btree, "_CHUNK_BYTES", 4096)
    t, = load_nsys_sqlite(path)
    order = sorted(range(3000), key=lambda i: (rows[i][0], i))
    assert t.kernels["start_ns"].tolist() == [rows[i][0] for i in order]
    assert t.kernels["correlation"].tolist() == [rows[i][5] for i in order]
    assert t.names(t.kernels["name"]).tolist() == [f"k{rows[i][7]}" for i in order]
    assert t.kernels["shared_mem_bytes"].tolist() == [rows[i][17] for i in order]
    assert int(t.kernels.dur_ns.sum()) == sum(r[1] - r[0] for r in rows)
    monkeypatch.setattr(nsys_sqlite, "_PAGE_READER", False)
    slow, = load_nsys_sqlite(path)
    for c in t.kernels.columns:
        np.testing.assert_array_equal(t.kernels[c], slow.kernels[c], err_msg=c)


def test_page_reader_declines_from_a_late_step_in_the_thread_pool(tmp_path, monkeypatch):
    rows = [(i, i) for i in range(5000)] + [(5000, 0.5)]  # one float, in the last page
    path = _table(tmp_path / "late.sqlite", "a INT, b INT", rows, page_size=512)
    monkeypatch.setattr(nsys_btree, "_CHUNK_BYTES", 2 * 512)
    monkeypatch.setattr(nsys_btree, "_THREADS", 3)
    assert _fast(path, "T", ["b"]) is None
    assert _fast(path, "T", ["a"])["a"].tolist() == list(range(5001))
