"""Small SQLite databases BUILT here (not captured) from the documented schema
(../shared/design/FORMATS.md): a 2021-era export (no metadata table, device properties in
TARGET_INFO_CUDA_GPU, eventClass 67 backtrace duplicates, no mangledName) and a two-process
report. Expected values are written by hand next to the rows."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from conftest import NSYS_2022

from tracestory.ingest import nsys_sqlite
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
        "NVTX_EVENTS": ("start INT, end INT, eventType INT, rangeId INT, category INT, color INT, text TEXT, "
                        "globalTid INT, endGlobalTid INT, textId INT, domainId INT", [
            (80, 300, 59, None, None, None, None, gtid(4242, 7), None, 5, 0),  # registered string (textId)
            (120, None, 34, None, None, None, "mark", gtid(4242, 7), None, None, 0),
            (310, None, 59, None, None, None, "unterminated", gtid(4242, 7), None, None, 0),
        ]),
        "TARGET_INFO_GPU": ("vmId INT, deviceId INT, name TEXT, busLocation TEXT, isDiscrete INT",
                            [(VM, 0, "Tesla V100-SXM2-16GB", "0000:00:1e.0", 1)]),
        # CUPTI device record units: bandwidth kB/s, clock kHz
        "TARGET_INFO_CUDA_GPU": ("deviceId INT, name TEXT, computeCapabilityMajor INT, computeCapabilityMinor INT, "
                                 "numMultiprocessors INT, globalMemorySize INT, globalMemoryBandwidth INT, "
                                 "coreClockRate INT, l2CacheSize INT",
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
        "CUPTI_ACTIVITY_KIND_MEMCPY": ("start INT, end INT, deviceId INT, streamId INT, correlationId INT, "
                                       "globalPid INT, bytes INT, copyKind INT, srcKind INT, dstKind INT",
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
    from tracestory.analyze.links import launch_start_ns

    # correlation id 1 exists in both processes: each kernel links to its own process's call
    assert list(launch_start_ns(t0, t0.kernels)) == [5]
    assert list(launch_start_ns(t1, t1.kernels)) == [7, 35]


def test_chunked_parallel_read_equals_single_read(monkeypatch):
    whole, = load_nsys_sqlite(NSYS_2022)
    monkeypatch.setattr(nsys_sqlite, "_CHUNK_ROWS", 7)  # many chunks, read by the thread pool
    chunked, = load_nsys_sqlite(NSYS_2022)
    for table in ("kernels", "memops", "api", "ranges", "memory"):
        a, b = getattr(whole, table), getattr(chunked, table)
        for c in a.columns:
            if a[c].dtype != object:
                np.testing.assert_array_equal(a[c], b[c], err_msg=f"{table}.{c}")
    assert whole.strings == chunked.strings
