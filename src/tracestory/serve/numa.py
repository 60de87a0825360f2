"""The serving process out of the kernel's automatic NUMA balancing (Linux).

The model. With ``/proc/sys/kernel/numa_balancing`` on (the default on a machine of several NUMA
nodes), the kernel samples where a process's memory is used: about once a second (the scan
period adapts, 1 s at least) a thread of the process, on its way back from the kernel, marks a
window of its address space inaccessible, and the next touches of those pages fault so the kernel
can move them to the node that touches them. The marking and the faults run on the process's own
threads, while the engine's host thread is between two launches. The kernel scans only memory
whose policy allows migration on fault: the default policy (memory on the node that first touches
it) does; an explicit policy set with ``set_mempolicy`` (here ``MPOL_LOCAL``: the same placement,
memory on the allocating thread's node) does not, so a thread with that policy never scans.

:func:`exempt` gives the calling thread that policy; threads it starts later inherit it, so the
server calls it first (before torch starts its threads). Memory placement is unchanged for new
allocations; pages already placed stay where they are (no migration, which a GPU server does not
need: its hot data lives on the GPU).

Limits: Linux only (``set_mempolicy`` by syscall number, x86_64 and aarch64); threads started
before the call keep the default policy; whether the balancing's scans are what holds a given
engine up is measured, not assumed (docs/BENCHMARKS.md, "Serving under load").
``TRACESTORY_NUMA_LOCAL=0`` leaves the policy alone (A/B).
"""

from __future__ import annotations

import ctypes
import os
import platform

from ..models.switches import env_on

ENV = "TRACESTORY_NUMA_LOCAL"
BALANCING = "/proc/sys/kernel/numa_balancing"
MPOL_LOCAL = 4
SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}
_done: dict = {}          # what exempt() did in this process (the start-up record's fields)


def balancing() -> str | None:
    """The kernel's ``numa_balancing`` setting (``"0"`` off, ``"1"`` on, ...), None where unreadable."""
    try:
        with open(BALANCING) as fh:
            return fh.read().strip()
    except OSError:
        return None


def exempt() -> dict:
    """Set ``MPOL_LOCAL`` on the calling thread where the balancing is on (module docstring).
    Returns what was done, for the start-up record: ``numa_balancing`` (the setting or None) and
    ``numa_policy`` (``local``, or why not: ``off (TRACESTORY_NUMA_LOCAL=0)``, ``not needed``,
    ``unsupported (...)``, ``failed (errno ...)``)."""
    setting = balancing()
    _done.clear()
    _done.update(numa_balancing=setting, numa_policy=_policy(setting))
    return dict(_done)


def done() -> dict:
    """What :func:`exempt` did in this process ({} where it was not called: a server thread)."""
    return dict(_done)


def _policy(setting: str | None) -> str:
    if not env_on(ENV):
        return f"off ({ENV}=0)"
    if setting in (None, "0"):
        return "not needed"
    nr = SYS_SET_MEMPOLICY.get(platform.machine())
    if nr is None or os.name != "posix":
        return f"unsupported ({platform.system()} {platform.machine()})"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(nr, MPOL_LOCAL, None, ctypes.c_ulong(0)) != 0:
        return f"failed (errno {ctypes.get_errno()})"
    return "local"
