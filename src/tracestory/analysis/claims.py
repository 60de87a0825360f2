"""Findings as claims with preconditions: which rule may speak about which run, and in what order.

Every rule is ``rule(facts: RunFacts) -> list[Finding]`` and is registered here with what it
applies to (:class:`Applies`): the kinds of trace (a timeline verdict needs start and end times),
the workload kinds, GPU platforms, frameworks and modes. :func:`derive_findings` runs a rule only
where every precondition is *known* to hold; a rule whose precondition is unknown does not fire,
and :func:`withheld` says what the inputs could not tell, for the Limitations. Each finding keeps
the facts it rested on in ``basis`` (workload, platform, trace kind), so a reader and a test can
check the claim against them.

Order: by severity, then by rule order, except that a finding that names the *cause* of another
(:attr:`Rule.explains`: the CPU op under the idle gaps explains the idle GPU) and is at least as
severe goes right before it: the summary's headline is then the most specific cause.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import msgspec

from .facts import RunFacts
from .findings import (
    SEVERITIES,
    Finding,
    rule_bound,
    rule_communication,
    rule_cpu_stall,
    rule_critical_path,
    rule_dominant_category,
    rule_eager_fusion,
    rule_first_step,
    rule_gpu_idle,
    rule_graph_replay,
    rule_layout_conversion,
    rule_memcpy_share,
    rule_memory,
    rule_occupancy,
    rule_small_grids,
    rule_step_outlier,
    rule_step_trend,
    rule_trace_kind,
)
from .workload import LLM

TIMELINE = frozenset({"timeline"})
WITH_KERNELS = frozenset({"timeline", "summary_only", "range_profiler"})


class Applies(msgspec.Struct, frozen=True):
    """Preconditions of a rule. ``None``: any value, unknown included."""

    kinds: frozenset[str] = TIMELINE
    workloads: frozenset[str] | None = None
    platforms: frozenset[str] | None = None
    frameworks: frozenset[str] | None = None
    modes: frozenset[str] | None = None

    def reason_not(self, f: RunFacts) -> str | None:
        """Why the rule does not apply to ``f`` (None when it does)."""
        if f.kind.kind not in self.kinds:
            return f"the trace is a {f.kind.kind.replace('_', ' ')}, not a " + " or ".join(sorted(self.kinds))
        checks = (
            ("workload", self.workloads, f.workload.kind),
            ("platform", self.platforms, f.platform),
            ("framework", self.frameworks, f.producer.framework),
            ("mode", self.modes, f.producer.mode),
        )
        for what, allowed, value in checks:
            if allowed is not None and value not in allowed:
                return f"{what} is {value}"
        return None


class Rule(msgspec.Struct, frozen=True):
    name: str
    check: Callable[[RunFacts], list[Finding]]
    applies: Applies = Applies()
    explains: tuple[str, ...] = ()  # rules whose finding this one names the cause of


NOT_A_TIMELINE = frozenset({"stream_capture", "range_profiler", "summary_only", "empty"})

RULES: tuple[Rule, ...] = (
    Rule("trace_kind", rule_trace_kind, Applies(kinds=NOT_A_TIMELINE)),
    Rule("gpu_idle", rule_gpu_idle),
    Rule("cpu_stall", rule_cpu_stall, explains=("gpu_idle",)),
    Rule("dominant_category", rule_dominant_category, Applies(kinds=WITH_KERNELS)),
    Rule("critical_path", rule_critical_path),
    Rule("first_step", rule_first_step),
    Rule("step_outlier", rule_step_outlier),
    Rule("step_trend", rule_step_trend),
    Rule("bound", rule_bound, Applies(kinds=WITH_KERNELS)),
    Rule("occupancy", rule_occupancy, Applies(kinds=WITH_KERNELS)),
    Rule("memcpy_share", rule_memcpy_share, Applies(kinds=WITH_KERNELS)),
    Rule("communication", rule_communication, Applies(kinds=WITH_KERNELS)),
    Rule("graph_replay", rule_graph_replay),
    Rule("layout_conversion", rule_layout_conversion, Applies(kinds=WITH_KERNELS), explains=("dominant_category",)),
    Rule("small_grids", rule_small_grids, Applies(kinds=WITH_KERNELS), explains=("dominant_kernel", "bound")),
    Rule("eager_fusion", rule_eager_fusion, Applies(frameworks=frozenset({"pytorch"}))),
    Rule("memory", rule_memory),
)


def basis(f: RunFacts) -> tuple[str, ...]:
    """The facts every claim about ``f`` rests on, as short phrases."""
    w = f.workload
    return (
        f"trace kind: {f.kind.kind}",
        f"platform: {f.platform}",
        f"framework: {f.producer.framework}",
        f"workload: {w.kind}" + (f" ({w.evidence[0]})" if w.evidence else ""),
    )


def _ordered(found: list[tuple[Rule, Finding]]) -> tuple[Finding, ...]:
    sev = {s: i for i, s in enumerate(SEVERITIES)}
    by_rule = {r.name: i for i, r in enumerate(RULES)}
    present = {fd.rule: (by_rule[rule.name], fd) for rule, fd in found}  # finding name -> (its rule's place, it)
    keyed = []
    for i, (rule, fd) in enumerate(found):
        key = (sev[fd.severity], by_rule[rule.name], 0, i)
        explained = [present[e] for e in rule.explains if e in present]
        if explained and fd.severity in ("high", "medium"):
            place, target = min(explained, key=lambda x: (sev[x[1].severity], x[0]))
            if sev[fd.severity] <= sev[target.severity]:  # a cause as weighty as what it explains goes first
                key = (sev[target.severity], place, -1, i)
        keyed.append((key, fd))
    return tuple(fd for _, fd in sorted(keyed, key=lambda kv: kv[0]))


def derive_findings(f: RunFacts) -> tuple[Finding, ...]:
    """Every finding about one run whose rule's preconditions hold, most severe (and most specific)
    first."""
    why = basis(f)
    found = []
    for rule in RULES:
        if rule.applies.reason_not(f) is not None:
            continue
        found += [(rule, dataclasses.replace(fd, basis=why)) for fd in rule.check(f)]
    return _ordered(found)


def withheld(f: RunFacts) -> tuple[str, ...]:
    """What these inputs cannot tell, where it hides advice a reader would look for."""
    out = []
    if f.workload.kind == "unknown" and f.kind.kind == "timeline":
        out.append(
            "the names in the trace do not show what the workload is ("
            + f.workload.evidence[0]
            + "): advice that depends on the kind of model is withheld"
        )
    if f.kind.kind not in ("timeline",):
        out.append(
            f"the trace is a {f.kind.kind.replace('_', ' ')}: no timeline verdict (idle time, launch cost, "
            "critical path, steps) is given"
        )
    return tuple(out)


__all__ = ["Applies", "LLM", "RULES", "Rule", "basis", "derive_findings", "withheld"]
