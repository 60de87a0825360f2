"""Where does the host's periodic hold-up come from: the process, the CPU or the GPU driver?

The serving runs of docs/BENCHMARKS.md ("Serving under load") show iterations over 3x the median
in clusters about 1.5 s apart on the 4-GPU machines, where the engine's host thread itself is slow
(hand-out, plan send), uncorrelated with the load. This script runs small probes side by side, each
in its own process, each a tight loop that times its own turns and records every turn longer than
``--threshold-ms`` with its wall clock:

* ``busy``: pure Python, no torch (about 20 us of arithmetic a turn): preemption of a running thread;
* ``sleep``: ``time.sleep(0.001)`` a turn, no torch: the wake-up latency of a waiting thread;
* ``cuda``: one 1-element add on the GPU and ``torch.cuda.synchronize()`` a turn: the launch and
  completion path through the driver;
* ``smi`` (phase 2 only): ``nvidia-smi --query-gpu=...`` every ``--smi-period`` s, timed: a driver
  query as monitoring agents make them.

Phase 1 runs busy, sleep and cuda for ``--seconds``; phase 2 (``--smi-seconds`` > 0) runs cuda beside
our own nvidia-smi loop: if a driver query holds the launch path, the cuda probe's long turns of
phase 2 line up with the queries. Per probe: turns, p50/p99/max turn, the long turns, their groups
(long turns closer than 0.3 s form one group) and the intervals between group starts, and how many
of the cuda probe's long turns lie within 20 ms of a long turn of busy or sleep.

Limits: wall-clock times on a shared machine; a probe sees hold-ups of its own process and core,
not the serving engine's; an agent outside this container (the host's own monitoring) is invisible
except through its effects.

Usage: python3 benchmarks/gpu/stall_probe.py [--seconds 20] [--smi-seconds 10] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GROUP_GAP_S = 0.3
NEAR_S = 0.02


def probe(kind: str, seconds: float, threshold_ms: float, start_at: float, device: int) -> dict:
    """One probe's loop (module docstring); returns its turns' summary and long turns."""
    step = None
    if kind == "cuda":
        import torch

        x = torch.zeros(1, device=f"cuda:{device}")
        torch.cuda.synchronize(device)

        def step():
            x.add_(1.0)
            torch.cuda.synchronize(device)
    elif kind == "sleep":

        def step():
            time.sleep(0.001)
    else:

        def step():
            s = 0
            for i in range(400):
                s += i * i
            return s

    while time.time() < start_at:
        time.sleep(0.001)
    turns, long_turns = [], []
    t_end = time.perf_counter() + seconds
    prev = time.perf_counter()
    while prev < t_end:
        step()
        now = time.perf_counter()
        dt = (now - prev) * 1e3
        turns.append(dt)
        if dt > threshold_ms:
            long_turns.append([round(time.time() - start_at, 4), round(dt, 3)])
        prev = now
    turns.sort()
    return {
        "kind": kind,
        "turns": len(turns),
        "p50_ms": round(turns[len(turns) // 2], 4),
        "p99_ms": round(turns[int(len(turns) * 0.99)], 4),
        "max_ms": round(turns[-1], 3),
        "long": long_turns,
    }


def smi_loop(seconds: float, period: float, start_at: float) -> dict:
    """nvidia-smi queries every ``period`` s, each timed (the ``smi`` probe)."""
    while time.time() < start_at:
        time.sleep(0.001)
    calls = []
    t_end = time.time() + seconds
    while time.time() < t_end:
        t0 = time.time()
        subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu,power.draw,clocks.sm,temperature.gpu", "--format=csv,noheader"],
            capture_output=True,
            check=False,
        )
        calls.append([round(t0 - start_at, 4), round((time.time() - t0) * 1e3, 1)])
        time.sleep(max(0.0, period - (time.time() - t0)))
    return {"kind": "smi", "calls": calls}


def groups(times: list[float]) -> dict:
    """Long turns closer than GROUP_GAP_S in one group: the groups' starts and the intervals."""
    ts = sorted(times)
    starts = [t for i, t in enumerate(ts) if i == 0 or t - ts[i - 1] > GROUP_GAP_S]
    iv = [round(b - a, 2) for a, b in zip(starts, starts[1:], strict=False)]
    return {
        "groups": len(starts),
        "starts_s": [round(s, 2) for s in starts],
        "intervals_s": iv,
        "interval_p50_s": sorted(iv)[len(iv) // 2] if iv else None,
    }


def near(a: list[float], b: list[float]) -> int:
    """How many times of ``a`` lie within NEAR_S of some time of ``b``."""
    return sum(1 for t in a if any(abs(t - u) <= NEAR_S for u in b))


def run_phase(kinds: list[str], seconds: float, args) -> dict[str, dict]:
    start_at = time.time() + 3.0  # time for the cuda probe's process to import torch
    procs = {
        k: subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--probe",
                k,
                "--seconds",
                str(seconds),
                "--threshold-ms",
                str(args.threshold_ms),
                "--start-at",
                str(start_at),
                "--device",
                str(args.device),
                "--smi-period",
                str(args.smi_period),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in kinds
    }
    out = {}
    for k, p in procs.items():
        text, _ = p.communicate()
        out[k] = json.loads(text) if p.returncode == 0 and text.strip() else {"kind": k, "error": p.returncode}
    for r in out.values():
        if "long" in r:
            r["long_groups"] = groups([t for t, _ in r["long"]])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--smi-seconds", type=float, default=10.0)
    ap.add_argument("--smi-period", type=float, default=0.5)
    ap.add_argument("--threshold-ms", type=float, default=2.0)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe == "smi":
        print(json.dumps(smi_loop(args.seconds, args.smi_period, args.start_at)))
        return 0
    if args.probe:
        print(json.dumps(probe(args.probe, args.seconds, args.threshold_ms, args.start_at, args.device)))
        return 0
    res = {"host": os.uname().nodename, "nproc": os.cpu_count(), "threshold_ms": args.threshold_ms}
    p1 = run_phase(["busy", "sleep", "cuda"], args.seconds, args)
    cuda_t = [t for t, _ in p1["cuda"].get("long", [])]
    cpu_t = [t for k in ("busy", "sleep") for t, _ in p1[k].get("long", [])]
    p1["cuda_long_near_cpu_long"] = near(cuda_t, cpu_t)
    res["phase1"] = p1
    if args.smi_seconds > 0:
        p2 = run_phase(["cuda", "smi"], args.smi_seconds, args)
        smi_t = [t for t, _ in p2["smi"].get("calls", [])]
        c2 = [t for t, _ in p2["cuda"].get("long", [])]
        # a query's own time is its length: a cuda turn held by it starts before the query ends
        p2["cuda_long_near_smi"] = sum(
            1 for t in c2 if any(-NEAR_S <= t - u <= ms / 1e3 + NEAR_S for u, ms in p2["smi"].get("calls", []))
        )
        p2["smi_calls"] = len(smi_t)
        res["phase2"] = p2
    line = {
        k: {kk: v.get(kk) for kk in ("turns", "p50_ms", "p99_ms", "max_ms")}
        | {"long": len(v.get("long", [])), "interval_p50_s": v.get("long_groups", {}).get("interval_p50_s")}
        for k, v in res["phase1"].items()
        if isinstance(v, dict)
    }
    print("phase 1:", json.dumps(line))
    print("cuda long turns near busy/sleep long turns:", p1["cuda_long_near_cpu_long"], "of", len(cuda_t))
    if "phase2" in res:
        c = res["phase2"]["cuda"]
        smi_max = max([ms for _, ms in res["phase2"]["smi"].get("calls", [])] or [0])
        print(
            f"phase 2 (nvidia-smi every {args.smi_period:.1f} s): cuda long turns {len(c.get('long', []))}, "
            f"near a query {res['phase2']['cuda_long_near_smi']}; smi calls {res['phase2']['smi_calls']}, "
            f"max {smi_max:.0f} ms"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
