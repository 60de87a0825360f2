"""Kernel classification: an ordered list of regex rules, first match wins.

Model
-----
A :class:`Taxonomy` is a display-ordered tuple of category names and an ordered tuple of
:class:`Rule`. A rule matches a GPU activity (a kernel or a memop row) when

* its ``kernel`` regex is found (``re.search``, case-insensitive) in the activity's full name,
  template arguments included, and
* when it has a ``range`` regex: the activity's launch call lies inside a CPU-side range
  (NVTX push/pop or ``record_function``, at any depth) whose name matches it (see
  :func:`tracestory.analysis.links.enclosed_by`: same thread, launch start in
  ``[start, end)``).

The first matching rule gives the category; an activity no rule matches is ``"other"``
(every taxonomy has it, last). Memops (``Memcpy HtoD (Pageable -> Device)``,
``Memset (Device)``) go through the same rules by name.

Built-in taxonomies are read from the kernel knowledge base
(:mod:`tracestory.analysis.kernel_rules`): one rule per entry, in the table's order, with the
entry's category in that taxonomy and its note (why it sits where it sits):

* ``llm`` (default): gemm, attention, norm, elementwise, reduction, softmax, embedding, rope,
  quantization, moe_routing, communication, memcpy, memset, other.
* ``moe``: the eight categories of the MoE precision study: expert_gemm, attention_gemm,
  gate_gemm, routing_permute, quant_dequant, norm, allreduce, other. Memops are "other".
  Two range rules (:data:`~tracestory.analysis.kernel_rules.MOE_RANGE_RULES`) go before the
  library GEMM rules: a GEMM launched inside a router range is gate_gemm, inside an expert
  range expert_gemm.

User rules (:func:`load_rules`, the CLI's ``--rules FILE``)::

    taxonomy = "llm"          # base (default: the one passed in, else llm)
    mode = "prepend"          # user rules first, then the base's; or "replace"
    categories = ["gate_gemm", "expert_gemm", "other"]  # required with replace
    [[rule]]
    category = "gate_gemm"
    kernel = "nvjet|gemm|cublas"
    range = "router|gate"     # optional
    note = "cuBLAS GEMMs launched inside the router"

With ``prepend``, category names the base lacks (declared or used by a rule) are added
before ``other``. With ``replace`` every rule's category must be declared; ``other`` is
added last when missing, since unmatched activities go there.

Cost: each distinct name is matched once per rule (on the name codes of the trace's string
table), then the per-name result is broadcast to the rows with the codes. Range rules add a
row mask per rule. No Python loop runs per activity row.

Limits: names are all the rules see. A decomposed (eager) RMSNorm runs as pow, mean, rsqrt and
mul kernels that a name cannot tell from other elementwise work; a range rule can. Activities
without a known launch call (no correlation, or a summary-only input) never match a range rule.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from ..errors import TraceFormatError, UsageError
from ..trace import CPU_SIDE, Trace, factorize
from .kernel_rules import MOE_RANGE_RULES, MOE_RANGE_RULES_BEFORE, RULES
from .links import enclosed_by, gpu_ops_column

OTHER = "other"
BUILTIN = ("llm", "moe")
_TOP_KEYS = {"name", "taxonomy", "mode", "categories", "rule"}
_RULE_KEYS = {"category", "kernel", "range", "note"}
_FLAGS = re.IGNORECASE


class Rule(msgspec.Struct, frozen=True):
    category: str
    kernel: str  # regex, case-insensitive, re.search in the kernel or memop name
    range: str | None = None  # regex: launch must lie inside a CPU range whose name matches
    note: str = ""  # why the rule exists


@dataclass(frozen=True)
class Taxonomy:
    name: str
    categories: tuple[str, ...]  # display order; "other" last
    rules: tuple[Rule, ...]  # ordered; first match wins; unmatched -> "other"

    def index(self, category: str) -> int:
        return self.categories.index(category)

    @classmethod
    def named(cls, name: str = "llm", rules_path: str | None = None) -> Taxonomy:
        """The built-in taxonomy ``name``, extended (or replaced) by the TOML rules file at
        ``rules_path`` when one is given: what ``--taxonomy`` and ``--rules`` ask for."""
        base = taxonomy(name)
        return load_rules(rules_path, base) if rules_path else base


class Classification(msgspec.Struct, frozen=True):
    taxonomy: Taxonomy
    kernel_category: np.ndarray  # int32 index into taxonomy.categories, one per kernels row
    memop_category: np.ndarray  # int32, one per memops row


# ----------------------------------------------------------------------------- loading


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _compile(pattern: str, path: object, where: str) -> re.Pattern:
    try:
        return re.compile(pattern, _FLAGS)
    except re.error as e:
        raise TraceFormatError(path, f"a valid regular expression in {where}", f"{pattern!r} ({_one_line(e)})") from None


def _parse_rule(item: object, i: int, path: object) -> Rule:
    where = f"[[rule]] #{i + 1}"
    if not isinstance(item, dict):
        raise TraceFormatError(path, f"{where} as a table", type(item).__name__)
    unknown = sorted(set(item) - _RULE_KEYS)
    if unknown:
        raise TraceFormatError(path, f"{where} keys among {sorted(_RULE_KEYS)}", f"unknown key(s) {unknown}")
    for key in ("category", "kernel"):
        if key not in item:
            raise TraceFormatError(path, f"{where} with a '{key}'", "none")
    for key in _RULE_KEYS & set(item):
        if not isinstance(item[key], str):
            raise TraceFormatError(path, f"{where} '{key}' as a string", f"{type(item[key]).__name__} {item[key]!r}")
    if not item["category"].strip():
        raise TraceFormatError(path, f"{where} with a non-empty 'category'", "an empty string")
    _compile(item["kernel"], path, f"{where} 'kernel'")
    if "range" in item:
        _compile(item["range"], path, f"{where} 'range'")
    return Rule(category=item["category"], kernel=item["kernel"], range=item.get("range"), note=item.get("note", ""))


def _with_other(categories: list[str]) -> tuple[str, ...]:
    cats = [c for c in dict.fromkeys(categories) if c != OTHER]
    return tuple(cats + [OTHER])


def _from_document(doc: dict, path: object, base: Taxonomy | None, default_name: str) -> Taxonomy:
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise TraceFormatError(path, f"top-level keys among {sorted(_TOP_KEYS)}", f"unknown key(s) {unknown}")
    mode = doc.get("mode", "prepend")
    if mode not in ("prepend", "replace"):
        raise TraceFormatError(path, "mode = 'prepend' or 'replace'", repr(mode))
    if "taxonomy" in doc:
        if doc["taxonomy"] not in BUILTIN:
            raise TraceFormatError(path, f"taxonomy among {list(BUILTIN)}", repr(doc["taxonomy"]))
        base = taxonomy(doc["taxonomy"])
    elif base is None and mode == "prepend":
        base = taxonomy("llm")
    declared = doc.get("categories")
    if declared is not None and (
        not isinstance(declared, list) or not all(isinstance(c, str) and c.strip() for c in declared)
    ):
        raise TraceFormatError(path, "categories as a list of non-empty strings", repr(declared))
    items = doc.get("rule", [])
    if not isinstance(items, list):
        raise TraceFormatError(path, "[[rule]] tables (an array of tables)", type(items).__name__)
    rules = [_parse_rule(item, i, path) for i, item in enumerate(items)]
    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise TraceFormatError(path, "name as a non-empty string", repr(name))

    if mode == "replace":
        if declared is None:
            raise TraceFormatError(path, "a 'categories' list with mode = 'replace'", "none")
        known = set(declared) | {OTHER}
        for i, r in enumerate(rules):
            if r.category not in known:
                raise TraceFormatError(
                    path, f"[[rule]] #{i + 1} category among the declared {declared}", repr(r.category)
                )
        return Taxonomy(name=name, categories=_with_other(declared), rules=tuple(rules))

    base_cats = [c for c in base.categories if c != OTHER]
    new = [c for c in (declared or []) + [r.category for r in rules] if c not in base.categories]
    return Taxonomy(name=name, categories=_with_other(base_cats + new), rules=tuple(rules) + base.rules)


_BUILTIN_CACHE: dict[str, Taxonomy] = {}

# Display order of the built-in categories ("other" last).
BUILTIN_CATEGORIES = {
    "llm": ("gemm", "attention", "norm", "elementwise", "reduction", "softmax", "embedding", "rope",
            "quantization", "moe_routing", "communication", "memcpy", "memset", OTHER),
    "moe": ("expert_gemm", "attention_gemm", "gate_gemm", "routing_permute", "quant_dequant", "norm",
            "allreduce", OTHER),
}


def _builtin_rules(name: str) -> tuple[Rule, ...]:
    """The knowledge base's rules with their category in taxonomy ``name`` (moe: plus its range rules)."""
    rules = []
    for kr in RULES:
        if name == "moe" and kr.implementation == MOE_RANGE_RULES_BEFORE:
            rules += [Rule(category=c, kernel=k, range=r, note=n) for c, k, r, n in MOE_RANGE_RULES]
        rules.append(Rule(category=getattr(kr, name), kernel=kr.pattern, note=kr.note))
    return tuple(rules)


def taxonomy(name: str = "llm") -> Taxonomy:
    """A built-in taxonomy: ``"llm"`` (default) or ``"moe"``, read from the kernel knowledge base."""
    if name not in BUILTIN:
        raise UsageError(f"unknown taxonomy {name!r}: expected one of {', '.join(BUILTIN)}")
    tax = _BUILTIN_CACHE.get(name)
    if tax is None:
        tax = _BUILTIN_CACHE[name] = Taxonomy(name=name, categories=BUILTIN_CATEGORIES[name],
                                              rules=_builtin_rules(name))
    return tax


def load_rules(path, base: Taxonomy | None = None) -> Taxonomy:
    """A taxonomy from a user TOML rules file (format in the module docstring).

    ``base`` is the taxonomy the rules extend when the file names none (default ``llm``).
    The result is named by the file's ``name`` key, else ``"<base>+<file stem>"`` (prepend)
    or ``"<file stem>"`` (replace).
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise UsageError(f"{p}: cannot read the rules file ({_one_line(e.strerror or e)})") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TraceFormatError(p, "a TOML rules file", _one_line(e)) from None
    mode = doc.get("mode", "prepend")
    base_name = doc.get("taxonomy") or (base.name if base is not None else "llm")
    default_name = p.stem if mode == "replace" else f"{base_name}+{p.stem}"
    return _from_document(doc, p, base, default_name)


# ----------------------------------------------------------------------------- matching

# Case-insensitive search, made fast: CPython's IGNORECASE matching of long alternations is about
# four times slower than a case-sensitive search of the lowered pattern in the lowered name. The
# two agree for ASCII names and patterns without uppercase escapes (\D, \W, \S, \B, \A, \Z, \N)
# named groups or inline flags; anything else takes the IGNORECASE path.
_UNSAFE_TO_LOWER = re.compile(r"\\[A-Z]|\(\?P|\(\?[a-zA-Z]+-?[a-zA-Z]*[:)]|\(\?-[a-zA-Z]+:")


class NameMatcher:
    """``search(name)``: is ``pattern`` found in ``name``, case-insensitively (first match semantics).

    Each of the two regexes is compiled on its first use: the tables of patterns built at import
    (kernel families, ~60 rules) cost nothing until a name is matched, and the IGNORECASE one is
    compiled only for a non-ASCII name or a pattern unsafe to lower."""

    __slots__ = ("_pattern", "_lower", "_icase", "_safe")

    def __init__(self, pattern: str):
        self._pattern = pattern
        self._safe: bool | None = None   # may the lowered pattern be searched in the lowered name?
        self._lower: re.Pattern[str] | None = None
        self._icase: re.Pattern[str] | None = None

    def search(self, name: str, lowered: str | None = None) -> bool:
        """``lowered``: ``name.lower()`` when the caller has it (ASCII names only)."""
        if self._safe is None:
            self._safe = _UNSAFE_TO_LOWER.search(self._pattern) is None
        if self._safe and name.isascii():
            if self._lower is None:
                self._lower = re.compile(self._pattern.lower())
            return self._lower.search(name.lower() if lowered is None else lowered) is not None
        if self._icase is None:
            self._icase = re.compile(self._pattern, _FLAGS)
        return self._icase.search(name) is not None



def classify_name(name: str, tax: Taxonomy) -> str:
    """Category of one name. Range rules are skipped: one name has no launch context."""
    lowered = name.lower()
    for rule in tax.rules:
        if rule.range is None and NameMatcher(rule.kernel).search(name, lowered):
            return rule.category
    return OTHER


def _cpu_range_rows(trace: Trace, pattern: str) -> np.ndarray:
    """Rows of ``trace.ranges`` on the CPU side whose name matches ``pattern``."""
    r = trace.ranges
    if len(r) == 0:
        return np.zeros(0, dtype=np.int64)
    cpu = r["side"] == CPU_SIDE
    codes = np.unique(r["name"][cpu])
    rx = re.compile(pattern, _FLAGS)
    hit_codes = np.array([c for c in codes.tolist() if rx.search(trace.name(c))], dtype=r["name"].dtype)
    return np.flatnonzero(cpu & np.isin(r["name"], hit_codes))


def classify(trace: Trace, tax: Taxonomy) -> Classification:
    """Category index of every kernel and memop row of ``trace`` under ``tax``."""
    cat_index = {c: i for i, c in enumerate(tax.categories)}
    other = cat_index[OTHER]
    nk = len(trace.kernels)
    codes = gpu_ops_column(trace, "name").astype(np.int64)
    uniq, inv = factorize(codes)
    names = [trace.name(c) for c in uniq.tolist()]
    lowered = [n.lower() for n in names]
    out = np.full(len(codes), -1, dtype=np.int32)

    rules = tax.rules
    i = 0
    while i < len(rules):
        if rules[i].range is None:
            # A run of plain rules: the first match per distinct name, then broadcast.
            j = i
            while j < len(rules) and rules[j].range is None:
                j += 1
            compiled = [(NameMatcher(r.kernel), cat_index[r.category]) for r in rules[i:j]]
            per_name = np.full(len(uniq), -1, dtype=np.int32)
            for k, name in enumerate(names):
                low = lowered[k]
                for rx, c in compiled:
                    if rx.search(name, low):
                        per_name[k] = c
                        break
            cand = per_name[inv]
            take = (out < 0) & (cand >= 0)
            out[take] = cand[take]
            i = j
            continue
        rule = rules[i]
        i += 1
        rx = NameMatcher(rule.kernel)
        name_hit = np.fromiter((rx.search(n, low) for n, low in zip(names, lowered, strict=True)), dtype=bool,
                               count=len(names))
        mask = (out < 0) & name_hit[inv]
        if not mask.any():
            continue
        rows = _cpu_range_rows(trace, rule.range)
        if len(rows) == 0:
            continue
        inside = np.concatenate([enclosed_by(trace, trace.kernels, rows), enclosed_by(trace, trace.memops, rows)])
        mask &= inside
        out[mask] = cat_index[rule.category]

    out[out < 0] = other
    return Classification(taxonomy=tax, kernel_category=out[:nk].copy(), memop_category=out[nk:].copy())
