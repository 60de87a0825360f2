"""serve.numa: the serving process's memory policy against the kernel's NUMA balancing. The
policy actually set is read back with the ``get_mempolicy`` syscall (a second source), then reset
to the default so the test leaves the thread as it found it."""

from __future__ import annotations

import ctypes
import platform

import pytest

from tracestory.serve import numa

GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236}
MPOL_DEFAULT = 0


def _mode() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    mode = ctypes.c_int(-1)
    assert libc.syscall(GET_MEMPOLICY[platform.machine()], ctypes.byref(mode), None, ctypes.c_ulong(0),
                        None, ctypes.c_ulong(0)) == 0, ctypes.get_errno()
    return mode.value


def _reset() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(numa.SYS_SET_MEMPOLICY[platform.machine()], MPOL_DEFAULT, None, ctypes.c_ulong(0)) == 0


def _setting(tmp_path, monkeypatch, value: str | None):
    f = tmp_path / "numa_balancing"
    if value is not None:
        f.write_text(value + "\n")
    monkeypatch.setattr(numa, "BALANCING", str(f))


needs_linux = pytest.mark.skipif(platform.system() != "Linux" or platform.machine() not in GET_MEMPOLICY,
                                 reason="set_mempolicy/get_mempolicy: Linux x86_64/aarch64 only")


@needs_linux
def test_balancing_on_sets_the_local_policy(tmp_path, monkeypatch):
    _setting(tmp_path, monkeypatch, "1")
    monkeypatch.delenv(numa.ENV, raising=False)
    assert _mode() == MPOL_DEFAULT
    try:
        got = numa.exempt()
        assert got == {"numa_balancing": "1", "numa_policy": "local"} == numa.done()
        assert _mode() == numa.MPOL_LOCAL == 4      # linux/mempolicy.h: MPOL_LOCAL is 4
    finally:
        _reset()
    assert _mode() == MPOL_DEFAULT


@needs_linux
@pytest.mark.parametrize(("value", "env", "policy"), [("0", None, "not needed"), (None, None, "not needed"),
                                                      ("1", "0", "off (TRACESTORY_NUMA_LOCAL=0)")])
def test_the_policy_is_left_alone(tmp_path, monkeypatch, value, env, policy):
    _setting(tmp_path, monkeypatch, value)
    if env is None:
        monkeypatch.delenv(numa.ENV, raising=False)
    else:
        monkeypatch.setenv(numa.ENV, env)
    assert numa.exempt() == {"numa_balancing": value, "numa_policy": policy}
    assert _mode() == MPOL_DEFAULT
