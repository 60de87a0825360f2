"""``.ncu-rep`` (optionally gzip'ed) -> reader records for :mod:`.ncu`, via the ``ncu-report``
package from PyPI (it ships its native libraries: no GPU and no Nsight Compute install needed).

Every action (profiled kernel) of every range becomes one record, numbered in order. Metric
values come from ``IMetric.as_double()`` (``as_string()`` for string metrics) with
``IMetric.unit()``; instanced metrics give their aggregate. Metrics without a value are skipped,
so their stable fields stay ``None``.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import ToolNotFound, TraceFormatError


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


def read_rep(path: Path) -> list:
    """``[(ident, metrics, rules), ...]`` for every action of the report."""
    nr = _import()
    tmp = None
    try:
        src = str(path)
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        if gz:
            fd, tmp = tempfile.mkstemp(suffix=".ncu-rep")
            with os.fdopen(fd, "wb") as out, gzip.open(path, "rb") as g:
                shutil.copyfileobj(g, out)
            src = tmp
        try:
            ctx = nr.load_report(src)
        except Exception as e:  # noqa: BLE001 - the binding raises plain exceptions on bad files
            raise TraceFormatError(path, "an Nsight Compute report (.ncu-rep)", f"unreadable: {e}") from None
        records = []
        demangled = nr.IAction.NameBase_DEMANGLED
        for ri in range(ctx.num_ranges()):
            rng = ctx.range_by_idx(ri)
            for ai in range(rng.num_actions()):
                action = rng.action_by_idx(ai)
                metrics = _metrics(nr, action)
                ident = {
                    "id": len(records),
                    "name": action.name(demangled),
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
