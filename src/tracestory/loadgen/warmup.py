"""The warm-up load run: a shorter run before the measured one, kept out of its numbers.

Why: the first requests a server answers pay one-time costs (CUDA graph capture, compilation,
autotuning, allocator growth, connection set-up) that a measured run should not average in.
The capture runbook runs a warm-up load first and keeps its result apart; so does ``tracestory
load --warmup-run``.

Model: the warm-up is the same :class:`~tracestory.loadgen.config.LoadConfig` (server, model,
endpoint, rate, burstiness, concurrency, dataset, prompt and output lengths, timeouts, SLOs) with
its own stop rule, ``--warmup-requests N`` and/or ``--warmup-duration S`` (either alone; with
neither, :data:`DEFAULT_WARMUP_REQUESTS` requests), and its own random draws (``--seed`` +
:data:`WARMUP_DRAW_OFFSET`): its prompts differ from the measured run's, so a server with a
prefix cache has not seen the measured prompts before they are sent. The warm-up's records are
summarized into a result JSON of the same shape as the measured one (``run_kind: "warmup"``)
and never enter the measured result, which names the warm-up file and its counts under
``warmup``.

Limits: one warm-up run, sent right before the measured one; a warm-up shorter than the
server's warm-up needs (a graph per batch-size bucket not reached at the warm-up's rate) leaves
the rest of that cost in the measured run.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from ..errors import UsageError
from .config import LoadConfig

DEFAULT_WARMUP_REQUESTS = 16
WARMUP_DRAW_OFFSET = 1_000_003


def warmup_config(cfg: LoadConfig, requests: int | None, duration_s: float | None) -> LoadConfig:
    """The measured run's settings with the warm-up's stop rule and random draws (see the module docstring)."""
    if requests is not None and not (isinstance(requests, int) and requests >= 1):
        raise UsageError(f"--warmup-requests: expected a whole number of requests >= 1, found {requests}")
    if duration_s is not None and not (duration_s > 0 and math.isfinite(duration_s)):
        raise UsageError(f"--warmup-duration: expected a number of seconds > 0, found {duration_s}")
    if requests is None and duration_s is None:
        requests = DEFAULT_WARMUP_REQUESTS
    ramp = {}
    if cfg.ramp_up_strategy is not None:   # the warm-up runs at the ramp's first rate, without a ramp
        ramp = {"ramp_up_strategy": None, "ramp_up_start_rps": None, "ramp_up_end_rps": None,
                "request_rate": cfg.ramp_up_start_rps or math.inf}
    return replace(cfg, num_requests=requests, duration_s=duration_s, seed=cfg.seed + WARMUP_DRAW_OFFSET, **ramp)


def warmup_result_path(main: Path) -> Path:
    """``results/run.json`` -> ``results/run.warmup.json``."""
    return main.with_name(main.name.removesuffix(".json") + ".warmup.json")


def warmup_note(res: dict, path: Path | None) -> dict:
    """What the measured result says of the warm-up before it."""
    return {"file": str(path) if path is not None else None, "completed": res["completed"], "failed": res["failed"],
            "not_sent": res.get("not_sent"), "duration": res["duration"]}
