"""The nsys summary tables (cuda_api_sum, cuda_gpu_mem_time_sum, cuda_gpu_mem_size_sum, osrt_sum)
against a direct SQL computation on the real Nsight Systems exports in tests/data, and the
"not in this export" answer where an export lacks the table.

Second sources: SQLite GROUP BY queries on the CUPTI / OSRT tables (the reports' own grouping),
Python's ``statistics`` for the median and the sample standard deviation (ddof=1, what nsys
prints), the copy-kind labels of ``ENUM_CUDA_MEMCPY_OPER`` as the 2024 export spells them
(written out below and checked against that table), and a hand reading of the built CSV.
"""

from __future__ import annotations

import json
import re
import sqlite3
import statistics
import subprocess
import sys

import pytest
from conftest import H200_LLAMA, NSYS_2022, NSYS_2024, REPO, TEST_DATA

from tracestory.analysis import analyze
from tracestory.analysis.results import analyze_inputs
from tracestory.analysis.tables import table
from tracestory.ingest import load_inputs
from tracestory.ingest.kineto import load_kineto
from tracestory.ingest.nsys_csv import load_nsys_csv
from tracestory.ingest.nsys_sqlite import load_nsys_sqlite

OLD_NSYS = TEST_DATA / "field" / "extra-p_extrap__a100_exgpu_s10_old_nsys.sqlite"
MEMSET_ONLY = TEST_DATA / "corpus" / "nsight" / "frasertajima_WeatherBench2__rtx4060_unet_no_kernels.sqlite"
EXPORTS = [NSYS_2024, NSYS_2022, OLD_NSYS, MEMSET_ONLY]

# ENUM_CUDA_MEMCPY_OPER (id -> label) as nsys 2024.5 writes it; older exports lack the table
COPY_LABEL = {0: "Unknown", 1: "Host-to-Device", 2: "Device-to-Host", 3: "Host-to-Array", 4: "Array-to-Host",
              5: "Array-to-Array", 6: "Array-to-Device", 7: "Device-to-Array", 8: "Device-to-Device",
              9: "Host-to-Host", 10: "Peer-to-Peer", 11: "Unified Host-to-Device", 12: "Unified Device-to-Host",
              13: "Unified Device-to-Device"}


def _sql(path, query: str) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return db.execute(query).fetchall()


def _has(path, table: str) -> bool:
    return bool(_sql(path, f"SELECT 1 FROM sqlite_master WHERE name = '{table}'"))


def _expected(groups: dict[str, list[int]], share: bool = True) -> list[tuple]:
    """The nsys statistics of each group, ordered by total descending, then count, then name."""
    grand = sum(sum(v) for v in groups.values())
    rows = []
    for name, d in groups.items():
        tot = sum(d)
        rows.append((name, len(d), tot, *((tot / grand,) if share else ()), statistics.mean(d), statistics.median(d),
                     min(d), max(d), statistics.stdev(d) if len(d) > 1 else 0.0))
    return sorted(rows, key=lambda r: (-r[2], r[1], r[0]))


def _assert_rows(got: list[tuple], want: list[tuple], exact: int) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[:exact] == w[:exact]
        assert g[exact:] == pytest.approx(w[exact:], rel=1e-12, abs=1e-9)


@pytest.fixture(scope="module", params=EXPORTS, ids=lambda p: p.name)
def export(request):
    (trace,) = load_nsys_sqlite(request.param)
    return request.param, analyze(trace)


def test_cuda_api_sum_is_the_runtime_table_grouped_in_sql(export):
    path, a = export
    groups: dict[str, list[int]] = {}
    # runtime (0) and driver (1) calls; the _vNNNN suffix stripped as nsys prints names
    for name, d in _sql(path, "SELECT s.value, r.end - r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                              "JOIN StringIds s ON s.id = r.nameId WHERE r.eventClass IN (0, 1)"):
        groups.setdefault(re.sub(r"_v\d+$", "", name), []).append(d)
    t = table("cuda_api_sum", a)
    assert t.missing is None
    assert list(t.columns) == ["name", "count", "total_ns", "share", "mean_ns", "median_ns", "min_ns", "max_ns",
                               "stddev_ns"]
    _assert_rows(t.rows(), _expected(groups), exact=3)
    assert float(sum(t["share"])) == pytest.approx(1.0)


def test_old_export_backtrace_rows_are_not_calls():
    """The old export holds each call twice: eventClass 0 and a CUDA backtrace row (67)."""
    (trace,) = load_nsys_sqlite(OLD_NSYS)
    t = table("cuda_api_sum", analyze(trace))
    ((calls,),) = _sql(OLD_NSYS, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 0")
    ((all_rows,),) = _sql(OLD_NSYS, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    assert (calls, all_rows) == (18, 36)
    assert int(sum(t["count"])) == calls


def _mem_groups(path, value: str) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    if _has(path, "CUPTI_ACTIVITY_KIND_MEMCPY"):
        for kind, v in _sql(path, f"SELECT copyKind, {value} FROM CUPTI_ACTIVITY_KIND_MEMCPY"):
            groups.setdefault(f"[CUDA memcpy {COPY_LABEL[kind]}]", []).append(v)
    if _has(path, "CUPTI_ACTIVITY_KIND_MEMSET"):
        for (v,) in _sql(path, f"SELECT {value} FROM CUPTI_ACTIVITY_KIND_MEMSET"):
            groups.setdefault("[CUDA memset]", []).append(v)
    return groups


def test_copy_labels_are_the_exports_enum():
    assert dict(_sql(NSYS_2024, "SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER")) == COPY_LABEL


def test_cuda_gpu_mem_time_and_size_sum_are_the_memops_grouped_in_sql(export):
    path, a = export
    time_t, size_t = table("cuda_gpu_mem_time_sum", a), table("cuda_gpu_mem_size_sum", a)
    groups = _mem_groups(path, "end - start")
    if not groups:  # the old export: CUDA traced, no memcpy/memset table
        assert path == OLD_NSYS
        for t in (time_t, size_t):
            assert len(t) == 0 and "no CUPTI_ACTIVITY_KIND_MEMCPY or CUPTI_ACTIVITY_KIND_MEMSET table" in t.missing
        return
    assert time_t.missing is None and size_t.missing is None
    assert list(time_t.columns)[0] == "operation"
    _assert_rows(time_t.rows(), _expected(groups), exact=3)
    assert list(size_t.columns) == ["operation", "count", "total_bytes", "mean_bytes", "median_bytes", "min_bytes",
                                    "max_bytes", "stddev_bytes"]
    _assert_rows(size_t.rows(), _expected(_mem_groups(path, "bytes"), share=False), exact=3)


def test_osrt_sum_is_the_osrt_calls_grouped_in_sql(export):
    path, a = export
    t = table("osrt_sum", a)
    if not _has(path, "OSRT_API"):
        assert len(t) == 0
        assert t.missing == "not in this export: no OSRT_API table (capture with nsys profile --trace=osrt)"
        return
    groups: dict[str, list[int]] = {}
    # eventClass 27: the calls (31/32 are zero-length 'profiling started/finished' marks)
    for name, d in _sql(path, "SELECT s.value, o.end - o.start FROM OSRT_API o JOIN StringIds s ON s.id = o.nameId "
                              "WHERE o.eventClass = 27"):
        groups.setdefault(name, []).append(d)
    assert t.missing is None
    _assert_rows(t.rows(), _expected(groups), exact=3)


def test_cloverleaf_top_rows_read_by_hand():
    """A second look at two rows of the 2024 export, from one-line SQL sums."""
    (trace,) = load_nsys_sqlite(NSYS_2024)
    a = analyze(trace)
    ((n, tot),) = _sql(NSYS_2024, "SELECT count(*), sum(end - start) FROM OSRT_API o JOIN StringIds s "
                                  "ON s.id = o.nameId WHERE s.value = 'poll'")
    assert table("osrt_sum", a).rows()[0][:3] == ("poll", n, tot) == ("poll", 18, 500_924_932)
    ((n, b),) = _sql(NSYS_2024, "SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1")
    assert table("cuda_gpu_mem_size_sum", a).rows()[0][:3] == ("[CUDA memcpy Host-to-Device]", n, b)


def test_csv_timeline_gives_the_memory_tables_and_no_api_table():
    """cuda_gpu_trace_2024.csv (built, README): one HtoD memcpy of 4.000 MB lasting 500 ns and
    one memset; the CSV holds no API calls."""
    traces = load_nsys_csv(TEST_DATA / "nsys" / "cuda_gpu_trace_2024.csv")
    a = analyze(traces[0])
    rows = {r[0]: r for r in table("cuda_gpu_mem_size_sum", a).rows()}
    assert rows["[CUDA memcpy Host-to-Device]"][1:3] == (1, 4_000_000)
    time_rows = {r[0]: r for r in table("cuda_gpu_mem_time_sum", a).rows()}
    assert time_rows["[CUDA memcpy Host-to-Device]"][1:3] == (1, 500)
    assert set(time_rows) == {"[CUDA memcpy Host-to-Device]", "[CUDA memset]"}
    api = table("cuda_api_sum", a)
    assert len(api) == 0 and api.missing.startswith("not in this export: an nsys stats CSV holds no API calls")
    assert table("osrt_sum", a).missing.startswith("not in this trace: OS runtime calls are recorded by Nsight")


def test_kineto_api_table_is_the_runtime_events_summed_in_json():
    import gzip

    with gzip.open(H200_LLAMA, "rt") as f:
        events = json.load(f)["traceEvents"]
    groups: dict[str, list[int]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver"):
            groups.setdefault(e["name"], []).append(round(e["dur"] * 1000))
    t = table("cuda_api_sum", analyze(load_kineto(H200_LLAMA)))
    assert {r[0]: r[1:3] for r in t.rows()} == {n: (len(d), sum(d)) for n, d in groups.items()}


def test_json_document_holds_the_tables_or_why_not():
    from tracestory.render.jsonout import document

    doc = document(analyze_inputs(load_inputs([NSYS_2022])))
    tables = doc["traces"][0]["nsys_tables"]
    assert set(tables) == {"cuda_api_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum", "osrt_sum"}
    assert tables["osrt_sum"] == {"missing": "not in this export: no OSRT_API table (capture with nsys profile "
                                             "--trace=osrt)"}
    ((n, tot),) = _sql(NSYS_2022, "SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    rows = tables["cuda_api_sum"]["rows"]
    assert sum(r["count"] for r in rows) == n and sum(r["total_ns"] for r in rows) == tot


def test_cli_refuses_csv_of_a_table_the_export_lacks(tmp_path):
    env = {"PYTHONPATH": str(REPO / "src")}
    run = subprocess.run([sys.executable, "-m", "tracestory.cli", "analyze", str(NSYS_2022), "--table", "osrt_sum",
                          "--format", "csv", "-o", str(tmp_path / "o.csv")], capture_output=True, text=True,
                         env={**env, "PATH": "/usr/bin:/bin"})
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"tracestory: error: {NSYS_2022}: --table osrt_sum: not in this export: no OSRT_API table "
        "(capture with nsys profile --trace=osrt)"]
    assert not (tmp_path / "o.csv").exists()
    ok = subprocess.run([sys.executable, "-m", "tracestory.cli", "analyze", str(NSYS_2024), "--table", "osrt_sum",
                         "--format", "csv"], capture_output=True, text=True, env={**env, "PATH": "/usr/bin:/bin"})
    assert ok.returncode == 0
    assert ok.stdout.splitlines()[1].startswith("poll,18,500924932,")


def test_a_window_restricts_the_os_runtime_calls_too():
    """--window keeps the calls that overlap it, as for the CUDA API calls (SQL: the same rule)."""
    from tracestory.analysis.window import restrict

    (trace,) = load_nsys_sqlite(NSYS_2024)
    ((lo, hi),) = _sql(NSYS_2024, "SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    mid = (lo + hi) // 2
    ((n,),) = _sql(NSYS_2024, f"SELECT count(*) FROM OSRT_API WHERE eventClass = 27 AND start < {hi} "
                              f"AND (end > {mid} OR (end = start AND start >= {mid}))")
    cut = restrict(trace, mid, hi)
    assert 0 < len(cut.osrt) == n < len(trace.osrt)
    assert int(sum(table("osrt_sum", analyze(cut))["count"])) == n


@pytest.mark.parametrize(("name", "memset", "label"), [
    ("Memcpy HtoD (Pinned -> Device)", False, "[CUDA memcpy Host-to-Device]"),      # nsys SQLite / Kineto
    ("Memcpy UVM DtoH (Managed -> Pageable)", False, "[CUDA memcpy Unified Device-to-Host]"),
    ("Memcpy PtoP (Device -> Device)", False, "[CUDA memcpy Peer-to-Peer]"),
    ("Memcpy (CopyHostToDevice)", False, "[CUDA memcpy CopyHostToDevice]"),           # rocprof: its own words
    ("Memset (Device)", True, "[CUDA memset]"),
])
def test_operation_labels(name, memset, label):
    from tracestory.analysis.nsys_tables import operation

    assert operation(name, memset) == label


def test_calls_of_a_process_without_gpu_work_are_counted_in_the_note(tmp_path):
    """A built two-process export (rows written by hand from docs/FORMATS.md): process 100 runs
    the kernel, process 300 (a launcher) only makes OS runtime and CUDA API calls. The trace is
    process 100's; nsys stats would also count process 300's 2 OSRT calls and 1 API call."""
    vm = 1 << 56

    def gtid(pid, tid):
        return vm | (pid << 24) | tid

    con = sqlite3.connect(tmp_path / "two.sqlite")
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT,
            correlationId INT, globalPid INT, demangledName INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, eventClass INT, globalTid INT,
            correlationId INT, nameId INT);
        CREATE TABLE OSRT_API (start INT, end INT, eventClass INT, globalTid INT, nameId INT);
    """)
    con.executemany("INSERT INTO StringIds VALUES (?, ?)",
                    [(1, "k"), (2, "cudaLaunchKernel_v7000"), (3, "ioctl"), (4, "poll"), (5, "cudaGetDevice")])
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (100, 200, 0, 7, 1, ?, 1)", (vm | (100 << 24),))
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, ?)",
                    [(50, 60, gtid(100, 1), 1, 2), (10, 15, gtid(300, 1), 9, 5)])
    con.executemany("INSERT INTO OSRT_API VALUES (?, ?, ?, ?, ?)",
                    [(20, 50, 27, gtid(100, 1), 3), (0, 0, 31, gtid(100, 1), 3),     # a call and a start mark
                     (5, 500, 27, gtid(300, 1), 4), (600, 700, 27, gtid(300, 1), 4)])
    con.commit()
    con.close()
    (trace,) = load_nsys_sqlite(tmp_path / "two.sqlite")
    assert trace.meta.extra["calls_in_other_processes"] == {"CUPTI_ACTIVITY_KIND_RUNTIME": 1, "OSRT_API": 2}
    a = analyze(trace)
    osrt, api = table("osrt_sum", a), table("cuda_api_sum", a)
    assert osrt.rows() == [("ioctl", 1, 30, 1.0, 30.0, 30.0, 30, 30, 0.0)]
    assert api.rows() == [("cudaLaunchKernel", 1, 10, 1.0, 10.0, 10.0, 10, 10, 0.0)]
    assert osrt.note == ("this process only: 2 more OSRT_API calls of processes with no GPU activity are in the "
                         "export (nsys stats counts them)")
    assert api.note.startswith("this process only: 1 more CUPTI_ACTIVITY_KIND_RUNTIME calls")
