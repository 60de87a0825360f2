"""The scheduler event log of a continuous-batching server: one JSON object per line.

The format is documented in docs/SCHEDULER_LOG.md (``tracestory serve --event-log`` writes it;
any engine that writes it can be read). ``meta`` comes first, then ``arrival``, ``iteration``,
``first_token`` and ``finish`` lines; times in ns since the log's ``t0``. Unknown keys and
unknown line types are ignored; a line that is not a JSON object, a first line that is not
``meta``, or a known line missing a required key raises
:class:`~tracestory.errors.TraceFormatError` naming ``file:line``. The file may be gzip'ed.
Lines are written when known, not in time order: the reader sorts each kind by time (and
iterations by number).
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ..errors import TraceFormatError
from ..units import fmt_bytes
from .files import check_size, max_input_bytes, refuse_special
from .sniffs import is_int as _is_int
from .sniffs import is_scheduler_log  # noqa: F401  (its sniff, where it was)


@dataclass(frozen=True)
class SchedulerMeta:
    version: int
    engine: str | None
    model: str | None
    device: str | None
    block_size: int | None
    num_blocks: int | None
    max_batch_tokens: int | None
    max_num_seqs: int | None
    t0_unix_ns: int | None
    overlap: bool | None = None     # iteration N+1 launched while N runs (tracestory serve's key)


@dataclass(frozen=True)
class Arrival:
    t_ns: int
    request_id: str
    prompt_tokens: int | None
    max_new_tokens: int | None


@dataclass(frozen=True)
class Member:
    request_id: str
    phase: str                      # prefill | decode
    tokens: int
    context: int | None
    chunked: bool


@dataclass(frozen=True)
class Decision:
    request_id: str
    action: str                     # admit | chunk | wait | preempt | finish
    reason: str


@dataclass(frozen=True)
class Iteration:
    iter: int
    t_start_ns: int
    t_end_ns: int
    members: tuple[Member, ...]
    decisions: tuple[Decision, ...]
    kv_allocated: int | None
    kv_freed: int | None
    kv_in_use: int | None
    kv_total: int | None
    memory_allocated_bytes: int | None
    memory_reserved_bytes: int | None
    waiting: int | None
    running: int | None
    profiler_ns: int | None = None   # the part of the iteration the profiler's own start or stop held
    launch_ns: int | None = None     # host time of the iteration's launch (tracestory serve's key)
    gc_ns: int | None = None         # Python GC wall time in collections that ended in it (tracestory serve)
    gc_passes: int | None = None     # how many collections
    gc_generation: int | None = None  # the oldest generation collected (2: a full collection)
    gpu_ns: int | None = None        # device time of its launched work (CUDA events; tracestory serve)
    plan_send_ns: int | None = None  # tensor parallel: rank 0's send of the plan to the other ranks

    @property
    def duration_ns(self) -> int:
        return self.t_end_ns - self.t_start_ns

    @property
    def prefill_tokens(self) -> int:
        return sum(m.tokens for m in self.members if m.phase == "prefill")

    @property
    def decode_seqs(self) -> int:
        return sum(1 for m in self.members if m.phase == "decode")

    @property
    def kind(self) -> str:
        p, d = self.prefill_tokens, self.decode_seqs
        return "empty" if not p and not d else "decode-only" if not p else "prefill-only" if not d else "mixed"


@dataclass(frozen=True)
class FirstToken:
    t_ns: int
    request_id: str


@dataclass(frozen=True)
class Finish:
    t_ns: int
    request_id: str
    reason: str                     # length | stop | error | cancelled
    prompt_tokens: int | None
    output_tokens: int | None
    error: str | None


@dataclass(frozen=True)
class SchedulerLog:
    path: str
    meta: SchedulerMeta
    arrivals: tuple[Arrival, ...]
    iterations: tuple[Iteration, ...]      # in iteration order
    first_tokens: tuple[FirstToken, ...]
    finishes: tuple[Finish, ...]


class _Line:
    """Typed access to one object with ``file:line`` errors."""

    def __init__(self, where: str, obj: dict):
        self.where, self.obj = where, obj

    def bad(self, expected: str, found: str) -> TraceFormatError:
        return TraceFormatError(self.where, expected, found)

    def int(self, key: str, required: bool = True, obj: dict | None = None) -> int | None:
        o = self.obj if obj is None else obj
        v = o.get(key)
        if v is None and not required:
            return None
        if not _is_int(v) or not -(1 << 63) <= v < (1 << 63):   # times and counts fit int64, as written
            raise self.bad(f"an integer {key!r} in a {self.obj.get('type')} line"
                           + (" (within int64)" if _is_int(v) else ""),
                           "no such key" if key not in o else f"{v!r}")
        return v

    def str(self, key: str, required: bool = True, obj: dict | None = None) -> str | None:
        o = self.obj if obj is None else obj
        v = o.get(key)
        if v is None and not required:
            return None
        if not isinstance(v, str):
            raise self.bad(f"a string {key!r} in a {self.obj.get('type')} line",
                           "no such key" if key not in o else f"{v!r}")
        return v


def _member(ln: _Line, m: Any) -> Member:
    if not isinstance(m, dict):
        raise ln.bad("members that are JSON objects", repr(m)[:60])
    phase = ln.str("phase", obj=m)
    if phase not in ("prefill", "decode"):
        raise ln.bad("member phase 'prefill' or 'decode'", repr(phase))
    return Member(ln.str("request_id", obj=m), phase, ln.int("tokens", obj=m), ln.int("context", False, m),
                  bool(m.get("chunked", False)))


def _iteration(ln: _Line) -> Iteration:
    o = ln.obj
    t0, t1 = ln.int("t_start_ns"), ln.int("t_end_ns")
    members = o.get("members")
    if not isinstance(members, list):
        raise ln.bad("a 'members' list in an iteration line", "no such key" if "members" not in o else repr(members)[:60])
    decisions = o.get("decisions") or []
    if not isinstance(decisions, list) or not all(isinstance(d, dict) for d in decisions):
        raise ln.bad("a 'decisions' list of objects", repr(decisions)[:60])
    kv = o.get("kv") if isinstance(o.get("kv"), dict) else {}
    mem = o.get("memory") if isinstance(o.get("memory"), dict) else {}
    if t1 < t0:
        raise ln.bad("t_end_ns >= t_start_ns", f"{t1} < {t0}")
    return Iteration(
        iter=ln.int("iter"), t_start_ns=t0, t_end_ns=t1, members=tuple(_member(ln, m) for m in members),
        decisions=tuple(Decision(ln.str("request_id", obj=d), ln.str("action", obj=d), ln.str("reason", False, d) or "")
                        for d in decisions),
        kv_allocated=ln.int("allocated", False, kv), kv_freed=ln.int("freed", False, kv),
        kv_in_use=ln.int("in_use", False, kv), kv_total=ln.int("total", False, kv),
        memory_allocated_bytes=ln.int("allocated_bytes", False, mem),
        memory_reserved_bytes=ln.int("reserved_bytes", False, mem),
        waiting=ln.int("waiting", False), running=ln.int("running", False),
        profiler_ns=ln.int("profiler_ns", False), launch_ns=ln.int("launch_ns", False),
        gc_ns=ln.int("gc_ns", False), gc_passes=ln.int("gc_passes", False),
        gc_generation=ln.int("gc_generation", False), gpu_ns=ln.int("gpu_ns", False),
        plan_send_ns=ln.int("plan_send_ns", False))


def _first_repeat(values):
    """The first value seen a second time, in order; None when every value is distinct."""
    seen = set()
    for v in values:
        if v in seen:
            return v
        seen.add(v)
    return None


def _refuse_repeats(path: Path, arrivals: list, iters: list) -> None:
    """The server writes one arrival line per request and one line per iteration number, and every
    iteration takes time: a request arriving twice or an iteration number written twice (a log
    appended to itself, two runs in one file), or iterations that all last 0 ns, are refused."""
    request = _first_repeat(a.request_id for a in arrivals)
    if request is not None:
        raise TraceFormatError(path, "one arrival line per request (one run per log)",
                               f"request {request!r} arriving twice")
    number = _first_repeat(it.iter for it in iters)
    if number is not None:
        raise TraceFormatError(path, "one line per iteration number (one run per log)",
                               f"iteration {number} written twice")
    if iters and all(it.t_end_ns == it.t_start_ns for it in iters):
        raise TraceFormatError(path, "iterations that take time", f"{len(iters):,} iterations, all of 0 ns")


def read_scheduler_log(path: str | Path) -> SchedulerLog:
    """Read and check the whole log (see the module docstring for the rules)."""
    path = Path(path)
    meta: SchedulerMeta | None = None
    arrivals, iters, firsts, fins = [], [], [], []
    check_size(path, refuse_special(path))
    limit = max_input_bytes()
    read = 0
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
            for lineno, raw in enumerate(iter(lambda: f.readline(limit + 1 - read), b""), 1):
                read += len(raw)
                if read > limit:
                    raise TraceFormatError(path, f"a scheduler event log of at most {fmt_bytes(limit)} "
                                                 "(TRACESTORY_MAX_INPUT_BYTES)", "more")
                if not raw.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    obj = msgspec.json.decode(raw)
                except msgspec.DecodeError as e:
                    raise TraceFormatError(where, "one JSON object per line", f"invalid JSON ({e})") from None
                if not isinstance(obj, dict):
                    raise TraceFormatError(where, "a JSON object", type(obj).__name__)
                ln = _Line(where, obj)
                kind = obj.get("type")
                if meta is None:
                    if kind != "meta":
                        raise ln.bad("a first line with \"type\": \"meta\" (a scheduler event log)", f"type {kind!r}")
                    meta = SchedulerMeta(ln.int("version"), obj.get("engine"), obj.get("model"), obj.get("device"),
                                         *(ln.int(k, False) for k in ("block_size", "num_blocks",
                                                                       "max_batch_tokens", "max_num_seqs",
                                                                       "t0_unix_ns")),
                                         obj["overlap"] if isinstance(obj.get("overlap"), bool) else None)
                elif kind == "arrival":
                    arrivals.append(Arrival(ln.int("t_ns"), ln.str("request_id"), ln.int("prompt_tokens", False),
                                            ln.int("max_new_tokens", False)))
                elif kind == "iteration":
                    iters.append(_iteration(ln))
                elif kind == "first_token":
                    firsts.append(FirstToken(ln.int("t_ns"), ln.str("request_id")))
                elif kind == "finish":
                    fins.append(Finish(ln.int("t_ns"), ln.str("request_id"), ln.str("reason"),
                                       ln.int("prompt_tokens", False), ln.int("output_tokens", False),
                                       ln.str("error", False)))
    except OSError as e:
        raise TraceFormatError(path, "a readable scheduler event log", str(e)) from None
    except EOFError:
        raise TraceFormatError(path, "a complete gzip file", "a truncated gzip stream") from None
    except zlib.error as e:
        raise TraceFormatError(path, "a gzip-compressed scheduler event log", f"corrupt gzip data ({e})") from None
    if meta is None:
        raise TraceFormatError(path, "a scheduler event log (a meta line first)", "an empty file")
    _refuse_repeats(path, arrivals, iters)
    # Lines are written when known, not in time order (see the format): sort by time.
    return SchedulerLog(str(path), meta, tuple(sorted(arrivals, key=lambda a: a.t_ns)),
                        tuple(sorted(iters, key=lambda i: i.iter)), tuple(sorted(firsts, key=lambda x: x.t_ns)),
                        tuple(sorted(fins, key=lambda x: x.t_ns)))
