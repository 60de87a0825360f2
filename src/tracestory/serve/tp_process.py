"""The processes of a tensor-parallel server: started by ``tracestory serve --tensor-parallel N``
itself when no torchrun launched it, and ended without the interpreter's teardown on CUDA.

Why: a Ctrl-C typed at ``torchrun ... serve`` reaches torchrun, whose own handler raises
``SignalException``, prints a traceback and exits 1 whatever its ranks do (torch 2.11-2.13). A
``tracestory serve --tensor-parallel N`` typed without torchrun therefore starts ``python -m
torch.distributed.run`` in a session of its own and sends the stop signals to the ranks only
(:func:`launch`), as ``tracestory capture --load`` does; the ranks stop, torchrun exits 0, so does
this process. And a CUDA rank ends with ``os._exit`` once its last line is written
(:func:`finish_process`): tearing down NCCL communicators that CUDA graphs captured did not
return within 20 s on two H100s.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence

from ..capture.under_load import stop_process_group, stop_torchrun_ranks
from .tensor_parallel import SAFE_NCCL_ENV

LAUNCH_GRACE_S = 60.0    # the self-launched ranks' time to stop after SIGINT (then SIGTERM, SIGKILL)


def launch(n: int, serve_args: Sequence[str]) -> int:
    """``tracestory serve --tensor-parallel N`` typed without torchrun: start ``python -m
    torch.distributed.run --nproc_per_node=N -m tracestory.cli serve ARGS`` in its own session and
    wait for it. A Ctrl-C (SIGINT) or SIGTERM here goes to the ranks, never to the launcher
    (:func:`tracestory.capture.under_load.stop_torchrun_ranks`): rank 0 stops serving and tells
    the others, every rank exits 0, and the launcher with them, so this exits 0. (A Ctrl-C typed
    at ``torchrun ... serve`` itself reaches torchrun, which prints a ``SignalException``
    traceback and exits 1 whatever its ranks do; that is torchrun's own handler.) Returns the
    launcher's exit code."""
    import subprocess

    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "-m", "tracestory.cli", "serve",
           *serve_args]
    env = {**os.environ, **{k: v for k, v in SAFE_NCCL_ENV.items() if k not in os.environ}}
    heard: list[int] = []
    saved = {sig: signal.signal(sig, lambda signum, _f: heard.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        while proc.poll() is None:
            if heard:
                if stop_torchrun_ranks(proc, LAUNCH_GRACE_S) is None or proc.poll() is None:
                    stop_process_group(proc, LAUNCH_GRACE_S)
                break
            time.sleep(0.1)
        return proc.wait()
    finally:
        for sig, h in saved.items():
            signal.signal(sig, h)


def finish_process(code: int = 0) -> None:
    """End a rank of ``torchrun ... serve --tensor-parallel N`` that used CUDA with ``os._exit``
    after flushing: the interpreter's teardown of NCCL communicators and of CUDA graphs that
    captured collectives has nothing left to do and can block the rank (and so torchrun). Under
    ``tracestory capture`` the capture runner does this itself once the trace is written."""
    if os.environ.get("TRACESTORY_CAPTURE_RUNNER"):
        return
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
