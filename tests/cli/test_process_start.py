"""The ``tracestory`` process itself (``tracestory.cli.main``, docs/PERFORMANCE.md "Tiny-trace
analyze"): the analysis commands load numpy's OpenBLAS with one thread unless the user chose a
count, leaving the environment as it was; run as the process's command (``main()``), the
objects alive at exit are frozen out of the garbage collector, and a caller that passes its own
``argv`` keeps its collector. Each case runs in a fresh interpreter (numpy loads OpenBLAS once);
threads are counted from ``/proc/self/task``, the kernel's list, not from numpy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import H100_BERT

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc/self/task")

# Runs a command as the `tracestory` script does (main() of sys.argv) or with argv given; then prints
# the process's threads, what is left of OPENBLAS_NUM_THREADS, and (from an atexit handler that
# runs after main's own) the garbage collector's frozen object count.
CODE = """
import atexit, gc, io, contextlib, json, os, sys
state = {}
atexit.register(lambda: print("STATE", json.dumps({**state, "frozen": gc.get_freeze_count()}), file=sys.stderr))
from tracestory.cli import main
sys.argv = ["tracestory", *ARGV]
with contextlib.redirect_stdout(io.StringIO()):
    try:
        rc = main() if MODE == "script" else main(ARGV)
    except SystemExit as e:   # --version
        rc = e.code
state.update(rc=rc, threads=len(os.listdir("/proc/self/task")), numpy="numpy" in sys.modules,
             var=os.environ.get("OPENBLAS_NUM_THREADS"))
"""


def _run(argv: list[str], mode: str, **env: str) -> dict:
    import json

    code = CODE.replace("ARGV", repr(argv)).replace("MODE", repr(mode))
    e = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                                                           "OMP_NUM_THREADS")}
    e.update(PYTHONPATH=os.pathsep.join(sys.path), **env)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=e)
    assert "STATE " in p.stderr, p.stderr[-2000:]
    return json.loads(p.stderr.rsplit("STATE ", 1)[1])


def test_analyze_loads_openblas_with_one_thread_and_leaves_the_environment_alone():
    s = _run(["analyze", str(H100_BERT)], "script")
    assert s["rc"] == 0 and s["numpy"]
    assert s["threads"] == 1 and s["var"] is None, s   # the main thread only; the variable removed again


def test_a_thread_count_the_user_chose_is_kept():
    cpus = len(os.sched_getaffinity(0))
    s = _run(["analyze", str(H100_BERT)], "script", OPENBLAS_NUM_THREADS="2")
    # OpenBLAS: the main thread and (count - 1) workers, at most one per CPU
    assert s["rc"] == 0 and s["var"] == "2" and s["threads"] == min(2, cpus), s


def test_version_loads_no_numpy():
    s = _run(["--version"], "script")
    assert s["rc"] == 0 and not s["numpy"] and s["threads"] == 1


def test_the_script_freezes_the_collector_at_exit_and_a_caller_with_argv_does_not():
    script = _run(["analyze", str(H100_BERT)], "script")
    called = _run(["analyze", str(H100_BERT)], "argv")
    assert script["rc"] == called["rc"] == 0
    assert script["frozen"] > 10_000, script   # numpy's, rich's and the analysis's objects
    assert called["frozen"] == 0, called
