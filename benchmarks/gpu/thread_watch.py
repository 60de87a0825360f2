"""What the serving engine's threads are doing in the kernel while a host step stalls.

Model: ``serve/stackwatch.py`` (``TRACESTORY_STALL_STACKS_MS=N``) writes, per rank, the process id
and the native id of the thread that launches iterations (``stall_stacks.rankR.tid``). This
sampler, a process of its own that needs no GIL of theirs, reads ``/proc/PID/task/TID/stat``
(state) and ``/proc/PID/task/TID/syscall`` (the system call it sleeps in, with its first two
arguments) of each such thread every ``--period-ms``, and writes every *episode* -- a run of
samples with the same state and system call -- that lasted at least ``--min-ms``, on the
monotonic clock the event log and the stack dumps use. A stalled launch then reads as one of:

* ``R`` (runnable): the thread is on a CPU (e.g. spinning in the driver) or waiting for one; the
  first line of each thread gives its CPU affinity (``cpus_allowed``) to tell these apart;
* ``S``/``D`` in ``futex`` on one address: waiting for a lock (the GIL, or a lock in torch/NCCL);
* ``S``/``D`` in ``ioctl`` (fd, request): inside the GPU driver;
* anything else by its number (x86-64 numbering; :data:`SYSCALLS` names the common ones).

The sampler also writes its own late wake-ups (``"label": "sampler"``, a gap over
``--late-ms``): if the sampler is late in the same windows, the whole host paused, not one thread.

Limits: a sample is a snapshot, so episodes shorter than two periods are blurred; reading
another process's ``syscall`` file needs ptrace rights (same user, no Yama restriction), else
only the state is kept (``"syscall": "unreadable"``); x86-64 system call numbers.

Usage: python benchmarks/gpu/thread_watch.py DIR --seconds S [--period-ms 1] [--min-ms 3]
       [--late-ms 3] --out FILE.jsonl
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import signal
import time

SYSCALLS = {0: "read", 1: "write", 7: "poll", 16: "ioctl", 23: "select", 24: "sched_yield",
            35: "nanosleep", 44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg",
            202: "futex", 230: "clock_nanosleep", 232: "epoll_wait", 270: "pselect6",
            271: "ppoll", 281: "epoll_pwait", 441: "epoll_pwait2", 9: "mmap", 11: "munmap",
            10: "mprotect", 28: "madvise"}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def allowed_cpus(pid: int, tid: int) -> str:
    """The thread's CPU affinity (``Cpus_allowed_list``), '' when unreadable: a runnable thread
    confined to busy CPUs also shows as R without progress."""
    for line in (_read(f"/proc/{pid}/task/{tid}/status") or "").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return ""


def sample(pid: int, tid: int) -> tuple | None:
    """``(state, syscall-name, arg0, arg1)`` of one thread now; None when it is gone. State R is
    the kernel's "runnable": on a CPU, or waiting for one."""
    stat = _read(f"/proc/{pid}/task/{tid}/stat")
    if stat is None:
        return None
    state = stat.rsplit(")", 1)[1].split()[0]
    if state == "R":
        return ("R", "", "", "")
    sc = _read(f"/proc/{pid}/task/{tid}/syscall")
    if sc is None:
        return (state, "unreadable", "", "")
    parts = sc.split()
    if not parts or parts[0] == "running":
        return ("R", "", "", "")
    nr = int(parts[0])
    if nr < 0:
        return (state, "none", "", "")
    return (state, SYSCALLS.get(nr, str(nr)), parts[1] if len(parts) > 1 else "",
            parts[2] if len(parts) > 2 else "")


def _threads(folder: str) -> dict[str, tuple[int, int]]:
    out = {}
    for p in glob.glob(os.path.join(folder, "stall_stacks.*.tid")):
        label = os.path.basename(p)[len("stall_stacks."):-len(".tid")]
        text = _read(p)
        if text and len(text.split()) == 2:
            out[label] = tuple(int(v) for v in text.split())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--period-ms", type=float, default=1.0)
    ap.add_argument("--min-ms", type=float, default=3.0)
    ap.add_argument("--late-ms", type=float, default=3.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    period, min_ns, late_ns = a.period_ms / 1e3, a.min_ms * 1e6, a.late_ms * 1e6
    end = time.monotonic() + a.seconds
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))   # kill: end early, still summed up
    watched: dict[str, tuple[int, int]] = {}
    open_ep: dict[str, tuple[tuple, int]] = {}     # label -> (key, first sample ns)
    totals: dict[tuple, list] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    next_scan, last = 0.0, None
    with open(a.out, "w") as out:
        def close(label: str, key: tuple, t0: int, t1: int) -> None:
            ms = (t1 - t0) / 1e6
            if t1 - t0 >= min_ns:
                out.write(json.dumps({"label": label, "t0_mono_ns": t0, "ms": round(ms, 2), "state": key[0],
                                      "syscall": key[1], "arg0": key[2], "arg1": key[3]}) + "\n")
                tot = totals[(label,) + key[:2]]
                tot[0] += 1
                tot[1] += ms
                tot[2] = max(tot[2], ms)

        while time.monotonic() < end and not stop:
            now = time.monotonic_ns()
            if last is not None and now - last > late_ns + period * 1e9:
                out.write(json.dumps({"label": "sampler", "t0_mono_ns": last, "ms": round((now - last) / 1e6, 2)}) + "\n")
                tot = totals[("sampler", "late", "")]
                tot[0] += 1
                tot[1] += (now - last) / 1e6
                tot[2] = max(tot[2], (now - last) / 1e6)
            last = now
            if now / 1e9 >= next_scan:
                for label, (pid, tid) in _threads(a.folder).items():
                    if watched.get(label) != (pid, tid):
                        out.write(json.dumps({"label": label, "pid": pid, "tid": tid,
                                              "cpus_allowed": allowed_cpus(pid, tid)}) + "\n")
                        watched[label] = (pid, tid)
                next_scan = now / 1e9 + 0.5
            for label, (pid, tid) in list(watched.items()):
                key = sample(pid, tid)
                prev = open_ep.get(label)
                if key is None:
                    watched.pop(label)
                    if prev:
                        close(label, prev[0], prev[1], now)
                        open_ep.pop(label)
                    continue
                if prev is None or prev[0] != key:
                    if prev is not None:
                        close(label, prev[0], prev[1], now)
                    open_ep[label] = (key, now)
            time.sleep(period)
        now = time.monotonic_ns()
        for label, (key, t0) in open_ep.items():
            close(label, key, t0, now)
    for k, (n, ms, mx) in sorted(totals.items()):
        print(f"{' '.join(x for x in k if x)}: {n} episodes, {ms:.0f} ms in all, longest {mx:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
