"""tracestory.region: listeners, nesting, decorator use, torch record_function, no torch import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tracestory.capture import region as region_mod
from tracestory.capture.region import region


class Recorder:
    def __init__(self):
        self.events = []

    def on_enter(self, name):
        self.events.append(("enter", name))

    def on_exit(self, name):
        self.events.append(("exit", name))


@pytest.fixture
def rec():
    r = Recorder()
    region_mod.add_listener(r)
    yield r
    region_mod.remove_listener(r)


def test_context_manager_and_decorator_notify_in_order(rec):
    @region("inner")
    def f(x):
        return x + 1

    with region("outer"):
        assert f(1) == 2
        assert f(2) == 3
    assert rec.events == [("enter", "outer"), ("enter", "inner"), ("exit", "inner"),
                          ("enter", "inner"), ("exit", "inner"), ("exit", "outer")]


def test_exit_runs_on_exception(rec):
    with pytest.raises(KeyError):
        with region("boom"):
            raise KeyError("x")
    assert rec.events == [("enter", "boom"), ("exit", "boom")]


def test_same_object_reentrant_nesting(rec):
    r = region("again")
    with r:
        with r:
            pass
    assert rec.events == [("enter", "again")] * 2 + [("exit", "again")] * 2


def test_removed_listener_is_silent():
    r = Recorder()
    region_mod.add_listener(r)
    region_mod.remove_listener(r)
    region_mod.remove_listener(r)  # twice: no error
    with region("x"):
        pass
    assert r.events == []


def test_rejects_empty_name():
    with pytest.raises(ValueError):
        region("")


def test_marking_does_not_import_torch():
    code = ("import sys\nfrom tracestory.capture.region import region\n"
            "with region('x'):\n    pass\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_record_function_only_while_profiling(tmp_path):
    import torch  # a test requirement (pip install torch==2.13.0, CPU build)
    from torch.profiler import ProfilerActivity, profile

    with region("before"):  # no profiler: nothing to record, must not fail
        pass
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with region("marked"):
            torch.ones(4).sum()
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    names = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert names == ["marked"]
