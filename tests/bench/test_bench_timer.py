"""Timer statistics on known samples and the CPU fallback."""

from __future__ import annotations

import pytest

from tracestory.bench import timer


def test_summarize_known_samples():
    s = [10.0, 20.0, 30.0, 40.0, 50.0]
    st = timer.summarize(s, clock="given")
    # by hand: median 30, mean 30, sample std sqrt(250) = 15.811..., numpy linear percentiles:
    # p10 at rank 0.4 -> 14, p25 at rank 1 -> 20, p75 -> 40, p90 at rank 3.6 -> 46
    assert st.n == 5 and st.median_ns == 30.0 and st.mean_ns == 30.0
    assert st.std_ns == pytest.approx(250 ** 0.5)
    assert (st.min_ns, st.max_ns) == (10.0, 50.0)
    assert st.p10_ns == pytest.approx(14.0) and st.p90_ns == pytest.approx(46.0)
    assert st.iqr_ns == pytest.approx(20.0)
    assert st.spread == pytest.approx(32.0 / 30.0)
    assert st.warning is not None and "spread" in st.warning
    assert st.samples_ns == tuple(s)


def test_summarize_tight_samples_no_warning():
    st = timer.summarize([100.0, 101.0, 99.0, 100.0])
    # p10 = 99.3, p90 = 100.7 by hand -> spread 1.4 %
    assert st.spread == pytest.approx(0.014)
    assert st.warning is None
    assert timer.summarize([7.0]).std_ns == 0.0


def test_summarize_empty_raises():
    with pytest.raises(ValueError):
        timer.summarize([])


def test_cpu_fallback_counts_and_budget():
    calls = []
    st = timer.measure(lambda: calls.append(1), warmup_ms=0.0, rep_ms=0.0, min_reps=7, device="cpu")
    assert st.clock == "perf_counter" and st.n == 7
    # 3 estimate calls + 1 warm-up (at least one) + 7 timed
    assert len(calls) == 3 + 1 + 7
    assert all(v >= 0 for v in st.samples_ns)


def test_single_iteration_mode():
    timer.set_single_iteration(True)
    try:
        st = timer.measure(lambda: None, warmup_ms=0.0, rep_ms=5.0, device="cpu")
    finally:
        timer.set_single_iteration(False)
    assert st.n == 1


def test_timed_reps_are_inside_the_region():
    from tracestory.capture import region as reg

    events = []

    class L:
        def on_enter(self, name):
            events.append(("enter", name))

        def on_exit(self, name):
            events.append(("exit", name))

    lst = L()
    reg.add_listener(lst)
    try:
        timer.measure(lambda: None, warmup_ms=0.0, rep_ms=0.0, min_reps=3, device="cpu", region_name="BENCHMARK")
    finally:
        reg.remove_listener(lst)
    assert events == [("enter", "BENCHMARK"), ("exit", "BENCHMARK")]
