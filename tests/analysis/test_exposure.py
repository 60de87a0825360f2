"""Exposed time and overlap-aware ceilings on hand-built timelines (values worked out by hand)."""

from __future__ import annotations

from tracestory.analysis.categories import classify, taxonomy
from tracestory.analysis.exposure import exposure
from tracestory.trace import StringPool, TraceMeta, build_trace, make_table

GEMM = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COPY = "Memcpy DtoD (Device -> Device)"


def _trace(kernels, memops=()):
    """(name, start, end, stream) rows on device 0."""
    pool = StringPool()
    cols = {}
    for kind, rows in (("kernels", kernels), ("memops", memops)):
        cols[kind] = make_table(kind, start_ns=[r[1] for r in rows], end_ns=[r[2] for r in rows],
                                name=pool.encode([r[0] for r in rows]), stream=[r[3] for r in rows],
                                device=[0] * len(rows))
    return build_trace(TraceMeta(source_path="hand.json", source_format="kineto"), pool, **cols)


def test_overlapped_communication_has_a_small_exposed_ceiling():
    # stream 7: GEMMs 0-100 and 120-200; stream 9: all-reduce 10-110 (overlapped 10-100, exposed 100-110).
    # Busy union 0-110 + 120-200 = 190. Summed kernel time 100 + 80 + 100 = 280: all-reduce 100/280 = 36%,
    # a summed-time Amdahl ceiling of 1.56x; exposed all-reduce 10 ns -> ceiling 190 / 180 = 1.056x.
    t = _trace([(GEMM, 0, 100, 7), (GEMM, 120, 200, 7), (ALLREDUCE, 10, 110, 9)])
    x = exposure(t, classify(t, taxonomy("llm")))
    assert x.busy_ns == 190
    comm = x.get("communication")
    assert (comm.busy_ns, comm.exposed_ns, comm.overlapped_ns) == (100, 10, 90)
    assert abs(comm.exposed_ceiling - 190 / 180) < 1e-12
    gemm = x.get("gemm")
    # GEMM busy 180, exposed where no all-reduce runs: 0-10 and 120-200 = 90.
    assert (gemm.busy_ns, gemm.exposed_ns) == (180, 90)
    assert x.comm_category == "communication"
    assert (x.comm_busy_ns, x.comm_overlapped_ns) == (100, 90) and x.comm_overlap_fraction == 0.9


def test_copies_under_communication_are_not_compute_overlap():
    # The all-reduce 0-100 runs beside a device copy 0-50 only: no compute overlaps it.
    t = _trace([(ALLREDUCE, 0, 100, 9)], [(COPY, 0, 50, 3)])
    x = exposure(t, classify(t, taxonomy("llm")))
    assert x.comm_overlapped_ns == 0 and x.get("communication").exposed_ns == 50
    # Alone on the device: exposed == busy, unbounded ceiling.
    only = _trace([(GEMM, 0, 100, 7)])
    g = exposure(only, classify(only, taxonomy("llm"))).get("gemm")
    assert g.exposed_ns == 100 and g.exposed_ceiling is None


def test_an_early_started_kernel_on_the_same_stream_does_not_hide_the_one_it_waits_for():
    # Programmatic dependent launch: on stream 7 the all-reduce is recorded from 60 though the GEMM
    # ahead of it runs to 100; it waits inside itself until then, so it runs 100-150. On stream 9 a
    # second GEMM really runs beside it, 120-140. Busy union 0-150 = 150.
    # GEMM busy 0-100 + 120-140 = 120; exposed: 0-100 (nothing else runs there) = 100.
    # all-reduce busy 100-150 = 50 (not 90), exposed 100-120 + 140-150 = 30, under compute 20.
    t = _trace([(GEMM, 0, 100, 7), (ALLREDUCE, 60, 150, 7), (GEMM, 120, 140, 9)])
    x = exposure(t, classify(t, taxonomy("llm")))
    assert x.busy_ns == 150
    assert (x.get("gemm").busy_ns, x.get("gemm").exposed_ns) == (120, 100)
    comm = x.get("communication")
    assert (comm.busy_ns, comm.exposed_ns, comm.overlapped_ns) == (50, 30, 20)
    assert x.comm_overlapped_ns == 20
