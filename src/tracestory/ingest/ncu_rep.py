"""``.ncu-rep`` (optionally gzip'ed) -> reader records for :mod:`.ncu`, via the ``ncu-report``
package from PyPI (it ships its native libraries: no GPU and no Nsight Compute install needed).

Every action (profiled kernel) of every range becomes one record, numbered in order. Metric
values come from ``IMetric.as_double()`` (``as_string()`` for string metrics) with
``IMetric.unit()``; instanced metrics give their aggregate. Metrics without a value are skipped,
so their stable fields stay ``None``.

Damage: a cut-short or byte-flipped report still loads through the binding, with the damaged
actions left without a name and without metrics (the binding raises nothing). Such actions
are dropped and stated; a report with no readable action is refused. The gzip layer is
inflated within the size limit of :mod:`.files`; a damaged one is refused.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from pathlib import Path

from ..errors import ToolNotFound, TraceFormatError
from ..units import plural
from .files import check_size, max_input_bytes, refuse_special


def _import():
    try:
        import ncu_report
    except ImportError:
        raise ToolNotFound("ncu-report", "pip install 'tracestory[ncu]'") from None
    return ncu_report


def _metrics(nr, action) -> dict:
    out = {}
    string_kind = nr.IMetric.ValueKind_STRING
    for name in action.metric_names():
        if name.startswith("group:"):
            continue
        m = action.metric_by_name(name)
        if m is None or not m.has_value():
            continue
        try:
            value = m.as_string() if m.kind() == string_kind else float(m.as_double())
        except Exception:  # noqa: BLE001, S112 - a metric kind the binding cannot convert: keep the rest
            continue
        out[name] = (value, m.unit() or "")
    return out


def _str(metrics: dict, name: str):
    v = metrics.get(name, (None,))[0]
    return None if v is None else (str(int(v)) if isinstance(v, float) else v)


def _gunzip_to(path: Path, fd: int) -> None:
    """Inflate the gzip file ``path`` into the open file ``fd`` within the size limit."""
    limit, written = max_input_bytes(), 0
    try:
        with open(path, "rb") as f, os.fdopen(fd, "wb") as out:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while block := f.read(1 << 20):
                while block:
                    piece = d.decompress(block)
                    written += len(piece)
                    if written > limit:
                        raise TraceFormatError(path, "a report of at most the input size limit once decompressed "
                                                     "(TRACESTORY_MAX_INPUT_BYTES)", "more")
                    out.write(piece)
                    block = d.unused_data
                    if block:
                        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out.write(d.flush())
            if not d.eof:
                raise TraceFormatError(path, "a complete gzip stream", "a truncated gzip file (stream ends early)")
    except zlib.error as e:
        raise TraceFormatError(path, "a gzip-compressed Nsight Compute report", f"corrupt gzip data ({e})") from None


def read_rep(path: Path, warnings: list[str] | None = None) -> list:
    """``[(ident, metrics, rules), ...]`` for every readable action of the report; the
    unreadable ones are counted in ``warnings``."""
    warnings = [] if warnings is None else warnings
    check_size(path, refuse_special(path))
    nr = _import()
    tmp = None
    try:
        src = str(path)
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        if gz:
            fd, tmp = tempfile.mkstemp(suffix=".ncu-rep")
            _gunzip_to(path, fd)
            src = tmp
        try:
            ctx = nr.load_report(src)
        except Exception as e:  # noqa: BLE001 - the binding raises plain exceptions on bad files
            raise TraceFormatError(path, "an Nsight Compute report (.ncu-rep)", f"unreadable: {e}") from None
        records = []
        unreadable = 0
        demangled = nr.IAction.NameBase_DEMANGLED
        for ri in range(ctx.num_ranges()):
            rng = ctx.range_by_idx(ri)
            for ai in range(rng.num_actions()):
                action = rng.action_by_idx(ai)
                name = action.name(demangled)
                metrics = _metrics(nr, action) if name else {}
                if not name or not metrics:
                    unreadable += 1
                    continue
                ident = {
                    "id": len(records),
                    "name": name,
                    "process_id": _str(metrics, "launch__process_id"),
                    "device": _str(metrics, "launch__device_id"),
                    "context": _str(metrics, "launch__context_id"),
                    "stream": _str(metrics, "launch__stream_id"),
                }
                cc_major = metrics.get("device__attribute_compute_capability_major", (None,))[0]
                cc_minor = metrics.get("device__attribute_compute_capability_minor", (None,))[0]
                if isinstance(cc_major, float) and isinstance(cc_minor, float):
                    ident["cc"] = f"{int(cc_major)}.{int(cc_minor)}"
                rules = []
                try:
                    for r in action.rule_results_as_dicts():
                        rules.append(_rule(r))
                except Exception:  # noqa: BLE001 - older bindings: no rule results
                    rules = []
                records.append((ident, metrics, [r for r in rules if r is not None]))
        if unreadable and not records:
            raise TraceFormatError(path, "an Nsight Compute report with readable kernels",
                                   f"{plural(unreadable, 'profiled kernel')}, none with a name and metrics "
                                   "(the report is damaged or cut short)")
        if unreadable:
            warnings.append(f"{unreadable} of {unreadable + len(records)} profiled kernels unreadable (no name "
                            "or no metrics: the report is damaged or cut short), dropped")
        return records
    finally:
        if tmp:
            os.unlink(tmp)


def _rule(r) -> tuple | None:
    if not isinstance(r, dict):
        return None
    name = r.get("rule_identifier") or r.get("name") or ""
    if not name:
        return None
    msgs = r.get("rule_messages") or []
    desc = " ".join(str(m.get("message", "")) for m in msgs if isinstance(m, dict)).strip()
    rtype = ""
    if msgs and isinstance(msgs[0], dict):
        rtype = str(msgs[0].get("type", ""))
    speedup = None
    est = r.get("speedup_estimation")
    if isinstance(est, dict) and isinstance(est.get("speedup"), (int, float)):
        speedup = float(est["speedup"])
    return (str(name), rtype, desc, speedup)
