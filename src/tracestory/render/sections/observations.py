"""Observations and Insights: the surprises line, the multi-GPU findings, then each trace's
findings with their evidence, implication and recommendation."""

from __future__ import annotations

from ..md import fmt_evidence, label
from . import Context

SURPRISE_RULES = ("first_step", "step_outlier", "cpu_stall", "multigpu_straggler", "multigpu_clocks")

SURPRISE_CHECKS = "first-step/JIT outliers, step-time outliers, idle gaps caused by one host op"


def _surprises(findings, multigpu, multigpu_fs=()) -> list[str]:
    """One line ahead of the findings: what was unexpected, or which checks found nothing."""
    fs = [f for group in findings for f in group] + list(multigpu_fs)
    hits = [f.title for f in fs if f.rule in SURPRISE_RULES]
    if hits:
        return ["**Surprises**: " + "; ".join(hits) + " (details below).", ""]
    checks = SURPRISE_CHECKS + (", a straggler GPU" if multigpu is not None else "")
    return [f"**Surprises**: none found by the checks for {checks}.", ""]


EVIDENCE_SHOWN = 12  # evidence lines per finding in the report; the JSON holds every one


def _evidence(f) -> list[str]:
    lines = [f"- {e.label}: {fmt_evidence(e)}" for e in f.evidence[:EVIDENCE_SHOWN]]
    rest = len(f.evidence) - EVIDENCE_SHOWN
    return lines + ([f"- ({rest} more in the JSON output, `findings[].evidence`)"] if rest > 0 else [])


def _findings(fs) -> list[str]:
    """Findings that ask for something in full (evidence, implication, recommendation); the
    informational ones (``info``: a check that found the run fine, or context) one bullet each
    under "Also checked", their evidence left to the JSON."""
    act = [f for f in fs if f.severity != "info"]
    info = [f for f in fs if f.severity == "info"]
    out = []
    for i, f in enumerate(act, 1):
        out += [f"#### {i}. [{f.severity.upper()}] {f.title}", ""]
        out += _evidence(f)
        out += ["", f"**Implication**: {f.implication}", "", f"**Recommendation**: {f.recommendation}", ""]
    if info:
        out += ["**Also checked** (informational; the evidence is in the JSON output, `findings[]`):", ""]
        out += [f"- {f.title}. {_sentence(f.implication)}{_advice(f.recommendation)}" for f in info]
        out.append("")
    return out


def _sentence(text: str) -> str:
    text = text.strip()
    return text if not text or text.endswith((".", "!", "?")) else text + "."


def _advice(text: str) -> str:
    """The recommendation of an informational finding, unless it only says that none is needed."""
    text = text.strip()
    return "" if not text or text.lower().startswith("no action") else " " + _sentence(text)


def _multigpu_observations(multigpu, fs) -> list[str]:
    if multigpu is None:
        return []
    return ["### Multi-GPU", "", *_findings(fs)]


def _observations(findings, analyses) -> list[str]:
    out = []
    for a, fs in zip(analyses, findings, strict=False):
        if len(analyses) > 1:
            out += [f"### {label(a)}", ""]
        if not fs:
            out += ["No rule fired.", ""]
        out += _findings(fs)
    return out


def render(c: Context) -> list[str]:
    r = c.results
    if c.no_trace:
        fs = r.ncu_findings
        return _surprises([fs], None) + _observations([fs], [None]) if fs else [c.no_trace, ""]
    shown = c.shown
    return (
        _surprises([x.findings for x in shown], r.multigpu, r.multigpu_findings)
        + _multigpu_observations(r.multigpu, r.multigpu_findings)
        + _observations([x.findings for x in shown], [x.analysis for x in shown])
    )
