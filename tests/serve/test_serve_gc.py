"""Python GC and GPU time per iteration in the event log, and the heap frozen after start-up.

Second sources: hand-fed collector callbacks with times written down here (GcClock); the fake
models time their own ``gc.collect()`` with ``time.monotonic_ns`` and the test keeps the
collector's automatic passes off, so the only collections are the ones the test forces; the
gpu_ns a fake launch reports is a constant written here."""

from __future__ import annotations

import gc
import json
import time

import pytest

from tracestory.serve import gcwatch
from tracestory.serve.engine import Engine
from tracestory.serve.eventlog import EventLog
from tracestory.serve.gcwatch import GcClock
from tracestory.serve.scheduler import Scheduler, SchedulerConfig


def test_gc_clock_charges_collections_that_end_in_the_window():
    now = [0]
    c = GcClock(lambda: now[0])
    assert c.take(0, 100) == {}  # not installed: not measured
    c.install()
    try:
        for t0, t1, gen in ((5, 8, 0), (20, 50, 2), (60, 61, 1), (95, 130, 0)):
            now[0] = t0
            c._callback("start", {"generation": gen})
            now[0] = t1
            c._callback("stop", {"generation": gen})
        # window [10, 100]: (5,8) ended before it (dropped); (20,50) 30 ns gen 2, (60,61) 1 ns gen 1;
        # (95,130) ends later: kept for the next window
        assert c.take(10, 100) == {"gc_ns": 31, "gc_passes": 2, "gc_generation": 2}
        # next window [100, 200]: (95,130) straddled the boundary: charged whole (35 ns) to it
        assert c.take(100, 200) == {"gc_ns": 35, "gc_passes": 1, "gc_generation": 0}
        assert c.take(200, 300) == {"gc_ns": 0, "gc_passes": 0}
    finally:
        c.remove()
    assert c._callback not in gc.callbacks


class _StepModel:
    """A step()-only model: token 7 for every sampling member; iteration ``collect_at`` forces a
    full collection and times it."""

    def __init__(self, collect_at: int):
        self.collect_at, self.collect_ns = collect_at, None

    def step(self, members, iteration=None):
        if iteration == self.collect_at:
            t = time.monotonic_ns()
            gc.collect()
            self.collect_ns = time.monotonic_ns() - t
        return {m.request_id: 7 for m in members if m.samples}

    def memory(self):
        return None


class _FakeLaunch:
    def __init__(self, sampled):
        self._sampled, self.gpu_ns = sampled, 1234

    def result(self):
        return self._sampled


class _LaunchModel(_StepModel):
    """The same with launch(): the engine overlaps; each launch says gpu_ns = 1234."""

    def launch(self, members, iteration=None, token_ids=None):
        return _FakeLaunch(self.step(members, iteration))


def _run_engine(tmp_path, model, n_req=2, max_new=4, on_token=None):
    path = tmp_path / "log.jsonl"
    sched = Scheduler(SchedulerConfig(block_size=4, num_blocks=32, max_batch_tokens=64, max_num_seqs=4))
    eng = Engine(sched, model, EventLog(path, {"model": "fake"}))
    done = []
    was = gc.isenabled()
    gc.disable()  # only the forced collection may run (explicit collect still calls back)
    try:
        eng.start()
        for i in range(n_req):
            eng.submit(f"r{i}", [1, 2, 3], max_new, True,
                       lambda kind, p: done.append(p) if kind == "finish" else on_token and on_token())
        deadline = time.monotonic() + 20
        while len(done) < n_req and time.monotonic() < deadline:
            time.sleep(0.01)
        eng.stop()
    finally:
        if was:
            gc.enable()
    eng.log.close()
    assert len(done) == n_req
    return [json.loads(x) for x in path.read_text().splitlines() if '"iteration"' in x[:30]]


@pytest.mark.parametrize("model_cls", [_StepModel, _LaunchModel])
def test_engine_charges_a_forced_collection_to_its_iteration(tmp_path, model_cls):
    model = model_cls(collect_at=2)
    its = _run_engine(tmp_path, model)
    assert len(its) >= 4 and model.collect_ns is not None
    by = {x["iter"]: x for x in its}
    # step(): iteration 2's forward runs in its own wall time; launch() (overlapped): iteration 2
    # is launched while iteration 1 runs, inside 1's wall time (t_start_ns of 2 = t_end_ns of 1)
    at = 2 if model_cls is _StepModel else 1
    forced = by[at]
    assert forced["gc_passes"] == 1 and forced["gc_generation"] == 2
    assert 0 < forced["gc_ns"] <= model.collect_ns  # timed inside the model's own gc.collect()
    for x in its:
        if x["iter"] != at:
            assert x["gc_ns"] == 0 and x["gc_passes"] == 0 and "gc_generation" not in x
        if model_cls is _LaunchModel:
            assert x["gpu_ns"] == 1234
        else:
            assert "gpu_ns" not in x  # not measured: left out, never 0


def test_paged_llama_on_cpu_writes_no_gpu_ns(tmp_path):
    import torch

    from tracestory.models.llama_config import LlamaConfig
    from tracestory.serve.model import PagedLlama

    m = PagedLlama(LlamaConfig.from_name("tiny"), layers=1, num_blocks=32, block_size=4, dtype=torch.float32)
    its = _run_engine(tmp_path, m, n_req=1, max_new=2)
    assert its and all("gpu_ns" not in x and x["gc_passes"] == 0 for x in its)


def test_heap_frozen_once_after_startup(tmp_path, monkeypatch):
    from tracestory.serve import ServeOptions, model, start_server_thread

    order = []
    prepare, freeze = model.PagedLlama.prepare, gc.freeze

    def spy_prepare(self, **kw):
        order.append("prepare")
        return prepare(self, **kw)

    def spy_freeze():
        order.append("freeze")
        freeze()

    monkeypatch.setattr(model.PagedLlama, "prepare", spy_prepare)
    monkeypatch.setattr(gcwatch.gc, "freeze", spy_freeze)
    log = tmp_path / "serve.jsonl"
    try:
        h = start_server_thread(ServeOptions(port=0, num_blocks=16, block_size=4, event_log=str(log)))
        try:
            assert order == ["prepare", "freeze"]
            frozen = gc.get_freeze_count()
            assert frozen > 0
        finally:
            h.stop()
        meta = json.loads(log.read_text().splitlines()[0])
        assert meta["startup"]["gc_frozen_objects"] > 0
        import sys

        assert meta["startup"]["switch_interval_ms"] == pytest.approx(sys.getswitchinterval() * 1e3)
        assert gc.isenabled()  # frozen, not disabled
    finally:
        gc.unfreeze()  # the test process keeps collecting what it froze


def test_run_server_sets_a_1_ms_switch_interval_in_its_process(monkeypatch):
    """benchmarks/gil_handoff.py: a busy HTTP thread holds the engine up to the switch interval."""
    import sys

    import tracestory.serve as serve

    seen = []

    class Built(Exception):
        pass

    def fake_build(opts, prepare_hook=None):
        seen.append(sys.getswitchinterval())
        raise Built

    saved = sys.getswitchinterval()
    monkeypatch.setattr(serve, "build_server", fake_build)
    try:
        with pytest.raises(Built):
            serve.run_server(serve.ServeOptions(port=0))
    finally:
        sys.setswitchinterval(saved)
    assert seen == [pytest.approx(0.001)]


def test_gc_clock_summary_counts_per_generation():
    now = [0]
    c = GcClock(lambda: now[0])
    assert c.summary() == "Python GC: no collection"
    c.install()
    try:
        for t0, t1, gen in ((0, 1_000_000, 0), (2_000_000, 2_500_000, 0), (3_000_000, 43_000_000, 2)):
            now[0] = t0
            c._callback("start", {"generation": gen})
            now[0] = t1
            c._callback("stop", {"generation": gen})
    finally:
        c.remove()
    # gen 0: 1 ms + 0.5 ms, longest 1 ms; gen 2: one of 40 ms
    assert c.summary() == (
        "Python GC: generation 0: 2 (1.5 ms, longest 1.00 ms); generation 2: 1 (40.0 ms, longest 40.00 ms)"
    )


class _SlowResultModel(_LaunchModel):
    """launch() whose result() takes 30 ms at iteration 2: the engine's wait for the tokens."""

    def launch(self, members, iteration=None, token_ids=None):
        out = super().launch(members, iteration, token_ids)
        if iteration == 2:
            inner = out.result

            def slow():
                time.sleep(0.03)
                return inner()

            out.result = slow
        return out


def test_the_wait_for_the_tokens_is_logged_per_iteration(tmp_path):
    its = _run_engine(tmp_path, _SlowResultModel(collect_at=-1))
    by = {x["iter"]: x for x in its}
    assert 30e6 <= by[2]["result_wait_ns"] <= by[2]["forward_ns"]
    assert all(x["result_wait_ns"] < 30e6 for x in its if x["iter"] != 2)


def test_an_iterations_host_parts_are_disjoint_and_name_a_slow_hand_out(tmp_path):
    """With overlap, iteration N's wall time holds N+1's handout_before_ns, drain_ns, schedule_ns
    and launch_ns and N's result_wait_ns (engine docstring): their sum never exceeds it. A client
    queue that takes 40 ms for one token (the 3rd handed out) shows as one handout_before_ns of at
    least 40 ms, inside the wall time of the iteration it delayed."""
    calls = []

    def slow_third():
        calls.append(1)
        if len(calls) == 3:
            time.sleep(0.04)

    its = _run_engine(tmp_path, _LaunchModel(collect_at=-1), n_req=1, max_new=8, on_token=slow_third)
    by = {x["iter"]: x for x in its}
    checked = 0
    for n, x in by.items():
        nxt = by.get(n + 1)
        if nxt is None or "handout_before_ns" not in nxt:
            continue
        parts = (nxt["handout_before_ns"] + nxt["drain_ns"] + nxt["schedule_ns"] + nxt["launch_ns"]
                 + x["result_wait_ns"])
        assert parts <= x["t_end_ns"] - x["t_start_ns"], (n, parts, x)
        checked += 1
    assert checked >= 4
    slow = [x for x in its if x.get("handout_before_ns", 0) >= 40e6]
    assert len(slow) == 1
    delayed = by[slow[0]["iter"] - 1]
    assert delayed["t_end_ns"] - delayed["t_start_ns"] >= 40e6
