"""The per-trace shared arrays (analysis/derived.py): computed once per Trace object, read-only,
gone with their trace, and a second load analysed in the same process gives the same results.
The launch join is checked against a direct SQL join of the 2024.5 nsys fixture (kernel ->
runtime call with the same correlationId)."""

from __future__ import annotations

import gc
import sqlite3

import numpy as np
import pytest
from conftest import NSYS_2024

from tracestory.analysis import analyze, derived, links
from tracestory.analysis.facts import facts_for
from tracestory.ingest import load_inputs


def _load():
    return load_inputs([NSYS_2024]).traces[0]


def test_launch_index_matches_a_sql_join_and_is_computed_once():
    trace = _load()
    con = sqlite3.connect(NSYS_2024)
    # each kernel's launch call: its start, by the kernel's start order (rows are in start order)
    want = con.execute("SELECT r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                       "ON r.correlationId = k.correlationId ORDER BY k.start, k.rowid").fetchall()
    con.close()
    rows = links.launch_index(trace, trace.kernels)
    order = np.argsort(trace.kernels["start_ns"], kind="stable")
    got = np.where(rows >= 0, trace.api["start_ns"][np.maximum(rows, 0)], -1)[order]
    assert got.tolist() == [-1 if s is None else s for s, in want]
    assert links.launch_index(trace, trace.kernels) is rows   # the kept array, not a new one
    assert links.gpu_ops_launch_index(trace)[: len(rows)].tolist() == rows.tolist()


def test_shared_arrays_are_read_only():
    trace = _load()
    for arr in (*links.gpu_busy(trace), *links.gpu_ops_times(trace), links.gpu_ops_launch_index(trace),
                links.gpu_ops_column(trace, "name"), links.launch_index(trace, trace.memops)):
        with pytest.raises(ValueError):
            arr[:1] = 0
    # the trace's own columns stay writable (only the derived arrays were frozen)
    assert trace.kernels["start_ns"].flags.writeable


def test_entries_die_with_their_trace():
    gc.collect()
    before = derived.cached_traces()
    trace = _load()
    facts_for(analyze(trace))
    assert derived.cached_traces() == before + 1
    del trace
    gc.collect()
    assert derived.cached_traces() == before


def test_a_second_load_gives_the_same_results():
    first = facts_for(analyze(_load()))
    second = facts_for(analyze(_load()))
    assert first.analysis.timeline == second.analysis.timeline
    assert first.exposure == second.exposure
    for a, b in ((first.idle.start_ns, second.idle.start_ns), (first.idle.after, second.idle.after),
                 (first.gpu_ops.launch_end_ns, second.gpu_ops.launch_end_ns)):
        assert np.array_equal(a, b)
