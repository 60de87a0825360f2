"""map_ranks: in-process, a spawn process pool and a real dask.distributed LocalCluster on loopback
give the same per-rank results, in rank order, with errors naming the file.

The rank files are copies of the real A100 NCCL fixture (rank 0 of 2) with ``distributedInfo.rank``
rewritten and the first ``2 * r`` kernel events of rank ``r`` dropped, so every rank's result is
different and an ordering mistake shows. Expected numbers come from the JSON we wrote (kernel
event count, ``sum(round(dur * 1000))`` as integer ns), never from tracestory.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from dataclasses import dataclass

import pytest
from conftest import A100_NCCL, H100_BERT, H200_LLAMA

from tracestory.errors import TracestoryError, UsageError
from tracestory.parallel import SMALL_INPUT_BYTES, RankError, map_ranks

RANKS = (2, 0, 3, 1)  # written in this order, with names that do not sort by rank


@dataclass(frozen=True)
class KernelStats:
    """The stand-in per-rank summary: small, picklable, no Trace inside."""

    rank: int | None
    world_size: int | None
    kernels: int
    kernel_dur_ns: int


def kernel_stats(trace) -> KernelStats:
    return KernelStats(trace.meta.rank, trace.meta.world_size, len(trace.kernels), int(trace.kernels.dur_ns.sum()))


def fail_on_rank_3(trace) -> KernelStats:
    if trace.meta.rank == 3:
        raise ValueError("rank 3 is not welcome")
    return kernel_stats(trace)


def die_on_rank_3(trace) -> KernelStats:
    if trace.meta.rank == 3:
        os._exit(3)  # a worker killed mid-task (as by the OOM killer)
    return kernel_stats(trace)


def _plain(x):
    """Dataclasses, tuples and numpy arrays as nested lists/dicts, so results from different
    processes compare with ``==`` (RankSummary holds numpy arrays and compares by identity)."""
    import dataclasses

    import numpy as np

    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _expected_kernels(path) -> int:
    with gzip.open(path, "rt") as f:
        return sum(1 for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel")


def _expected_from_json(doc: dict) -> KernelStats:
    kernels = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    info = doc.get("distributedInfo") or {}
    return KernelStats(info.get("rank"), info.get("world_size"), len(kernels),
                       sum(round(e["dur"] * 1000) for e in kernels))


@pytest.fixture(scope="module")
def rank_folder(tmp_path_factory):
    """Four rank files plus the H200 llama trace (no rank): paths in writing order, and the
    expected results in rank order (rank 0..3, then the rank-less trace)."""
    folder = tmp_path_factory.mktemp("ranks")
    with gzip.open(A100_NCCL, "rt") as f:
        source = json.load(f)
    paths, expected = [], {}
    for r in RANKS:
        events, dropped = [], 0
        for e in source["traceEvents"]:
            if e.get("cat") == "kernel" and dropped < 2 * r:
                dropped += 1
                continue
            events.append(e)
        doc = {**source, "distributedInfo": {**source["distributedInfo"], "rank": r, "world_size": 4},
               "traceEvents": events}
        path = folder / f"worker_{'abcd'[r]}{r * 7 % 4}.json.gz"
        with gzip.open(path, "wt", compresslevel=1) as f:
            json.dump(doc, f)
        paths.append(str(path))
        expected[r] = _expected_from_json(doc)
    with gzip.open(H200_LLAMA, "rt") as f:
        llama = _expected_from_json(json.load(f))
    paths.insert(2, str(H200_LLAMA))
    return paths, [expected[r] for r in sorted(expected)] + [llama]


@pytest.fixture(scope="module")
def nccl_comm_ns(rank_folder):
    """Per rank 0..3: the summed duration of its NCCL kernels, from the JSON we wrote. They all run
    on one stream (stream 40 of the fixture), so the sum is also their union."""
    paths, _ = rank_folder
    out = {}
    for p in paths:
        if p == str(H200_LLAMA):
            continue
        with gzip.open(p, "rt") as f:
            doc = json.load(f)
        nccl = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")]
        assert {e["args"]["stream"] for e in nccl} == {40}
        out[doc["distributedInfo"]["rank"]] = sum(round(e["dur"] * 1000) for e in nccl)
    return [out[r] for r in sorted(out)]


def _backend(mode: str, request) -> dict:
    if mode == "dask":
        return {"dask_address": request.getfixturevalue("cluster").scheduler_address}
    return {"workers": 1 if mode == "inline" else 2}


@pytest.fixture(scope="module")
def bad_folder(rank_folder, tmp_path_factory):
    """The rank files with one cut-off trace among them (a rank killed while writing its JSON,
    before its first event: a cut after complete events is read as a partial trace, see
    tests/ingest/test_kineto_truncated.py), gzip'ed whole. (A gzip stream cut in the middle is not used here: ingest/files.py sizes its
    buffer from the garbage ISIZE trailer of such a file, gigabytes; reported to the lead.)"""
    paths, _ = rank_folder
    bad = tmp_path_factory.mktemp("bad") / "rank_broken.json.gz"
    with gzip.open(paths[0], "rb") as f:
        text = f.read()
    with gzip.open(bad, "wb", compresslevel=1) as f:
        f.write(text[: text.index(b'"traceEvents"')])
    return [paths[0], str(bad), paths[1]], str(bad)


@pytest.fixture(scope="module")
def cluster():
    """A real dask.distributed LocalCluster: 2 single-threaded worker processes on 127.0.0.1 (TCP)."""
    from dask.distributed import LocalCluster

    c = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
    try:
        yield c
    finally:
        c.close()


def test_expected_values_are_distinct(rank_folder):
    _, expected = rank_folder
    assert [e.rank for e in expected] == [0, 1, 2, 3, None]
    assert [e.kernels for e in expected[:4]] == [2700, 2698, 2696, 2694]  # the fixture has 2,700 kernels
    assert len({e.kernel_dur_ns for e in expected}) == 5


def test_in_process_matches_json_in_rank_order(rank_folder):
    paths, expected = rank_folder
    seen = []
    out = map_ranks(paths, kernel_stats, workers=1, progress=lambda d, t: seen.append((d, t)))
    assert out == expected
    assert seen == [(i, len(paths)) for i in range(1, len(paths) + 1)]


def test_process_pool_same_as_in_process(rank_folder):
    paths, expected = rank_folder
    seen = []
    out = map_ranks(paths, kernel_stats, workers=2, progress=lambda d, t: seen.append((d, t)))
    assert out == expected
    assert sorted(seen) == [(i, len(paths)) for i in range(1, len(paths) + 1)]


def test_default_workers_same_results(rank_folder):
    paths, expected = rank_folder
    assert sum(os.path.getsize(p) for p in paths) >= SMALL_INPUT_BYTES  # so the default uses the pool
    assert map_ranks(paths, kernel_stats) == expected


def test_default_reads_small_inputs_in_process():
    small = [str(H200_LLAMA), str(H100_BERT)]
    assert sum(os.path.getsize(p) for p in small) < SMALL_INPUT_BYTES
    # A lambda cannot go to a worker process: it working shows the default stayed in-process.
    # Neither trace has a rank, so the results keep the order of the paths.
    assert map_ranks(small, lambda t: len(t.kernels)) == [_expected_kernels(p) for p in small]


def test_dask_local_cluster_same_as_in_process(rank_folder, cluster):
    paths, expected = rank_folder
    assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
    seen = []
    out = map_ranks(paths, kernel_stats, dask_address=cluster.scheduler_address,
                    progress=lambda d, t: seen.append((d, t)))
    assert out == expected
    assert sorted(seen) == [(i, len(paths)) for i in range(1, len(paths) + 1)]
    # The cluster did the work: its two workers ran the tasks, the client only gathered.
    assert len(cluster.scheduler_info["workers"]) == 2


def test_dask_local_address_starts_and_stops_its_own_cluster(rank_folder):
    paths, expected = rank_folder
    assert map_ranks(paths[:3], kernel_stats, dask_address="local", workers=2) == \
        sorted([e for e in expected if e.rank in (0, 2, None)], key=lambda e: (e.rank is None, e.rank or 0))


@pytest.mark.parametrize("mode", ["inline", "pool", "dask"])
def test_unreadable_file_is_one_line_error_naming_it(bad_folder, mode, request):
    paths, bad = bad_folder
    with pytest.raises(RankError) as info:
        map_ranks(paths, kernel_stats, **_backend(mode, request))
    err = info.value
    assert isinstance(err, TracestoryError)
    assert err.path == bad
    msg = str(err)
    assert msg.startswith(bad + ": ") and msg.count(bad) == 1 and "\n" not in msg
    assert "not JSON" in msg and "truncated" in msg
    assert err.kind == "TraceFormatError"


@pytest.mark.parametrize("mode", ["inline", "pool", "dask"])
def test_error_in_fn_names_the_rank_file(rank_folder, mode, request):
    paths, _ = rank_folder
    rank3 = paths[3]  # RANKS[2] == 3, and the llama path was inserted before it
    with pytest.raises(RankError) as info:
        map_ranks(paths, fail_on_rank_3, **_backend(mode, request))
    assert str(info.value) == f"{rank3}: ValueError: rank 3 is not welcome"
    assert "fail_on_rank_3" in info.value.worker_traceback


def test_worker_that_dies_is_reported_with_the_unfinished_files(rank_folder):
    paths, _ = rank_folder
    with pytest.raises(RankError) as info:
        map_ranks(paths, die_on_rank_3, workers=2)
    msg = str(info.value)
    assert info.value.kind == "BrokenProcessPool"
    assert msg.startswith(info.value.path + ": a worker process died") and "\n" not in msg
    assert paths[3] in msg  # rank 3's file was unfinished when its worker died


def test_missing_file_named(tmp_path):
    missing = str(tmp_path / "rank_7.json.gz")
    with pytest.raises(RankError, match=f"^{missing}: no such file"):
        map_ranks([missing], kernel_stats)


def test_unpicklable_fn_is_a_usage_error_for_the_pool(rank_folder):
    paths, _ = rank_folder
    with pytest.raises(UsageError, match="cannot be sent to worker processes"):
        map_ranks(paths, lambda t: len(t.kernels), workers=2)
    # In-process, a lambda is fine: result per trace, in rank order.
    assert map_ranks(paths[:2], lambda t: t.meta.rank, workers=1) == [0, 2]


def test_dask_missing_is_a_usage_error(rank_folder, monkeypatch):
    paths, _ = rank_folder
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # makes the import fail
    with pytest.raises(UsageError, match=r"pip install tracestory\[dask\]"):
        map_ranks(paths, kernel_stats, dask_address="local")


def test_bad_arguments():
    assert map_ranks([], kernel_stats) == []
    with pytest.raises(UsageError, match="workers must be at least 1, found 0"):
        map_ranks(["x.json"], kernel_stats, workers=0)


def test_rank_error_survives_pickling():
    import pickle

    e = pickle.loads(pickle.dumps(RankError("a.json", "a.json: broken", "TraceFormatError", "tb")))
    assert (e.path, str(e), e.kind, e.worker_traceback) == ("a.json", "a.json: broken", "TraceFormatError", "tb")


@pytest.mark.parametrize("mode", ["pool", "dask"])
def test_rank_sources_and_multigpu_summary_same_as_in_process(rank_folder, nccl_comm_ns, mode, request):
    """The end-to-end path of `tracestory ranks`: rank_sources -> map_ranks(rank_summary) -> combine."""
    from tracestory.analysis.multigpu import combine, rank_summary
    from tracestory.ingest.ranks import rank_sources

    paths, _ = rank_folder
    sources = rank_sources([p for p in paths if p != str(H200_LLAMA)])
    inline = map_ranks(sources, rank_summary, workers=1)
    other = map_ranks(sources, rank_summary, **_backend(mode, request))
    assert [s.rank for s in inline] == [0, 1, 2, 3]
    assert [s.comm_ns for s in inline] == nccl_comm_ns
    assert _plain(other) == _plain(inline)
    a, b = combine(inline), combine(other)
    assert (_plain(a.per_rank), _plain(a.collectives), _plain(a.straggler), _plain(a.alignment)) == \
        (_plain(b.per_rank), _plain(b.collectives), _plain(b.straggler), _plain(b.alignment))


def test_errors_survive_pickling_between_processes():
    import pickle

    from tracestory.errors import ToolNotFound, TraceFormatError

    e = pickle.loads(pickle.dumps(TraceFormatError("r3.json", "a JSON object", "a truncated file")))
    assert (e.path, e.expected, e.found) == ("r3.json", "a JSON object", "a truncated file")
    assert str(e) == "r3.json: expected a JSON object, found a truncated file"
    t = pickle.loads(pickle.dumps(ToolNotFound("nsys", "install Nsight Systems")))
    assert str(t) == "nsys not found: install Nsight Systems"
