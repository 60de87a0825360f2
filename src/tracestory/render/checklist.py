"""The report checklist, evaluated against a Markdown report (``tracestory check``).

Every item of the report format's checklist is checked, numbered in its order (1-14, with the
visualization sub-items 13.1-13.6), after four structure items S1-S4 that come from the format's
structure and visualization principles (charts within 100 columns, Markdown that parses). Each rule
is a function named after what it checks (``check_structure``, ...); the section headings come from
the report's own registry (``render.markdown.SECTIONS``). Each item is PASS, FAIL or N/A with a
one-line reason. N/A is decided only from what the report itself states: a section whose first
paragraph is an ``n/a`` statement (``n/a: the inputs hold no timeline trace``), a line that marks
the needed data ``n/a``, or facts the report gives (one GPU, no memory samples).

Parsing: lines; code fences per CommonMark (``` or ~~~, up to 3 spaces of indent, closed by
the same character at least as long); headings and tables only outside fences; ``## `` starts a
section. A *chart* is a fence whose info string is not a command or source language (bash,
python, diff, json, ...) inside Execution Story, Visualizations, Hardware Behavior Analysis or
Observations and Insights (elsewhere fences hold commands and raw tool output, kept verbatim).
Width is display columns (East Asian wide characters 2, combining marks 0, tabs to 8).

Rules per item
--------------
* S1 structure: the title ``# Hands-On Learning Report: ...`` and the report's 11 ``## `` headings,
  exact, each once, in the report's order (other sections may sit between them).
* S2 every code fence is closed. S3 every chart line <= 100 columns.
* S4 every table row has the header's column count and the delimiter row is well formed.
* 1 Executive Summary: a number (the insight quantified) and a recommendation ("recommend").
* 2 Execution Story: N/A when it is an n/a statement; else >= 3 step lines in it (time-stamped
  ``Time <t> <unit>`` lines, tree branches ``├──``/``└──``, or numbered steps).
* 3 Timing and event correlation, in Execution Story and Visualizations: >= 2 time stamps (or
  a chart with a time axis) and a correlation of host and GPU events: a time-stamped line about
  the CPU/host/launches, a gap attributed to the CPU, or a chart with both a CPU and a GPU lane;
  N/A when there is no GPU timeline to correlate with (an n/a line about the kernel timeline).
* 4 Hardware metrics interpreted: N/A when Hardware Behavior Analysis is an n/a statement (no
  hardware counters); else every ``###`` block that gives percentages also interprets them
  (bound, limit, verdict, conclusion, waiting, idle, dominates, means, because, ``→``).
* 5 Kernel analysis covers occupancy, compute, memory and stalls: N/A like 4; each aspect
  named in the section or marked n/a there (then listed in the reason); N/A when all are n/a.
* 6 Observations quantified: N/A when Observations is an n/a statement or says no rule fired;
  every finding (``###``/``####`` block, else the section) holds a number.
* 7 Surprises noted: N/A like 6; PASS when Observations, Execution Story or Executive Summary
  note something unexpected (surprise, unexpected, outlier, anomaly, despite, than expected,
  "Nx its ... median", "varies Nx") or state that nothing was.
* 8 Implications and recommendations: N/A like 6; every finding has both words.
* 9 Actions Log: N/A when its first paragraph says n/a; else >= 1 command (a shell fence or a
  ``$ `` line) and every ``Action`` entry followed by a command before the next one.
* 10 Code diffs: N/A when 9 is N/A; PASS with a ``diff`` fence; N/A when the report states the
  code is unmodified, that the input holds no diff (an n/a line about the diff), or that
  modifications cannot be known (an n/a about the workload's repository or commit); FAIL when it
  mentions modifications or uncommitted changes without a diff, or says nothing about them.
* 11 Reproduction Guide tested: N/A when it is an n/a statement; PASS when one of its commands
  is recorded as run (verbatim in the Actions Log or the Appendix's command) or it says it was
  verified/tested.
* 12 Artifacts: a path (in backticks, or in a fence under an "Artifacts" heading) listed under
  "Inputs" or "Artifacts".
* 13 Visualizations: FAIL when a sub-item fails or no chart/image exists; N/A when all are N/A.
* 13.1 timeline: a chart with a time axis label (``(ms)``, ``Time (us)``) and a lane (``│``).
* 13.2 breakdown: a chart with >= 2 bars and a title or preceding line about a breakdown,
  category or GPU time. 13.1 and 13.2: N/A when Visualizations is an n/a statement.
* 13.3 memory timeline: relevant when the report gives GPU memory usage (peak allocated or
  reserved, memory samples); then a chart or image about memory with a time axis, or a line
  marking the memory timeline n/a; N/A when not relevant.
* 13.4 warp stalls: N/A like 4, or when stalls are marked n/a; else a chart about stalls.
* 13.5 roofline: a chart or image about the roofline; N/A when a line marks the roofline n/a.
* 13.6 multi-GPU timeline: relevant when the report states a world size > 1 (``world size N``,
  ``**N GPUs**``) or several ranks (not the machine's GPU count); then a chart with lanes of
  >= 2 GPUs/ranks, or a line marking it n/a.
* 14 interactive tools: Perfetto, chrome://tracing, TensorBoard, Nsight Systems/Compute UI
  (nsys-ui, ncu-ui) or HTA named.

Limits: the checks read text; they test that the report says the things the checklist asks
for, not that what it says is right.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from ..errors import TraceFormatError
from .markdown import SECTION_TITLES, TITLE_PREFIX

SECTIONS = SECTION_TITLES  # the report's own registry (render.markdown.SECTIONS)
CHART_SECTIONS = ("Execution Story", "Visualizations", "Hardware Behavior Analysis", "Observations and Insights")
COMMAND_LANGS = {
    "bash",
    "sh",
    "shell",
    "console",
    "zsh",
    "python",
    "py",
    "diff",
    "patch",
    "json",
    "toml",
    "yaml",
    "yml",
    "c",
    "cpp",
    "cuda",
    "markdown",
    "md",
    "ini",
    "sql",
    "powershell",
}
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
WIDTH = 100

ITEMS: tuple[tuple[str, str], ...] = (
    ("S1", "Report structure: the title and 11 sections, exact headings, in order"),
    ("S2", "Markdown parses: every code fence is closed"),
    ("S3", "Charts stay within 100 columns"),
    ("S4", "Tables are well formed"),
    ("1", "Executive summary captures key insight"),
    ("2", "Execution story tells step-by-step what happens"),
    ("3", "Timeline includes timing and event correlation"),
    ("4", "Hardware metrics interpreted (not just listed)"),
    ("5", "Kernel analysis covers occupancy, compute, memory, stalls"),
    ("6", "Observations are quantified where possible"),
    ("7", "Surprises and unexpected behaviors noted"),
    ("8", "Implications and recommendations derived"),
    ("9", "Actions Log complete with all commands and modifications"),
    ("10", "Code diffs included for all modifications"),
    ("11", "Reproduction Guide tested and verified"),
    ("12", "Artifacts archived with clear location"),
    ("13", "Visualizations included for key findings"),
    ("13.1", "Timeline/flame graph showing execution flow"),
    ("13.2", "Kernel time breakdown chart"),
    ("13.3", "Memory usage timeline (if relevant)"),
    ("13.4", "Warp stall distribution (for kernel analysis)"),
    ("13.5", "Roofline position (for performance characterization)"),
    ("13.6", "Multi-GPU timeline (if distributed)"),
    ("14", "Visualization tools referenced for interactive exploration"),
)
PASS, FAIL, NA = "PASS", "FAIL", "N/A"


@dataclass(frozen=True)
class ItemResult:
    number: str
    text: str
    status: str  # "PASS", "FAIL" or "N/A"
    reason: str


@dataclass(frozen=True)
class Checklist:
    path: str
    items: tuple[ItemResult, ...]

    @property
    def failed(self) -> tuple[ItemResult, ...]:
        return tuple(i for i in self.items if i.status == FAIL)

    def counts(self) -> dict[str, int]:
        return {s: sum(i.status == s for i in self.items) for s in (PASS, FAIL, NA)}


# ------------------------------------------------------------------ parsing


@dataclass(frozen=True)
class Fence:
    start: int  # line index of the opening fence
    end: int | None  # line index of the closing fence; None: never closed
    nested: int | None  # line index of an opener with an info string inside (an earlier fence left open)
    info: str
    lines: tuple[str, ...]
    section: str | None

    @property
    def lang(self) -> str:
        return self.info.split()[0].lower() if self.info.split() else ""


@dataclass(frozen=True)
class Doc:
    lines: tuple[str, ...]
    title: str | None
    headings: tuple[tuple[int, int, str], ...]  # (line, level, text) outside fences
    sections: dict  # "## " heading -> line indices of its body (fences included)
    fences: tuple[Fence, ...]
    in_fence: tuple[bool, ...]  # per line: inside a fence (fence lines included)


_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_HEAD = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def parse(text: str) -> Doc:
    lines = tuple(text.splitlines())
    fences, in_fence, headings = [], [False] * len(lines), []
    section, title, i = None, None, 0
    sections: dict[str, list[int]] = {}
    while i < len(lines):
        line = lines[i]
        m = _OPEN.match(line)
        if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            mark, j = m.group(1), i + 1
            close = re.compile(rf"^ {{0,3}}{re.escape(mark[0])}{{{len(mark)},}}\s*$")
            while j < len(lines) and not close.match(lines[j]):
                j += 1
            end = j if j < len(lines) else None
            stop = end if end is not None else len(lines) - 1
            # ```text inside a ``` block cannot be content the author meant (a longer outer
            # fence would be needed): the block before it was left open and this one closed it.
            inner = re.compile(rf"^ {{0,3}}{re.escape(mark[0])}{{{len(mark)},}}\s*\S")
            nested = next((k for k in range(i + 1, stop) if inner.match(lines[k])), None)
            for k in range(i, stop + 1):
                in_fence[k] = True
            fences.append(
                Fence(i, end, nested, m.group(2).strip(), lines[i + 1 : stop if end is not None else stop + 1], section)
            )
            if section is not None:
                sections[section].extend(range(i, stop + 1))
            i = stop + 1
            continue
        h = _HEAD.match(line)
        if h:
            level, name = len(h.group(1)), h.group(2)
            headings.append((i, level, name))
            if level == 1 and title is None:
                title = name
            if level == 2:
                section = name
                sections.setdefault(section, [])
                i += 1
                continue
        if section is not None:
            sections[section].append(i)
        i += 1
    return Doc(lines, title, tuple(headings), sections, tuple(fences), tuple(in_fence))


def width(line: str) -> int:
    w = 0
    for ch in line.expandtabs(8):
        if unicodedata.combining(ch):
            continue
        w += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return w


def _cells(row: str) -> int:
    s = row.strip().removeprefix("|")
    s = s[:-1] if s.endswith("|") and not s.endswith("\\|") else s
    return len(re.split(r"(?<!\\)\|", s))


_DELIM = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


# ------------------------------------------------------------------ text helpers

_NUM = re.compile(r"\d")
_NA = re.compile(r"\bn/a\b", re.IGNORECASE)
_LEFT_OUT = re.compile(r"\*\*Sections left out\*\*[^:]*:\s*(.+)$")
_LIST = re.compile(r"^\s*([-*+]|\d+[.)])\s|^\s*\|")
_TIME = re.compile(r"\bTime\s+\d[\d.,]*\s*(ns|us|µs|ms|s)\b")
_AXIS = re.compile(r"^\s*\((ns|us|µs|ms|s)\)\s+[\d.]|Time\s*\((ns|us|µs|ms|s)\)")


def _clip(text: str, n: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _left_out_reason(name: str) -> str:
    return f"'{name}' is left out: the summary states there is nothing in these inputs for it"


class _Report:
    """The parsed report with the lookups the rules share."""

    def __init__(self, doc: Doc):
        self.doc = doc

    def has(self, name: str) -> bool:
        return name in self.doc.sections

    @functools.cached_property
    def left_out(self) -> frozenset[str]:
        """The sections the Executive Summary states are left out of this report (``**Sections left
        out** (why): A, B.``): absent on purpose, so their items are N/A. Read once."""
        for line in self.prose("Executive Summary"):
            m = _LEFT_OUT.match(line.strip())
            if m:
                return frozenset(t.strip() for t in m.group(1).rstrip(".").split(", "))
        return frozenset()

    def prose(self, *names: str) -> list[str]:
        d = self.doc
        return [d.lines[i] for n in names for i in d.sections.get(n, ()) if not d.in_fence[i]]

    def text(self, *names: str) -> str:
        d = self.doc
        return "\n".join(d.lines[i] for n in names for i in d.sections.get(n, ()))

    def na(self, name: str) -> str | None:
        """The n/a statement a section opens with (or the summary's statement that it is left out),
        or None."""
        if name in self.left_out:
            return _left_out_reason(name)
        for line in self.prose(name):
            if not line.strip() or _HEAD.match(line):
                continue
            if _LIST.match(line) or not _NA.search(line):
                return None
            return _clip(line.strip())
        return None

    def na_line(self, pattern: str) -> str | None:
        """A prose line (or list item) marking something matching ``pattern`` n/a."""
        rx = re.compile(pattern, re.IGNORECASE)
        for i, line in enumerate(self.doc.lines):
            if not self.doc.in_fence[i] and _NA.search(line) and rx.search(line):
                return _clip(line.strip())
        return None

    def charts(self) -> list[Fence]:
        return [f for f in self.doc.fences if f.section in CHART_SECTIONS and f.lang not in COMMAND_LANGS]

    def images(self) -> list[str]:
        return [m for line in self.doc.lines for m in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", line)]

    def blocks(self, name: str) -> list[tuple[str, str]]:
        """(heading, text) of the ``###``/``####`` blocks of a section; the section itself when none.
        A heading with no text of its own, directly followed by a deeper heading, only groups
        the blocks under it (``### rank 0`` over ``#### 1. finding``) and is not a block."""
        d, head = self.doc, None
        raw: list[tuple[tuple[int, str], str]] = []
        cur: list[str] = []
        for i in d.sections.get(name, ()):
            h = _HEAD.match(d.lines[i]) if not d.in_fence[i] else None
            if h and len(h.group(1)) >= 3:
                if head is not None:
                    raw.append((head, "\n".join(cur)))
                head, cur = (len(h.group(1)), h.group(2)), []
            elif head is not None:
                cur.append(d.lines[i])
        if head is not None:
            raw.append((head, "\n".join(cur)))
        out = [(h[1], t) for k, (h, t) in enumerate(raw) if t.strip() or k + 1 == len(raw) or raw[k + 1][0][0] <= h[0]]
        return out or ([(name, self.text(name))] if self.has(name) else [])


def _missing(r: _Report, name: str) -> tuple[str, str]:
    if name in r.left_out:
        return NA, _left_out_reason(name)
    return FAIL, f"no '## {name}' section"


# ------------------------------------------------------------------ structure items


def check_structure(r: _Report):
    d = r.doc
    if not d.title or not d.title.startswith(TITLE_PREFIX):
        return FAIL, f"title is {d.title!r}, expected '# {TITLE_PREFIX} ...'"
    h2 = [h[2] for h in d.headings if h[1] == 2]
    stated = r.left_out
    missing = [s for s in SECTIONS if s not in h2 and s not in stated]
    twice = [s for s in SECTIONS if h2.count(s) > 1]
    if missing or twice:
        return FAIL, "; ".join(
            x for x in (missing and f"missing: {', '.join(missing)}", twice and f"repeated: {', '.join(twice)}") if x
        )
    order = [h for h in h2 if h in SECTIONS]
    if order != [s for s in SECTIONS if s not in stated]:
        return FAIL, f"out of order: {', '.join(order)}"
    if stated:
        return PASS, f"title and {len(order)} sections in the report's order; left out as the summary states: " + (
            ", ".join(s for s in SECTIONS if s in stated)
        )
    return PASS, "title and all 11 sections in the report's order"


def check_fences_closed(r: _Report):
    bad = [f for f in r.doc.fences if f.end is None]
    if bad:
        return FAIL, f"code fence opened on line {bad[0].start + 1} is never closed"
    nested = [f for f in r.doc.fences if f.nested is not None]
    if nested:
        f = nested[0]
        assert f.nested is not None
        return FAIL, (
            f"code fence opened on line {f.start + 1} holds a fence opener on line {f.nested + 1}: "
            f"a fence before it was not closed"
        )
    return PASS, f"{len(r.doc.fences)} code fences, all closed"


def check_chart_width(r: _Report):
    charts = r.charts()
    for f in charts:
        for k, line in enumerate(f.lines):
            if width(line) > WIDTH:
                return FAIL, (f"line {f.start + 2 + k} ({f.section}) is {width(line)} columns: {_clip(line, 60)!r}")
    return PASS, f"{len(charts)} charts, every line <= {WIDTH} columns"


def check_tables(r: _Report):
    d, n, i = r.doc, 0, 0
    while i + 1 < len(d.lines):
        head, delim = d.lines[i], d.lines[i + 1]
        if not d.in_fence[i] and not d.in_fence[i + 1] and "|" in head and "-" in delim and _DELIM.match(delim):
            cols = _cells(head)
            if _cells(delim) != cols:
                return FAIL, f"table at line {i + 1}: delimiter row has {_cells(delim)} cells, header {cols}"
            j = i + 2
            while j < len(d.lines) and not d.in_fence[j] and d.lines[j].strip().startswith("|"):
                if _cells(d.lines[j]) != cols:
                    return (
                        FAIL,
                        f"table at line {i + 1}: row on line {j + 1} has {_cells(d.lines[j])} cells, header {cols}",
                    )
                j += 1
            n, i = n + 1, j
            continue
        i += 1
    return PASS, f"{n} tables, every row has its header's column count"


# ------------------------------------------------------------------ checklist items

_INTERPRET = re.compile(
    r"bound|limit|verdict|conclusion|interpret|waiting|idle|dominat|means|because|→|->|"
    r"(memory|compute) [\d.]+% of roof",
    re.IGNORECASE,
)
_SURPRISE = re.compile(
    r"surpris|unexpected|outlier|anomal|despite|than expected|counter-?intuitive|"
    r"\d[\d.]*x (its|the) (\w+ )?median|varies \d[\d.]*x|nothing unexpected",
    re.IGNORECASE,
)
_TOOLS = re.compile(
    r"perfetto|chrome://tracing|tensorboard|nsys-ui|ncu-ui|nsight (systems|compute) "
    r"(gui|ui)|holistic ?trace ?analysis|\bHTA\b",
    re.IGNORECASE,
)


def check_summary_quantified(r: _Report):
    name = "Executive Summary"
    if not r.has(name):
        return _missing(r, name)
    text = " ".join(r.prose(name))
    if not text.strip():
        return FAIL, "the summary is empty"
    if not _NUM.search(text):
        return FAIL, f"no number in the summary (key insight not quantified): {_clip(text, 80)!r}"
    if not re.search(r"recommend", text, re.IGNORECASE):
        return FAIL, "the summary gives no recommendation"
    return PASS, "a quantified insight and a recommendation"


def check_story_steps(r: _Report):
    name = "Execution Story"
    if not r.has(name):
        return _missing(r, name)
    if na := r.na(name):
        return NA, na
    steps = [
        ln
        for ln in r.text(name).splitlines()
        if _TIME.search(ln) or re.search(r"[├└]──", ln) or re.match(r"\s*(\d+[.)]|step \d)", ln, re.IGNORECASE)
    ]
    if len(steps) < 3:
        return FAIL, f"{len(steps)} step lines (time stamps, tree branches or numbered steps); 3 needed"
    return PASS, f"{len(steps)} step lines"


def check_timing_correlation(r: _Report):
    names = [n for n in ("Execution Story", "Visualizations") if r.has(n) and not r.na(n)]
    if not names:
        if r.has("Execution Story") and r.na("Execution Story"):
            return NA, r.na("Execution Story")
        return _missing(r, "Execution Story")
    lines = r.text(*names).splitlines()
    stamps = [ln for ln in lines if _TIME.search(ln)]
    axis = any(_AXIS.search(ln) for f in r.charts() if f.section in names for ln in f.lines)
    if len(stamps) < 2 and not axis:
        return FAIL, "fewer than 2 time stamps and no chart with a time axis"
    lanes = {m.group(1).upper() for ln in lines for m in [re.match(r"\s*(cpu|gpu)\S*.*│", ln, re.IGNORECASE)] if m}
    corr = [ln for ln in stamps if re.search(r"\bCPU\b|host|launch", ln, re.IGNORECASE)] or [
        ln for ln in lines if re.search(r"CPU inside|waiting for launch|launch wait", ln, re.IGNORECASE)
    ]
    if not corr and lanes != {"CPU", "GPU"}:
        if "Visualizations" in r.left_out:
            return NA, "no GPU timeline to tie host events to: " + _left_out_reason("Visualizations")
        if no_gpu := r.na_line(r"kernel timeline|timeline trace|no trace"):
            return NA, no_gpu  # e.g. a scheduler log alone: timing, but no GPU timeline to tie to
        return FAIL, "timing given, but no host/launch event is tied to the GPU timeline"
    return PASS, f"{len(stamps)} time stamps" + (", a time axis" if axis else "") + "; host and GPU events correlated"


def _hw_na(r: _Report):
    name = "Hardware Behavior Analysis"
    if not r.has(name):
        return _missing(r, name)
    if na := r.na(name):
        return NA, na
    return None


def check_hardware_interpreted(r: _Report):
    if res := _hw_na(r):
        return res
    bad = [
        h
        for h, t in r.blocks("Hardware Behavior Analysis")
        if re.search(r"\d%|\d (T|G|M)B/s|FLOP/s", t) and not _INTERPRET.search(t)
    ]
    if bad:
        return FAIL, f"metrics without interpretation in: {_clip(', '.join(bad), 80)}"
    return PASS, "every block with metrics interprets them"


def check_kernel_aspects(r: _Report):
    if res := _hw_na(r):
        return res
    lines = r.text("Hardware Behavior Analysis").splitlines()
    aspects = {
        "occupancy": r"occupancy",
        "compute": r"SM throughput|compute|tensor|FLOP",
        "memory": r"DRAM|HBM|memory|bandwidth|L2",
        "stalls": r"stall",
    }
    covered, marked, missing = [], [], []
    for name, pat in aspects.items():
        hits = [ln for ln in lines if re.search(pat, ln, re.IGNORECASE)]
        if any(not _NA.search(ln) for ln in hits):
            covered.append(name)
        elif hits:
            marked.append(name)
        else:
            missing.append(name)
    if missing:
        return FAIL, f"not covered: {', '.join(missing)}"
    if not covered:
        return NA, f"all aspects marked n/a: {', '.join(marked)}"
    return PASS, f"covers {', '.join(covered)}" + (f"; marked n/a: {', '.join(marked)}" if marked else "")


def _findings(r: _Report):
    """(N/A or FAIL result, None) or (None, findings blocks)."""
    name = "Observations and Insights"
    if not r.has(name):
        return _missing(r, name), None
    if na := r.na(name):
        return (NA, na), None
    if re.search(r"no rule fired|no observations?\b", r.text(name), re.IGNORECASE) and not r.blocks(name)[0][1].strip():
        return (NA, "the report states that no observation rule fired"), None
    return None, r.blocks(name)


def check_observations_quantified(r: _Report):
    res, blocks = _findings(r)
    if res:
        return res
    bad = [h for h, t in blocks if not (_NUM.search(t) or _NUM.search(re.sub(r"^\d+\.\s*", "", h)))]
    if bad:
        return FAIL, f"no number in: {_clip(', '.join(bad), 80)}"
    return PASS, f"{len(blocks)} findings, each with numbers"


def check_surprises_noted(r: _Report):
    res, _ = _findings(r)
    if res:
        return res
    for line in r.prose("Observations and Insights", "Executive Summary") + r.text("Execution Story").splitlines():
        if _SURPRISE.search(line):
            return PASS, _clip(line.strip(), 90)
    return FAIL, "nothing is called out as unexpected (surprise, outlier, anomaly, despite, ...)"


def check_implications(r: _Report):
    res, blocks = _findings(r)
    if res:
        return res
    bad = [
        h
        for h, t in blocks
        if not (re.search(r"implication", t, re.IGNORECASE) and re.search(r"recommend", t, re.IGNORECASE))
    ]
    if bad:
        return FAIL, f"no implication or recommendation in: {_clip(', '.join(bad), 80)}"
    return PASS, f"{len(blocks)} findings, each with an implication and a recommendation"


def _commands(r: _Report, name: str) -> list[str]:
    """Command lines of a section: lines of its shell fences (comments dropped), ``$ `` lines."""
    out = [
        " ".join(ln.split("  #")[0].split())
        for f in r.doc.fences
        if f.section == name and f.lang in SHELL_LANGS
        for ln in f.lines
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    return out + [" ".join(ln.strip()[2:].split()) for ln in r.prose(name) if ln.strip().startswith("$ ")]


def check_actions_log(r: _Report):
    name = "Actions Log"
    if not r.has(name):
        return _missing(r, name)
    if na := r.na(name):
        return NA, na
    d = r.doc
    idx = list(d.sections[name])
    actions = [k for k, i in enumerate(idx) if not d.in_fence[i] and re.search(r"\bAction\s+\d", d.lines[i])]
    cmds = _commands(r, name)
    if not cmds:
        return FAIL, "no command recorded"
    for a, b in zip(actions, actions[1:] + [len(idx)], strict=True):
        if not any(d.in_fence[i] or d.lines[i].strip().startswith("$ ") for i in idx[a + 1 : b]):
            return FAIL, f"no command for {_clip(d.lines[idx[a]].strip(), 60)!r}"
    return PASS, f"{len(cmds)} commands" + (f" for {len(actions)} actions" if actions else "")


def check_code_diffs(r: _Report):
    nine = check_actions_log(r)
    if nine[0] == NA:
        return NA, f"no actions log ({nine[1]})"
    if any(f.lang in ("diff", "patch") for f in r.doc.fences):
        return PASS, "diff included"
    unmodified = next(
        (
            ln.strip()
            for k, ln in enumerate(r.doc.lines)
            if not r.doc.in_fence[k]
            and re.search(r"no (code )?(modifications|changes)\b|unmodified|not modified", ln, re.IGNORECASE)
        ),
        None,
    )
    if unmodified:
        return NA, _clip(unmodified)
    if no_diff := r.na_line(r"\bdiff\b"):
        return NA, no_diff  # the input holds no diff (e.g. a capture that did not record it)
    if re.search(
        r"uncommitted changes|modified|modification|patch",
        "\n".join(r.prose("Actions Log", "Environment")),
        re.IGNORECASE,
    ):
        return FAIL, "modifications are mentioned but no diff is included"
    if unknown := r.na_line(r"repositor|commit"):
        return NA, unknown
    return FAIL, "no diff and no statement that the code was not modified"


def check_reproduction_tested(r: _Report):
    name = "Reproduction Guide"
    if not r.has(name):
        return _missing(r, name)
    if na := r.na(name):
        return NA, na
    cmds = _commands(r, name)
    if not cmds:
        return FAIL, "no command in the guide"
    ran = set(_commands(r, "Actions Log")) | set(_commands(r, "Appendix"))
    if ran.intersection(cmds):
        return PASS, "a guide command is the one recorded as run"
    if re.search(r"verified|tested", r.text(name), re.IGNORECASE):
        return PASS, "the guide states it was verified"
    return FAIL, "none of its commands is recorded as run, and it does not say it was verified"


def check_artifacts(r: _Report):
    d = r.doc
    for k, line in enumerate(d.lines):
        if d.in_fence[k] or not re.search(r"\b(Inputs|Artifacts)\b", line):
            continue
        for ln in d.lines[k + 1 : k + 40]:
            if re.search(r"`[^`]*(/|\.\w+)[^`]*`", ln) or re.search(r"[\w.-]+/[\w./-]+", ln):
                return PASS, f"{_clip(line.strip(' #*'), 40)}: {_clip(ln.strip(), 70)}"
    return FAIL, "no 'Inputs' or 'Artifacts' list with paths"


def _chart_with(r: _Report, pattern: str, *, axis: bool = False) -> Fence | None:
    rx = re.compile(pattern, re.IGNORECASE)
    for f in r.charts():
        body = "\n".join(f.lines)
        if rx.search(body) and (not axis or any(_AXIS.search(ln) for ln in f.lines)):
            return f
    return None


def _image_with(r: _Report, pattern: str) -> str | None:
    return next((p for p in r.images() if re.search(pattern, p, re.IGNORECASE)), None)


def check_timeline_chart(r: _Report):
    f = next(
        (f for f in r.charts() if any(_AXIS.search(ln) for ln in f.lines) and any("│" in ln for ln in f.lines)), None
    )
    if f:
        return PASS, f"timeline chart in {f.section} (line {f.start + 1})"
    if na := r.na("Visualizations") or r.na_line(r"timeline"):
        return NA, na
    return FAIL, "no chart with a time axis and lanes"


def check_breakdown_chart(r: _Report):
    d = r.doc
    for f in r.charts():
        bars = [ln for ln in f.lines if re.search(r"[█#▌]{1,}\s+.*\d", ln)]
        context = "\n".join(list(f.lines[:1]) + [d.lines[k] for k in range(max(0, f.start - 3), f.start)])
        if len(bars) >= 2 and re.search(r"breakdown|categor|GPU time|op time", context, re.IGNORECASE):
            return PASS, f"breakdown chart in {f.section} (line {f.start + 1}), {len(bars)} bars"
    if na := r.na("Visualizations"):
        return NA, na
    return FAIL, "no bar chart of GPU time by category or kernel"


def check_memory_chart(r: _Report):
    relevant = re.search(
        r"peak (allocated|reserved)|memory samples|allocated and reserved|memory usage",
        "\n".join(r.doc.lines),
        re.IGNORECASE,
    )
    if not relevant:
        return NA, "the report shows no GPU memory usage samples"
    f = _chart_with(r, r"memory|allocated|reserved", axis=True)
    if f:
        return PASS, f"memory chart in {f.section} (line {f.start + 1})"
    if img := _image_with(r, r"mem"):
        return PASS, f"memory plot {img}"
    if na := r.na_line(r"memory (usage|timeline)"):
        return NA, na
    return FAIL, f"the report gives memory usage ({relevant.group(0)!r}) but no memory-over-time chart"


def check_warp_stalls_chart(r: _Report):
    if res := _hw_na(r):
        return res if res[0] == NA else (NA, "no Hardware Behavior Analysis section")
    f = _chart_with(r, r"stall")
    if f:
        return PASS, f"stall chart in {f.section} (line {f.start + 1})"
    if img := _image_with(r, r"stall"):
        return PASS, f"stall plot {img}"
    if na := r.na_line(r"stall"):
        return NA, na
    return FAIL, "kernel metrics given but no warp stall chart"


def check_roofline_chart(r: _Report):
    f = _chart_with(r, r"roofline")
    if f:
        return PASS, f"roofline chart in {f.section} (line {f.start + 1})"
    if img := _image_with(r, r"roofline"):
        return PASS, f"roofline plot {img}"
    if na := r.na_line(r"roofline"):
        return NA, na
    if {"Visualizations", "Hardware Behavior Analysis"} <= r.left_out:
        return NA, "no kernels to place: " + _left_out_reason("Hardware Behavior Analysis")
    return FAIL, "no roofline chart and no line saying why it is n/a"


def check_multigpu_chart(r: _Report):
    text = "\n".join(ln for k, ln in enumerate(r.doc.lines) if not r.doc.in_fence[k])
    # The run's width, not the machine's: a host with 4 GPUs running one process is not distributed.
    sizes = [int(x or y) for x, y in re.findall(r"world size (\d+)|(\d+) GPUs\*\*", text, re.IGNORECASE)]
    if not any(n > 1 for n in sizes) and not re.search(r"\branks? \d+\s*(-|\.\.|to|and)\s*\d+|\d+ ranks\b", text):
        return NA, "single GPU: the report states no world size above 1"
    for f in r.charts():
        lanes = {m.group(2) for ln in f.lines for m in [re.match(r"\s*(gpu|rank)\s*(\d+)\b.*", ln, re.IGNORECASE)] if m}
        if len(lanes) >= 2:
            return PASS, f"chart with {len(lanes)} GPU/rank lanes in {f.section} (line {f.start + 1})"
    if na := r.na_line(r"multi-?GPU|rank"):
        return NA, na
    return FAIL, "the run is distributed but no chart has lanes for several GPUs/ranks"


def check_interactive_tools(r: _Report):
    m = _TOOLS.search("\n".join(r.doc.lines))
    if m:
        return PASS, f"names {m.group(0)}"
    if "Visualizations" in r.left_out:
        return NA, "no timeline to explore: " + _left_out_reason("Visualizations")
    return FAIL, "no interactive tool named (Perfetto, chrome://tracing, TensorBoard, Nsight UI)"


_RULES = {
    "S1": check_structure,
    "S2": check_fences_closed,
    "S3": check_chart_width,
    "S4": check_tables,
    "1": check_summary_quantified,
    "2": check_story_steps,
    "3": check_timing_correlation,
    "4": check_hardware_interpreted,
    "5": check_kernel_aspects,
    "6": check_observations_quantified,
    "7": check_surprises_noted,
    "8": check_implications,
    "9": check_actions_log,
    "10": check_code_diffs,
    "11": check_reproduction_tested,
    "12": check_artifacts,
    "13.1": check_timeline_chart,
    "13.2": check_breakdown_chart,
    "13.3": check_memory_chart,
    "13.4": check_warp_stalls_chart,
    "13.5": check_roofline_chart,
    "13.6": check_multigpu_chart,
    "14": check_interactive_tools,
}


# ------------------------------------------------------------------ entry points


def check_text(text: str, *, path: str = "report.md") -> Checklist:
    """Evaluate every item against the report ``text``."""
    r = _Report(parse(text))
    if not r.doc.sections:
        raise TraceFormatError(
            path,
            "a Markdown report with '## ' sections (the story report's structure)",
            "no '## ' heading outside code fences",
        )
    results: dict[str, tuple[str, str]] = {}
    for number, _ in ITEMS:
        if number != "13":
            results[number] = _RULES[number](r)
    subs = [results[n] for n, _ in ITEMS if n.startswith("13.")]
    if not r.charts() and not r.images():
        results["13"] = (FAIL, "no chart or image in the report")
    elif any(s == FAIL for s, _ in subs):
        results["13"] = (
            FAIL,
            "sub-items failed: " + ", ".join(n for n, _ in ITEMS if n.startswith("13.") and results[n][0] == FAIL),
        )
    elif all(s == NA for s, _ in subs):
        results["13"] = (NA, "every visualization sub-item is n/a")
    else:
        results["13"] = (PASS, f"{len(r.charts())} charts, {len(r.images())} images; no sub-item failed")
    return Checklist(path, tuple(ItemResult(n, t, *results[n]) for n, t in ITEMS))


def check_file(path) -> Checklist:
    """Evaluate a report file; unreadable or non-Markdown input raises TraceFormatError."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as e:
        raise TraceFormatError(p, "a readable Markdown report", e.strerror or str(e)) from None
    except UnicodeDecodeError as e:
        raise TraceFormatError(p, "UTF-8 Markdown text", f"undecodable bytes at offset {e.start}") from None
    return check_text(text, path=str(p))


def render_text(c: Checklist) -> list[str]:
    """One line per item: number, status, item text, reason; then the counts."""
    out = [f"report checklist for {c.path}"]
    for i in c.items:
        out.append(f"{i.number:>5}  {i.status:<4}  {i.text} - {i.reason}")
    n = c.counts()
    out.append(f"{n[PASS]} PASS, {n[FAIL]} FAIL, {n[NA]} N/A")
    return out
