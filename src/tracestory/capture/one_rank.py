"""``python -m tracestory.capture.one_rank --rank R PROFILER ARGS... -- PYTHON_ARGS``: one rank
of a torchrun job under a profiler, the others plain.

``capture ncu --torchrun N --profile-rank R`` launches ``torchrun --nproc_per_node=N -m
tracestory.capture.one_rank --rank R ncu ... -- -m tracestory.capture.runner ...``. torchrun
starts this module once per rank; each process replaces itself (``exec``, same pid, so
torchrun, the capture's stop and the rank's status file see the same process) with

* rank R (``RANK`` from torchrun): ``PROFILER ARGS... <this python> PYTHON_ARGS``;
* every other rank: ``<this python> PYTHON_ARGS``.

Why: ncu replays every kernel it profiles (and serialises the launches). With every rank under
ncu, a replayed NCCL kernel on one rank waits for peers that are not replaying it, and a
serving capture never reached its kernels (docs/CAPTURE.md). With one rank under ncu and its
NCCL kernels left out of the profiled set, the other ranks simply wait in their collectives
while that rank's kernels are replayed.

Limits: the rank is torchrun's global ``RANK`` (one node in practice); the profiler must be on
PATH on every node that runs rank R; the first ``--`` ends the profiler's words (ncu's own
options never hold a bare ``--``).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Sequence

USAGE = "python -m tracestory.capture.one_rank --rank R PROFILER [ARGS...] -- PYTHON_ARGS..."


def split_argv(argv: Sequence[str]) -> tuple[int, list[str], list[str]]:
    """``(rank, profiler argv, python args)`` from this module's arguments; ValueError (one
    line) when they do not have the shape of :data:`USAGE`."""
    words = list(argv)
    if len(words) < 2 or words[0] != "--rank":
        raise ValueError(f"expected {USAGE}, found {' '.join(words[:3]) or 'nothing'}")
    try:
        rank = int(words[1])
    except ValueError:
        raise ValueError(f"--rank: expected an integer, found {words[1]!r}") from None
    rest = words[2:]
    if "--" not in rest:
        raise ValueError(f"expected `--` between the profiler's words and the python arguments ({USAGE})")
    cut = rest.index("--")
    profiler, inner = rest[:cut], rest[cut + 1:]
    if not profiler or not inner:
        raise ValueError(f"expected a profiler command and python arguments around `--` ({USAGE})")
    return rank, profiler, inner


def command_for(rank: int, this_rank: int, profiler: Sequence[str], inner: Sequence[str],
                python: str = sys.executable) -> list[str]:
    """The command that rank ``this_rank`` becomes."""
    plain = [python, *inner]
    return [*profiler, *plain] if this_rank == rank else plain


def main(argv: Sequence[str] | None = None) -> int:
    try:
        rank, profiler, inner = split_argv(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        print(f"tracestory.capture.one_rank: {e}", file=sys.stderr)
        return 2
    raw = os.environ.get("RANK")
    if raw is None or not raw.strip().isdigit():
        print(f"tracestory.capture.one_rank: expected RANK=<integer> from torchrun in the environment, "
              f"found {raw!r}", file=sys.stderr)
        return 2
    cmd = command_for(rank, int(raw), profiler, inner)
    exe = shutil.which(cmd[0])
    if exe is None:
        print(f"tracestory.capture.one_rank: {cmd[0]}: expected a program on PATH, found none", file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, cmd)
    return 0   # not reached


if __name__ == "__main__":
    sys.exit(main())
