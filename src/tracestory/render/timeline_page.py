"""The interactive timeline as an HTML fragment for the report page (:mod:`.html`).

Model
-----
:func:`timeline_section` turns a :class:`~.timeline_data.TimelineModel` into

* a ``<section id="ts-timeline">``: a heading, a line saying what is drawn and what was
  dropped, a toolbar (reset, the readout of the span under the pointer), the canvas, and the
  list of findings, each a link to the spans the model computed for it (a finding without
  spans is listed with the reason and no link);
* a ``<script type="application/json">`` data block: compact JSON, column arrays, times in
  microseconds from the trace start (ns resolution, shortest decimal form), each lane's starts
  delta-coded; with dropped spans, each lane's full-view busy shading as a string of digits
  0-9 (the busy share in ninths, rounded up: a column with any busy time is 1 or more);
* the page's script, ``assets/timeline.js`` (hand-written canvas 2D code shipped as package
  data), inlined. The page's Content-Security-Policy allows exactly this script by its SHA-256
  hash (:attr:`TimelineSection.csp_script`): nothing else runs, nothing is loaded.

Limits: the page needs JavaScript for the canvas; without it the section shows the text and the
findings list only.
"""

from __future__ import annotations

import base64
import hashlib
import html as _html
import json
import re
from dataclasses import dataclass
from importlib import resources

import numpy as np

from .. import units
from .timeline_data import DENSITY_BINS, OTHER_COLOUR, PALETTE, TimelineModel

_CSS = """
#ts-timeline { margin: 1.2em 0 2em; }
#ts-timeline canvas { display: block; cursor: grab; touch-action: none; }
#ts-timeline .ts-bar { display: flex; gap: 12px; align-items: baseline; font-size: 13px; margin: .4em 0; }
#ts-timeline .ts-readout { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px;
  white-space: nowrap; overflow: hidden; text-overflow: ellipsis; flex: 1; }
#ts-timeline .ts-merged { color: #556; font-size: 12px; }
#ts-timeline .ts-legend span { display: inline-block; margin-right: 10px; font-size: 12px; }
#ts-timeline .ts-legend i { display: inline-block; width: 10px; height: 10px; margin-right: 3px; }
#ts-timeline ol.ts-findings { font-size: 14px; }
.ts-active { background: #ffe9b3; }
a.ts-go { font-size: .75em; font-weight: normal; margin-left: .5em; }
"""


@dataclass(frozen=True)
class TimelineSection:
    html: str  # the section, its data block and its script
    script_sha256: str  # base64 SHA-256 of the inline script, for the page's CSP

    @property
    def csp_script(self) -> str:
        return f"script-src 'sha256-{self.script_sha256}'"


def _script() -> str:
    return (resources.files("tracestory.render") / "assets" / "timeline.js").read_text(encoding="utf-8")


def _colours(m: TimelineModel) -> list[str]:
    """One CSS colour per category, in category order ("other" grey)."""
    return [OTHER_COLOUR if c == "other" else PALETTE[i % len(PALETTE)] for i, c in enumerate(m.categories)]


_ZERO = re.compile(r"\.0(?=[,\]])")


def _us(ns: np.ndarray) -> str:
    """A JSON array of ``ns`` in microseconds, shortest decimal form (``12``, ``12.345``)."""
    return _ZERO.sub("", json.dumps((np.asarray(ns, dtype=np.int64) / 1000.0).tolist()))


def timeline_json(m: TimelineModel) -> str:
    """The page's data block (see the module docstring)."""
    n_lanes = len(m.lanes)
    off = np.searchsorted(m.lane_of, np.arange(n_lanes + 1))
    rel = m.start_ns - m.t0_ns
    delta = np.diff(rel, prepend=0)
    delta[off[:-1][off[:-1] < rel.size]] = rel[off[:-1][off[:-1] < rel.size]]  # each lane starts from 0
    lanes = [
        {"label": ln.label, "kind": ln.kind, "off": int(off[k]), "n": int(off[k + 1] - off[k])}
        for k, ln in enumerate(m.lanes)
    ]
    index = {n: i for i, n in enumerate(m.names)}
    findings = []
    for f in m.findings:
        view = (
            None
            if f.view_ns is None
            else [round((f.view_ns[0] - m.t0_ns) / 1000, 3), round((f.view_ns[1] - m.t0_ns) / 1000, 3)]
        )
        findings.append(
            {
                "title": f.title,
                "severity": f.severity,
                "rule": f.rule,
                "trace": f.trace,
                "why": f.why,
                "view": view,
                "windows": [[round((a - m.t0_ns) / 1000, 3), round((b - m.t0_ns) / 1000, 3)] for a, b in f.windows_ns],
                "names": [index[n] for n in f.names if n in index],
                "lanes": [k for k, ln in enumerate(m.lanes) if ln.run in f.runs],
            }
        )
    head = {
        "version": 1,
        "unit": "us",
        "t0_ns": m.t0_ns,
        "end": round((m.end_ns - m.t0_ns) / 1000, 3),
        "names": list(m.names),
        "categories": list(m.categories),
        "colors": _colours(m),
        "lanes": lanes,
        "findings": findings,
        "total_spans": m.total_spans,
        "dropped": m.dropped,
        "dropped_max_us": round(m.dropped_max_ns / 1000, 3),
    }
    if m.density is not None:
        digits = np.ceil(np.round(m.density * 9, 6)).astype(np.int64)  # any busy time: 1 or more
        head["density"] = {"bins": DENSITY_BINS, "lanes": ["".join(map(str, row)) for row in digits.tolist()]}
    head_json = json.dumps(head, separators=(",", ":"))
    spans = (
        f'{{"s":{_us(delta)},"d":{_us(m.end_ns_ - m.start_ns)},'
        f'"n":{json.dumps(m.name.tolist())},"c":{json.dumps(m.category.tolist())}}}'
    )
    body = head_json[:-1] + ',"spans":' + spans.replace(" ", "") + "}"
    # A data block ends at the first "</script": escape "<" (JSON allows \u003c in strings).
    return body.replace("<", "\\u003c")


def _summary(m: TimelineModel) -> str:
    parts = [
        f"{len(m.lanes)} lanes, {units.fmt_count(int(m.start_ns.size))} spans drawn from "
        f"{units.fmt_ns(m.end_ns - m.t0_ns)} of trace (times from its first span)"
    ]
    if m.dropped:
        kept, total = units.fmt_count(int(m.start_ns.size)), units.fmt_count(m.total_spans)
        parts.append(
            f"the page embeds {kept} of {total} spans, the longest of each lane: {units.fmt_count(m.dropped)} "
            f"spans of at most {units.fmt_ns(m.dropped_max_ns)} are not drawn one by one, only in the grey "
            f"busy shading (per-pixel aggregates of all spans at the full view, {DENSITY_BINS} columns)"
        )
    if m.runs_omitted:
        parts.append(f"{units.plural(m.runs_omitted, 'trace')} not drawn (the report tells the ones shown)")
    return "; ".join(parts) + "."


def timeline_section(m: TimelineModel) -> TimelineSection:
    """The section, data block and script of ``m`` (see the module docstring)."""
    script = _script()
    sha = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    items = []
    for i, f in enumerate(m.findings):
        where = f" ({_html.escape(f.trace)})" if f.trace else ""
        title = _html.escape(f.title)
        if f.view_ns is None:
            items.append(f"<li>[{f.severity.upper()}] {title}{where} <em>{_html.escape(f.why)}</em></li>")
        else:
            items.append(
                f'<li>[{f.severity.upper()}] <a href="#ts-timeline" data-finding="{i}">{title}</a>{where} '
                f"<em>{_html.escape(f.why)}</em></li>"
            )
    used = set(np.unique(m.category).tolist())
    legend = "".join(
        f'<span><i style="background:{_colours(m)[k]}"></i>{_html.escape(c)}</span>'
        for k, c in enumerate(m.categories)
        if k in used
    )
    legend += (
        '<span><i style="background:#b7c6de"></i>step</span><span><i style="background:#e9a3a3"></i>idle gap</span>'
    )
    findings = (
        f'<h3>Findings on the timeline</h3>\n<ol class="ts-findings">\n{chr(10).join(items)}\n</ol>\n' if items else ""
    )
    section = (
        f"<style>{_CSS}</style>\n"
        '<section id="ts-timeline">\n<h2 id="interactive-timeline">Interactive timeline</h2>\n'
        f"<p>{_html.escape(_summary(m))} Wheel: zoom around the pointer; drag: pan; hover or click: the span; "
        "a finding's link zooms to its spans.</p>\n"
        '<div class="ts-bar"><button type="button" class="ts-reset">Reset view</button>'
        '<span class="ts-readout">&nbsp;</span><span class="ts-merged" title="decimation at this zoom"></span></div>\n'
        '<canvas width="800" height="100"></canvas>\n'
        f'<div class="ts-legend">{legend}</div>\n{findings}'
        "</section>\n"
        f'<script type="application/json" id="ts-timeline-data">{timeline_json(m)}</script>\n'
        f"<script>{script}</script>\n"
    )
    return TimelineSection(html=section, script_sha256=sha)


__all__ = ["TimelineSection", "timeline_json", "timeline_section"]
