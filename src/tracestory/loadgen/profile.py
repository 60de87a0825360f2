"""``--profile``: ask the server to start its profiler before the measured run and stop it after.

The endpoints, at the server's root (not under ``/v1``), are the same path on the three
servers we know:

* vLLM: ``POST /start_profile`` and ``POST /stop_profile``, present only when the server was
  started with a profiler folder (``VLLM_TORCH_PROFILER_DIR``; newer releases also take a
  profiler config flag); without it they answer 404. The body is not read.
* SGLang: ``POST /start_profile`` with an optional JSON body (``output_dir``, ``num_steps``,
  ``activities``, ...; ``--profile-body`` sends one) and ``POST /stop_profile``; the folder
  defaults to ``SGLANG_TORCH_PROFILER_DIR``.
* ``tracestory serve --profiler-dir DIR``: torch.profiler over the engine, one Kineto trace
  written into DIR at each stop; its path is in the stop answer.

A start that is not answered 2xx stops the command before any request is sent (one line, exit
2): a run the user asked to profile is not run unprofiled. A stop that fails is reported (the
result is still written, with the failure in its ``profile`` key). Plain ``urllib`` (one call
each, no proxy: the same direct connection as the load's requests), so no event loop is needed
around the run.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass

from ..errors import UsageError

HINT = ("vLLM: start it with VLLM_TORCH_PROFILER_DIR set; SGLang: /start_profile is built in; "
        "tracestory serve: --profiler-dir DIR")


@dataclass(frozen=True)
class ProfileCall:
    action: str                    # "start" | "stop"
    url: str
    status: int | None             # HTTP status; None when no answer came
    answer: str                    # the answer's text (first 300 characters), or the error
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def to_json(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def profile_call(base_url: str, action: str, body: dict | None = None, timeout_s: float = 60.0) -> ProfileCall:
    """``POST <base_url>/<action>_profile`` (with ``body`` as JSON when given); never raises for
    an HTTP or connection failure: the :class:`ProfileCall` says what happened."""
    url = f"{base_url.rstrip('/')}/{action}_profile"
    data = json.dumps(body).encode() if body is not None else b""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    req = urllib.request.Request(url, data=data, method="POST", headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # direct, as the load's requests
    t = time.perf_counter()
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            return ProfileCall(action, url, resp.status, resp.read(300).decode("utf-8", "replace").strip(),
                               time.perf_counter() - t)
    except urllib.error.HTTPError as e:
        text = e.read(300).decode("utf-8", "replace").strip() if e.fp is not None else ""
        return ProfileCall(action, url, e.code, text, time.perf_counter() - t)
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        why = getattr(e, "reason", e)
        return ProfileCall(action, url, None, f"{type(e).__name__}: {why}", time.perf_counter() - t)


def start_profile(base_url: str, body: dict | None = None, timeout_s: float = 60.0) -> ProfileCall:
    """Start the server's profiler, or a one-line :class:`UsageError` saying what answered."""
    call = profile_call(base_url, "start", body, timeout_s)
    if not call.ok:
        found = f"HTTP {call.status}" if call.status is not None else "no answer"
        detail = " ".join(call.answer.split())[:160]
        raise UsageError(f"--profile: expected HTTP 200 from POST {call.url}, found {found}"
                         f"{f' ({detail})' if detail else ''}; {HINT}")
    return call


def stop_profile(base_url: str, timeout_s: float) -> ProfileCall:
    return profile_call(base_url, "stop", None, timeout_s)
