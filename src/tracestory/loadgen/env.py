"""Settings of a load run from the environment, as the capture runbook sets them.

A capture script of the runbook is driven by variables (``TRACE_DURATION=90 TARGET_QPS=12
./capture.sh``); ``tracestory load`` reads the same ones, and a ``TRACESTORY_LOAD_*`` name for
each (the ``TRACESTORY_<OPTION>`` names belong to ``tracestory capture``, whose
``TRACESTORY_WARMUP_RUN`` means another warm-up: a run of the workload before the profiled one).

Precedence, for each setting: an explicit flag > the environment (the ``TRACESTORY_LOAD_*``
name, then the runbook's) > the default. An empty variable counts as unset. A value that does
not parse is refused in one line naming the variable (exit code 2), never ignored. Where each
setting came from (``"flag"``, ``"env TRACE_DURATION"``, ``"default"``) is kept with its value
and written into the run's result files, so a result says how it was configured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError


@dataclass(frozen=True)
class EnvSetting:
    dest: str                  # the flag's argparse dest
    flag: str
    names: tuple[str, ...]     # environment variables, the first set one wins
    kind: str                  # "seconds" | "rate" | "tokens" | "count" | "bool"
    default: Any


ENV_SETTINGS: tuple[EnvSetting, ...] = (
    EnvSetting("duration", "--duration", ("TRACESTORY_LOAD_DURATION", "TRACE_DURATION"), "seconds", None),
    EnvSetting("request_rate", "--request-rate", ("TRACESTORY_LOAD_REQUEST_RATE", "TARGET_QPS"), "rate", math.inf),
    EnvSetting("prompt_len_min", "--prompt-len-min", ("TRACESTORY_LOAD_PROMPT_LEN_MIN", "PROMPT_LEN_MIN"),
               "tokens", None),
    EnvSetting("prompt_len_max", "--prompt-len-max", ("TRACESTORY_LOAD_PROMPT_LEN_MAX", "PROMPT_LEN_MAX"),
               "tokens", None),
    EnvSetting("max_new_tokens", "--max-new-tokens", ("TRACESTORY_LOAD_MAX_NEW_TOKENS", "MAX_NEW_TOKENS"),
               "tokens", None),
    EnvSetting("warmup_run", "--warmup-run", ("TRACESTORY_LOAD_WARMUP_RUN", "WARMUP_RUN"), "bool", False),
    EnvSetting("warmup_duration", "--warmup-duration", ("TRACESTORY_LOAD_WARMUP_DURATION",), "seconds", None),
    EnvSetting("warmup_requests", "--warmup-requests", ("TRACESTORY_LOAD_WARMUP_REQUESTS",), "count", None),
)

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_EXPECTED = {"seconds": "a number of seconds > 0", "rate": "a rate > 0 requests/s or inf",
             "tokens": "a whole number of tokens >= 1", "count": "a whole number of requests >= 1",
             "bool": "1/0, true/false, yes/no or on/off"}


def parse_env_value(name: str, kind: str, text: str) -> Any:
    """The value of variable ``name`` holding ``text``; a :class:`UsageError` naming it otherwise."""
    t = text.strip()
    if kind == "bool":
        if t.lower() in _TRUE:
            return True
        if t.lower() in _FALSE:
            return False
    elif kind in ("tokens", "count"):
        try:
            v = int(t)
        except ValueError:
            v = 0
        if v >= 1:
            return v
    else:
        try:
            v = float(t)
        except ValueError:
            v = math.nan
        if v > 0 and (math.isfinite(v) or (kind == "rate" and t.lower() in ("inf", "+inf", "infinity"))):
            return v
    raise UsageError(f"{name}: expected {_EXPECTED[kind]}, found {text!r}")


def resolve_env(values: MutableMapping[str, Any], environ: Mapping[str, str],
                blocked: Mapping[str, str | None] | None = None) -> dict[str, dict[str, Any]]:
    """Fill every setting of :data:`ENV_SETTINGS` in ``values`` (dest -> the flag's value, None
    when the flag was not given): flag, else environment, else default. ``blocked``: dest -> a
    flag given explicitly that sets the same thing (``--random-input-len`` for the prompt-length
    range), so the environment does not apply to it. Returns dest -> ``{"value": ...,
    "source": ...}`` for the result files ("inf" for an infinite rate)."""
    out: dict[str, dict[str, Any]] = {}
    for s in ENV_SETTINGS:
        by = (blocked or {}).get(s.dest)
        if values.get(s.dest) is not None:
            source = "flag"
        elif by is not None:
            values[s.dest] = s.default
            source = f"flag {by}"
        else:
            name = next((n for n in s.names if environ.get(n, "").strip()), None)
            if name is not None:
                values[s.dest] = parse_env_value(name, s.kind, environ[name])
                source = f"env {name}"
            else:
                values[s.dest] = s.default
                source = "default"
        v = values[s.dest]
        out[s.dest] = {"value": "inf" if isinstance(v, float) and math.isinf(v) else v, "source": source}
    return out


def env_lines(settings: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per setting taken from the environment, for the run's log."""
    flags = {s.dest: s.flag for s in ENV_SETTINGS}
    return [f"load: {flags[d]} {x['value']} from {x['source'][4:]}" for d, x in settings.items()
            if str(x["source"]).startswith("env ")]
