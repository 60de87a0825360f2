"""load_nsys_sqlite on the two real public exports: every count and sum is checked against a
direct sqlite3 query on the same file."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from conftest import NSYS_2022, NSYS_2024

from tracestory.errors import TraceFormatError, UsageError
from tracestory.ingest.nsys_sqlite import load_nsys_sqlite
from tracestory.trace import API_DRIVER, API_RUNTIME, MEMOP_KINDS


def q(path, sql):
    con = sqlite3.connect(path)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module", params=[NSYS_2022, NSYS_2024], ids=["2022", "2024"])
def loaded(request):
    traces = load_nsys_sqlite(request.param)
    return request.param, traces


def test_one_process_with_its_pid_and_name(loaded):
    path, traces = loaded
    assert len(traces) == 1
    (gpid,), = q(path, "SELECT DISTINCT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL")
    pid, name = q(path, f"SELECT pid, name FROM PROCESSES WHERE globalPid = {gpid}")[0]
    t = traces[0]
    assert t.meta.process_id == pid == (gpid >> 24) & 0xFFFFFF
    assert t.meta.process_name == name
    assert t.meta.source_format == "nsys-sqlite"


def test_kernel_count_sum_and_names(loaded):
    path, (t,) = loaded
    (n, total), = q(path, "SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    assert len(t.kernels) == n
    assert int(t.kernels.dur_ns.sum()) == total
    per_name = dict(q(path, "SELECT s.value, sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                            "JOIN StringIds s ON s.id = k.demangledName GROUP BY s.value"))
    names = t.names(t.kernels["name"])
    got = {nm: int(t.kernels.dur_ns[names == nm].sum()) for nm in set(names)}
    assert got == per_name


def test_kernel_launch_columns(loaded):
    path, (t,) = loaded
    rows = q(path, "SELECT start, gridX, gridY, gridZ, blockX, blockY, blockZ, registersPerThread, "
                   "staticSharedMemory + dynamicSharedMemory, streamId, correlationId, deviceId "
                   "FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start, correlationId")
    exp = np.array(rows, dtype=np.int64)
    k = t.kernels.sorted_by("start_ns", "correlation")
    got = np.stack([k[c].astype(np.int64) for c in ("start_ns", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
                                                    "block_z", "registers_per_thread", "shared_mem_bytes", "stream",
                                                    "correlation", "device")], axis=1)
    np.testing.assert_array_equal(got, exp)


def test_memops_by_kind_count_bytes_and_time(loaded):
    path, (t,) = loaded
    m = t.memops
    copies = q(path, "SELECT copyKind, count(*), sum(bytes), sum(end - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind")
    # nsys copyKind 1 = HtoD, 2 = DtoH (FORMATS.md)
    for kind, n, nbytes, dur in copies:
        name = {1: "memcpy_htod", 2: "memcpy_dtoh"}[kind]
        sel = m["kind"] == MEMOP_KINDS.index(name)
        assert (int(sel.sum()), int(m["bytes"][sel].sum()), int(m.dur_ns[sel].sum())) == (n, nbytes, dur)
    tables = {r[0] for r in q(path, "SELECT name FROM sqlite_master")}
    sel = m["kind"] == MEMOP_KINDS.index("memset")
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        (n, nbytes), = q(path, "SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMSET")
        assert (int(sel.sum()), int(m["bytes"][sel].sum())) == (n, nbytes)
    else:
        assert not sel.any()  # the lazy 2024 export has no memset table


def test_memop_names_in_kineto_style():
    t, = load_nsys_sqlite(NSYS_2022)
    names = set(t.names(t.memops["name"]))
    # srcKind/dstKind 1 = Pinned, 2 = Device; memKind 2 = Device (FORMATS.md)
    assert names == {"Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pinned)", "Memset (Device)"}


def test_api_keeps_runtime_and_driver_and_strips_version(loaded):
    path, (t,) = loaded
    rows = q(path, "SELECT eventClass, s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                   "WHERE eventClass IN (0, 1)")
    assert len(t.api) == len(rows)
    assert int((t.api["kind"] == API_DRIVER).sum()) == sum(1 for c, _ in rows if c == 1)
    assert int((t.api["kind"] == API_RUNTIME).sum()) == sum(1 for c, _ in rows if c == 0)
    names = set(t.names(t.api["name"]))
    assert "cudaLaunchKernel" in names and not any(n.endswith("_v7000") for n in names)
    (total,), = q(path, "SELECT sum(end - start) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0, 1)")
    assert int(t.api.dur_ns.sum()) == total


def test_every_kernel_links_to_its_launch(loaded):
    from tracestory.analysis.links import launch_index

    path, (t,) = loaded
    (n,), = q(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                    "ON r.correlationId = k.correlationId AND (r.globalTid & ~16777215) = k.globalPid")
    assert int((launch_index(t, t.kernels) >= 0).sum()) == n


def test_nvtx_ranges_2022():
    t, = load_nsys_sqlite(NSYS_2022)
    rows = q(NSYS_2022, "SELECT start, end, text FROM NVTX_EVENTS WHERE eventType = 59 ORDER BY start")
    r = t.ranges
    assert len(r) == len(rows) == 76
    assert list(r["start_ns"]) == [s for s, _, _ in rows]
    assert int(r.dur_ns.sum()) == sum(e - s for s, e, _ in rows)
    assert list(t.names(r["name"])) == [x for _, _, x in rows]
    # The names spell the nesting ("main->test_max_par->phase"): depth = number of "->".
    assert list(r["depth"]) == [x.count("->") for _, _, x in rows]
    (domain,), = q(NSYS_2022, "SELECT text FROM NVTX_EVENTS WHERE eventType = 75")
    assert set(t.names(r["domain"])) == {domain}
    (gtid,), = q(NSYS_2022, "SELECT DISTINCT globalTid FROM NVTX_EVENTS WHERE eventType = 59")
    assert set(r["tid"].tolist()) == {gtid & 0xFFFFFF}


def test_memory_usage_events_2022():
    t, = load_nsys_sqlite(NSYS_2022)
    rows = q(NSYS_2022, "SELECT memKind, memoryOperationType, bytes FROM CUDA_GPU_MEMORY_USAGE_EVENTS")
    assert len(t.memory) == len(rows) == 60
    dev = t.memory["device"] >= 0
    # memKind 2 = Device: allocations (op 0) minus frees (op 1)
    exp = sum(b if op == 0 else -b for k, op, b in rows if k == 2)
    assert int(t.memory["delta_bytes"][dev].sum()) == exp
    last = t.memory.take(dev)["allocated_bytes"][-1]
    assert int(last) == exp


def test_devices_and_version():
    t, = load_nsys_sqlite(NSYS_2022)
    (name, sms, bw, major, minor), = q(NSYS_2022, "SELECT name, smCount, memoryBandwidth, computeMajor, computeMinor "
                                                  "FROM TARGET_INFO_GPU WHERE id = 0")
    d, = t.meta.devices  # the Intel and Basic Render adapters are not CUDA devices
    assert (d.name, d.sm_count, d.memory_bandwidth_bytes_per_s, d.compute_capability) == (name, sms, bw, f"{major}.{minor}")
    assert t.meta.format_version == "2022.1.1.61 (schema 2.9.1)"
    t24, = load_nsys_sqlite(NSYS_2024)
    assert t24.meta.format_version == "2024.5.1.113 (schema 3.13.2)"
    used = {r[0] for r in q(NSYS_2024, "SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL")}
    assert {d.id for d in t24.meta.devices} == used
    assert t24.meta.devices[0].name == "NVIDIA A100-SXM4-80GB" and t24.meta.devices[0].sm_count == 108


def test_not_sqlite_and_missing(tmp_path):
    bad = tmp_path / "x.sqlite"
    bad.write_text("hello")
    with pytest.raises(TraceFormatError, match="x.sqlite: expected an Nsight Systems SQLite export"):
        load_nsys_sqlite(bad)
    with pytest.raises(UsageError):
        load_nsys_sqlite(tmp_path / "nope.sqlite")
    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (a INT)")
    con.commit()
    con.close()
    with pytest.raises(TraceFormatError, match="CUPTI_ACTIVITY_KIND_"):
        load_nsys_sqlite(other)


# --------------------------------------------------------------------------- the page reader
# Tables and the integer columns the loader reads from them.
READ_COLUMNS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "deviceId", "streamId", "correlationId", "globalPid",
                                   "demangledName", "shortName", "gridX", "gridY", "gridZ", "blockX", "blockY",
                                   "blockZ", "registersPerThread", "staticSharedMemory", "dynamicSharedMemory"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes",
                                   "copyKind", "srcKind", "dstKind"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes",
                                   "memKind"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "eventClass", "globalTid", "correlationId", "nameId"),
    "NVTX_EVENTS": ("start", "end", "eventType", "globalTid", "textId", "domainId"),
    "CUDA_GPU_MEMORY_USAGE_EVENTS": ("start", "globalPid", "deviceId", "bytes", "memKind", "memoryOperationType"),
}


@pytest.mark.parametrize("path", [NSYS_2022, NSYS_2024], ids=["2022", "2024"])
def test_page_reader_equals_sqlite_on_every_table_read(path):
    """The B-tree page reader returns, for every table and column the loader reads, exactly
    what a plain SELECT ... ORDER BY rowid returns (NULL as -1), and it is the reader used."""
    from tracestory.ingest.nsys_db import Db

    db = Db(path)
    try:
        present = [t for t in READ_COLUMNS if t in db.tables]
        assert "CUPTI_ACTIVITY_KIND_KERNEL" in present and len(present) >= 3
        for table in present:
            cols = [c for c in READ_COLUMNS[table] if c in db.columns(table)]
            got = db.read(table, {c: c for c in cols})
            rows = q(path, f'SELECT {", ".join(cols)} FROM {table} ORDER BY rowid')
            exp = np.array([[-1 if v is None else v for v in r] for r in rows], dtype=np.int64).reshape(-1, len(cols))
            for i, c in enumerate(cols):
                np.testing.assert_array_equal(got[c], exp[:, i], err_msg=f"{table}.{c}")
        assert db.fast_tables == set(present)  # none fell back to SQLite
    finally:
        db.close()


@pytest.mark.parametrize("path", [NSYS_2022, NSYS_2024], ids=["2022", "2024"])
def test_load_is_the_same_with_either_reader(path, monkeypatch):
    from tracestory.ingest import nsys_sqlite

    fast, = load_nsys_sqlite(path)
    monkeypatch.setattr(nsys_sqlite, "_PAGE_READER", False)
    slow, = load_nsys_sqlite(path)
    assert fast.strings == slow.strings
    for table in ("kernels", "memops", "api", "ranges", "memory"):
        a, b = getattr(fast, table), getattr(slow, table)
        for c in a.columns:
            np.testing.assert_array_equal(a[c], b[c], err_msg=f"{table}.{c}")


def test_kernel_short_names(loaded):
    path, (t,) = loaded
    pairs = q(path, "SELECT DISTINCT d.value, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                    "JOIN StringIds d ON d.id = k.demangledName JOIN StringIds s ON s.id = k.shortName")
    assert len({d for d, _ in pairs}) == len(pairs)  # one short name per kernel name in these files
    assert t.meta.extra["kernel_short_names"] == dict(pairs)
