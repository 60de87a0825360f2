"""serve.stackwatch: a host step that outlasts the limit gets every thread's stack written while
it is stalled; a quick one writes nothing; unset, nothing is armed or written."""

from __future__ import annotations

import os
import threading
import time

from tracestory.serve.stackwatch import DIR_ENV, ENV, StackWatch


def _stalled_step_waiting_in_sleep():
    time.sleep(0.25)


def test_a_stalled_step_leaves_its_stack_and_a_quick_one_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "50")
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    w = StackWatch.from_env("rank0")
    assert w.path == str(tmp_path / "stall_stacks.rank0.txt")
    w.arm()
    w.done("a quick step")                    # microseconds: cancelled before 50 ms
    w.arm()
    _stalled_step_waiting_in_sleep()          # 250 ms: the stacks are written at 50 ms
    w.done("hand-out of iteration 7")
    w.close()
    text = (tmp_path / "stall_stacks.rank0.txt").read_text()
    assert w.dumps == 1 and "a quick step" not in text
    # the dump names the function the watched thread is in, then our line follows it
    stack, tail = text.split("^ hand-out of iteration 7: ")
    assert "Thread MainThread (the watched step):" in stack
    assert "in _stalled_step_waiting_in_sleep" in stack.split("(the watched step):")[1]
    ms = float(tail.split(" ms")[0])
    assert 240 <= ms < 5000
    taken = float(tail.split("stacks taken at ")[1].split(" ms")[0])
    assert 50 <= taken < 240            # while the step was stalled (the sleep releases the GIL)
    assert ", asked for at 50 ms; started at monotonic " in tail
    # the watched thread is named for a sampler outside the process: this process, this thread
    pid, tid = (tmp_path / "stall_stacks.rank0.tid").read_text().split()
    assert (int(pid), int(tid)) == (os.getpid(), threading.get_native_id())


def test_off_when_unset(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    w = StackWatch.from_env("rank0")
    w.arm()
    time.sleep(0.01)
    w.done("step")
    w.close()
    assert w.path is None and w.dumps == 0 and list(tmp_path.iterdir()) == []
    assert not any(t.name == "tracestory-stackwatch" for t in threading.enumerate())
