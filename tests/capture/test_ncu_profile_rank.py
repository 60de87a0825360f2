"""``capture ncu --torchrun N --profile-rank R``: ncu wraps one rank only, NCCL kernels never
profiled there. The argv written out by hand; the NCCL-free kernel filter checked with Python's
``re`` (the look-aheads mean the same in ECMAScript, ncu's syntax) on kernel names as ncu shows
them; and whole captures on the CPU with the real torchrun and a stand-in ``ncu`` on PATH that
runs its program as a child, as ncu does (and ignores SIGINT itself, so the stop must reach
the program)."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest

from conftest import free_port
from tracestory.capture import one_rank, pipeline
from tracestory.capture.ncu import without_nccl
from tracestory.cli import main
from tracestory.errors import UsageError


@pytest.fixture(autouse=True)
def clean(clean_cwd, monkeypatch):
    # an empty folder, no TRACESTORY_* variables; torchrun's rendezvous on a port of its own (other
    # test runs may hold the default 29500)
    monkeypatch.setenv("PET_MASTER_PORT", str(free_port()))


SERVE = ["tracestory", "serve", "--tensor-parallel", "2", "--device", "cuda", "--port", "8000"]


def test_plan_wraps_one_rank_and_keeps_nccl_out():
    p = pipeline.plan("ncu", SERVE, {"torchrun": 2, "profile_rank": 1, "load": "--model tiny --port 8000",
                                     "range": "iteration", "skip": 30, "launch_count": 20})
    server = next(s for s in p.steps if s.role == "server")
    assert list(server.shown) == [
        "torchrun", "--nproc_per_node=2", "-m", "tracestory.capture.one_rank", "--rank", "1",
        "ncu", "--force-overwrite", "--target-processes", "all", "--set", "full", "--launch-count", "20",
        "--kernel-name", "regex:^(?!.*nccl).*", "--profile-from-start", "off", "--clock-control", "none",
        "--export", "artifacts/serve/ncu/serve", "--",
        "-m", "tracestory.capture.runner", "--out-dir", "artifacts/serve/ncu", "--profiler-api",
        "--range", "iteration", "--skip", "30",
        "--", "-m", "tracestory.cli", "serve", "--tensor-parallel", "2", "--device", "cuda", "--port", "8000"]
    assert p.invocation[3:7] == ("--torchrun", "2", "--range", "iteration")
    assert "--profile-rank" in p.invocation and p.invocation[p.invocation.index("--profile-rank") + 1] == "1"


def test_plan_with_kernel_name_and_a_script():
    p = pipeline.plan("ncu", ["python", "w.py", "--x", "1"],
                      {"torchrun": 4, "profile_rank": 0, "kernel_name": "regex:gemm|flash"})
    prof = list(p.steps[0].shown)
    assert prof[:6] == ["torchrun", "--nproc_per_node=4", "-m", "tracestory.capture.one_rank", "--rank", "0"]
    assert prof[prof.index("--kernel-name") + 1] == "regex:^(?!.*nccl)(?=.*(?:gemm|flash)).*"
    assert prof[prof.index("--") + 1:] == ["w.py", "--x", "1"]


NAMES = {   # kernel names as ncu's default (function) base shows them in a TP serving run
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL": False,
    "ncclKernel_AllGather_RING_LL_Sum_int8_t": False,
    "void at::native::elementwise_kernel<128, 2>(int, T1)": True,
    "nvjet_qqtst_128x256_64x4_2x1_v_bz_coopA_TNT": True,
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop": True,
    "_rms_norm_quant_kernel": True,
}


def _ncu_matches(filt: str, name: str) -> bool:
    assert filt.startswith("regex:")
    return re.search(filt[len("regex:"):], name) is not None


def test_nccl_free_filter_on_kernel_names():
    every = without_nccl(None)
    assert {n: _ncu_matches(every, n) for n in NAMES} == NAMES
    some = without_nccl("nvjet|flash")
    assert [n for n in NAMES if _ncu_matches(some, n)] == [
        "nvjet_qqtst_128x256_64x4_2x1_v_bz_coopA_TNT", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop"]
    # a user's filter that names NCCL still cannot pick a collective on the profiled rank
    assert not _ncu_matches(without_nccl("regex:ncclDevKernel|nvjet"), "ncclDevKernel_AllReduce_Sum_bf16_RING_LL")


@pytest.mark.parametrize("flags, expected", [
    ({"profile_rank": 0}, "option --profile-rank: expected --torchrun N beside it"),
    ({"profile_rank": 2, "torchrun": 2}, "option --profile-rank: expected a rank from 0 to 1 (--torchrun 2), found 2"),
    ({"profile_rank": -1, "torchrun": 2}, "option --profile-rank: expected a rank from 0 to 1 (--torchrun 2), found -1"),
])
def test_profile_rank_refused_without_a_rank_to_profile(flags, expected):
    with pytest.raises(UsageError, match=re.escape(expected)):
        pipeline.plan("ncu", ["python", "w.py"], flags)


def test_profile_rank_is_an_ncu_option_only(capsys):
    with pytest.raises(SystemExit):
        main(["capture", "torch", "--torchrun", "2", "--profile-rank", "0", "--", "python", "w.py"])
    assert "unrecognized arguments: --profile-rank" in capsys.readouterr().err


def test_one_rank_words():
    assert one_rank.split_argv(["--rank", "1", "ncu", "--set", "full", "--", "-m", "m", "--", "a"]) == (
        1, ["ncu", "--set", "full"], ["-m", "m", "--", "a"])
    assert one_rank.command_for(1, 1, ["ncu", "-x"], ["w.py"], python="py") == ["ncu", "-x", "py", "w.py"]
    assert one_rank.command_for(1, 0, ["ncu", "-x"], ["w.py"], python="py") == ["py", "w.py"]
    for bad in (["ncu", "--", "w.py"], ["--rank", "x", "ncu", "--", "w.py"], ["--rank", "0", "ncu", "w.py"],
                ["--rank", "0", "--", "w.py"]):
        with pytest.raises(ValueError):
            one_rank.split_argv(bad)


def test_one_rank_without_rank_in_environment(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    assert one_rank.main(["--rank", "0", "ncu", "--", "w.py"]) == 2
    assert "expected RANK=<integer> from torchrun" in capsys.readouterr().err


# ---------------------------------------------------------------- whole captures, stand-in ncu
FAKE_NCU = r'''#!{py}
import json, os, signal, subprocess, sys
a = sys.argv[1:]
if "--import" in a:
    print("ID,Kernel Name\n0,fake_kernel" if a[a.index("--page") + 1] == "raw" else "details")
    sys.exit(0)
i = a.index("--export")
out, program = a[i + 1], a[i + 2:]
with open(os.environ["FAKE_NCU_LOG"], "a") as f:
    f.write(json.dumps({{"rank": os.environ.get("RANK"), "pid": os.getpid(), "options": a[:i + 2],
                        "program": program}}) + "\n")
child = subprocess.Popen(program, env={{**os.environ, "UNDER_FAKE_NCU": "1"}})
signal.signal(signal.SIGINT, signal.SIG_IGN)   # the program gets the stop; the profiler waits for it
code = child.wait()
open(out + ".ncu-rep", "wb").write(b"x" * 321)
sys.exit(code)
'''

# a rank: says whether it runs under the stand-in ncu; with a port, rank 0 answers GET /health
# and every rank runs until SIGINT (exit 0), as `tracestory serve --tensor-parallel` does
RANK_SCRIPT = r'''
import json, os, signal, sys, threading
from http.server import BaseHTTPRequestHandler, HTTPServer
rank = int(os.environ["RANK"])
with open(f"rank{rank}.seen.json", "w") as f:
    json.dump({"under_ncu": os.environ.get("UNDER_FAKE_NCU") == "1", "pid": os.getpid(),
               "ppid": os.getppid()}, f)
port = int(sys.argv[1]) if len(sys.argv) > 1 else None
if port is None:
    sys.exit(0)
stop = threading.Event()
signal.signal(signal.SIGINT, lambda *a: stop.set())
if rank == 0:
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *a):
            pass
    srv = HTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
stop.wait(90)
sys.exit(0 if stop.is_set() else 5)
'''


def _install_fake_ncu(tmp_path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ncu = bin_dir / "ncu"
    ncu.write_text(FAKE_NCU.format(py=sys.executable))
    ncu.chmod(ncu.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "ncu_calls.jsonl"
    monkeypatch.setenv("FAKE_NCU_LOG", str(log))
    return log


def _seen(tmp_path, rank):
    return json.loads((tmp_path / f"rank{rank}.seen.json").read_text())


def test_capture_profiles_only_the_chosen_rank(tmp_path, monkeypatch):
    log = _install_fake_ncu(tmp_path, monkeypatch)
    (tmp_path / "w.py").write_text(RANK_SCRIPT)
    rc = main(["capture", "ncu", "--name", "k", "--torchrun", "2", "--profile-rank", "1", "--",
               sys.executable, "w.py"])
    assert rc == 0
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(c["rank"], c["program"]) for c in calls] == [("1", [sys.executable, "w.py"])]
    assert calls[0]["options"][calls[0]["options"].index("--kernel-name") + 1] == "regex:^(?!.*nccl).*"
    assert (_seen(tmp_path, 0)["under_ncu"], _seen(tmp_path, 1)["under_ncu"]) == (False, True)
    assert _seen(tmp_path, 1)["ppid"] == calls[0]["pid"]     # the rank's program is ncu's child
    folder = tmp_path / "artifacts" / "k"
    assert sorted(p.name for p in (folder / "ncu").iterdir()) == ["k.ncu-rep", "k_details.csv", "k_raw.csv"]
    cap = json.loads((folder / "manifest.json").read_text())["captures"][-1]
    assert cap["status"] == "complete"
    assert cap["settings"]["profile_rank"] == {"value": 1, "source": "flag"}


def test_server_capture_stops_the_profiled_rank_through_ncu(tmp_path, monkeypatch):
    """Under --load the stop goes to the ranks; the profiled rank is ncu's child (the stand-in
    ignores SIGINT itself, as a profiler that waits for its program does): it stops, ncu writes
    its report and exits 0, torchrun exits 0, the capture ends complete."""
    log = _install_fake_ncu(tmp_path, monkeypatch)
    (tmp_path / "w.py").write_text(RANK_SCRIPT)
    port = free_port()
    load = f"{sys.executable} -c pass --port {port}"
    rc = main(["capture", "ncu", "--name", "s", "--torchrun", "2", "--profile-rank", "0", "--load", load,
               "--health-timeout", "60", "--stop-timeout", "20", "--", sys.executable, "w.py", str(port)])
    cap = json.loads((tmp_path / "artifacts" / "s" / "manifest.json").read_text())["captures"][-1]
    assert rc == 0, cap
    server = cap["steps"][0]
    assert (server["stop_signal"], server["stopped"], server["exit_code"]) == ("SIGINT", "ranks", 0)
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert [c["rank"] for c in calls] == ["0"]
    assert (_seen(tmp_path, 0)["under_ncu"], _seen(tmp_path, 1)["under_ncu"]) == (True, False)
    assert [s["name"] for s in cap["steps"]] == ["ncu-profile", "health", "load", "ncu-csv-raw", "ncu-csv-details"]
    assert cap["status"] == "complete"
    assert (tmp_path / "artifacts" / "s" / "ncu" / "s.ncu-rep").stat().st_size == 321


def test_dry_run_shows_the_wrapped_rank(capsys):
    rc = main(["capture", "ncu", "--torchrun", "2", "--profile-rank", "0", "--launch-count", "5", "--dry-run",
               "--", "python", "w.py"])
    assert rc == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("torchrun --nproc_per_node=2 -m tracestory.capture.one_rank --rank 0 ncu "
                          "--force-overwrite --target-processes all --set full --launch-count 5 "
                          "--kernel-name 'regex:^(?!.*nccl).*' --clock-control none --export artifacts/w/ncu/w "
                          "-- w.py")



def test_stop_targets_the_program_below_ncu_wrappers(monkeypatch):
    """The process tree `ps --forest` showed under torchrun on the H100 (ncu 2025.3.1, call 1 of
    session 9): the profiled rank is a shell script running ncu's binary, which runs
    TreeLauncherSubreaper, which runs the rank's python; the plain rank is python itself."""
    from tracestory.capture import under_load

    nc = "/opt/nvidia/nsight-compute/2025.3.1"
    table = {
        1575: (1390, ["/opt/torch/.venv/bin/python", "/opt/torch/.venv/bin/torchrun", "--nproc_per_node=2"]),
        1652: (1575, ["/bin/sh", f"{nc}/ncu", "--force-overwrite"]),
        1669: (1652, [f"{nc}/target/linux-desktop-glibc_2_11_3-x64/ncu", "--force-overwrite"]),
        1673: (1669, [f"{nc}/target/linux-desktop-glibc_2_11_3-x64/./TreeLauncherSubreaper", "-m", "x"]),
        1677: (1673, ["/opt/torch/.venv/bin/python", "-m", "tracestory.capture.runner"]),
        1653: (1575, ["/opt/torch/.venv/bin/python", "-m", "tracestory.capture.runner"]),
        1700: (1653, ["/opt/torch/.venv/bin/python", "-c", "compile worker"]),
    }
    monkeypatch.setattr(under_load, "_proc_table", lambda: table)
    assert under_load.torchrun_ranks(1575) == [1653, 1677]
