"""The critical path on hand-built traces: each expected tiling worked out by hand (times in us,
written as ns * 1000) in the comments."""

from __future__ import annotations

from tracestory.analysis.categories import classify, taxonomy
from tracestory.analysis.critical_path import critical_path
from tracestory.trace import StringPool, TraceMeta, build_trace, make_table

US = 1000
K = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_TNT"


def _trace(kernels, api):
    """kernels: (start_us, end_us, stream, correlation); api: (name, start_us, end_us, correlation)."""
    pool = StringPool()
    kt = make_table("kernels", start_ns=[a * US for a, *_ in kernels], end_ns=[b * US for _, b, *_ in kernels],
                    stream=[r[2] for r in kernels], correlation=[r[3] for r in kernels], device=[0] * len(kernels),
                    name=pool.encode([K] * len(kernels)))
    at = make_table("api", name=pool.encode([r[0] for r in api]), start_ns=[r[1] * US for r in api],
                    end_ns=[r[2] * US for r in api], correlation=[r[3] for r in api], tid=[1] * len(api),
                    pid=[1] * len(api))
    return build_trace(TraceMeta(source_path="hand.json", source_format="kineto"), pool, kernels=kt, api=at)


def _path(t):
    cp = critical_path(t, classify(t, taxonomy("llm")))
    return cp, {label: ns // US for label, ns in cp.by_label if ns}


def test_back_to_back_kernels_are_gpu_bound():
    # Launched at 0, 1, 2 us; kernels 5-105, 105-205, 205-305 on one stream: the window starts at
    # 5, every stretch is kernel time.
    t = _trace([(5, 105, 7, 1), (105, 205, 7, 2), (205, 305, 7, 3)],
               [("cudaLaunchKernel", 0, 1, 1), ("cudaLaunchKernel", 1, 2, 2), ("cudaLaunchKernel", 2, 3, 3)])
    cp, parts = _path(t)
    assert (cp.start_ns, cp.end_ns) == (5 * US, 305 * US) and parts == {"gpu": 300} and cp.dominant == "gpu"


def test_host_gaps_between_launches_are_host_bound():
    # Launch calls 0-10, 50-60, 100-110; kernels 12-15, 62-65, 112-115. From 115 back: kernel 3,
    # then 112 <- its launch at 100 (launch 12), host 60-100 (40), the second launch call 50-60
    # (launch 10), host from the window start 12 to 50 (38). 3 + 22 + 78 = 103 = 115 - 12.
    t = _trace([(12, 15, 7, 1), (62, 65, 7, 2), (112, 115, 7, 3)],
               [("cudaLaunchKernel", 0, 10, 1), ("cudaLaunchKernel", 50, 60, 2), ("cudaLaunchKernel", 100, 110, 3)])
    cp, parts = _path(t)
    assert parts == {"gpu": 3, "launch": 22, "host": 78} and cp.dominant == "host"


def test_synchronize_jumps_back_to_the_gpu_work_it_waited_for():
    # K0 10-1010 launched 0-5; cudaDeviceSynchronize 6-1015; K1 1030-1040 launched 1020-1025.
    # From 1040: K1 10, launch 1020-1030 (10), host 1015-1020 (5), sync 1010-1015 (5), K0 1000.
    t = _trace([(10, 1010, 7, 1), (1030, 1040, 7, 3)],
               [("cudaLaunchKernel", 0, 5, 1), ("cudaDeviceSynchronize", 6, 1015, 2), ("cudaLaunchKernel", 1020, 1025, 3)])
    cp, parts = _path(t)
    assert parts == {"gpu": 1010, "launch": 10, "host": 5, "sync": 5} and cp.dominant == "gpu"


def test_unexplained_wait_is_named():
    # K_a 10-20 (stream 1, launched 0-5); K_b launched 6-9 on stream 2 starts only at 400: ready at
    # 20 (K_a's end, the latest of the candidates), so 20-400 is a wait the trace does not explain.
    t = _trace([(10, 20, 1, 1), (400, 410, 2, 2)], [("cudaLaunchKernel", 0, 5, 1), ("cudaLaunchKernel", 6, 9, 2)])
    cp, parts = _path(t)
    assert parts == {"gpu": 20, "wait": 380} and cp.dominant == "wait"


def test_the_walk_is_bounded_on_big_steps(monkeypatch):
    """Above MAX_EVENTS GPU ops the path is walked over the last MAX_EVENTS GPU ops of the median step
    only, and the scope says so (real H200 trace; the bound lowered to 10 so its decode steps exceed it)."""
    from conftest import H200_LLAMA

    from tracestory.analysis import analyze, critical_path as cp_module
    from tracestory.ingest.kineto import load_kineto

    a = analyze(load_kineto(H200_LLAMA))
    monkeypatch.setattr(cp_module, "MAX_EVENTS", 10)
    path, scope = cp_module.step_critical_path(a.trace, a.classification, a.phases)
    assert scope.startswith("the median step (") and scope.endswith("its last 10 GPU ops")
    steps = sorted([p for p in a.phases.phases if p.gpu_span_ns], key=lambda p: p.gpu_span_ns)
    mid = steps[len(steps) // 2]
    k = a.trace.kernels
    inside = (k["start_ns"] >= mid.gpu_start_ns) & (k["end_ns"] <= mid.gpu_end_ns)
    ends = sorted(k["end_ns"][inside].tolist() + a.trace.memops["end_ns"][
        (a.trace.memops["start_ns"] >= mid.gpu_start_ns) & (a.trace.memops["end_ns"] <= mid.gpu_end_ns)].tolist())
    assert len(ends) > 10 and path.start_ns >= ends[-10] and path.end_ns == ends[-1]


def test_a_window_reads_the_ops_that_ended_before_it():
    # Window 100-300 us. Stream 1: A 50-90 (before the window), B 120-200 (launched 60-62). Stream 2:
    # 10-20, 30-40, 60-95, all before the window; stream 3: 0-5. B is ready at the latest of its
    # stream predecessor's end (A, 90), the latest end on its device before 120 (the stream-2 op, 95)
    # and its launch call's start (60): 95, so 95-120 (25 us > 20 us) is a wait, then the walk reaches
    # the window's start. The rows before the window must be found for that answer (without them:
    # ready at the launch, 62-120 a wait of 58).
    t = _trace([(0, 5, 3, 1), (10, 20, 2, 2), (30, 40, 2, 3), (50, 90, 1, 4), (60, 95, 2, 5), (120, 200, 1, 6)],
               [("cudaLaunchKernel", -10, -9, 1), ("cudaLaunchKernel", 1, 2, 2), ("cudaLaunchKernel", 21, 22, 3),
                ("cudaLaunchKernel", 41, 42, 4), ("cudaLaunchKernel", 55, 56, 5), ("cudaLaunchKernel", 60, 62, 6)])
    cp = critical_path(t, classify(t, taxonomy("llm")), (100 * US, 300 * US))
    parts = {label: ns // US for label, ns in cp.by_label if ns}
    assert (cp.start_ns, cp.end_ns, cp.gpu_ops_on_path) == (100 * US, 200 * US, 2) and parts == {"gpu": 80, "wait": 25}
