"""Many ranks in: the rank traces of one distributed run, found, loaded and numbered.

Inputs (any mix, each given as a path or a glob pattern):

* a Kineto trace per rank (``rank3.trace.json.gz``, ``worker_3.json``, ...), or a rocprof (v1) JSON;
* a folder of such traces, searched recursively;
* a capture folder written by ``tracestory capture torch --torchrun N`` (it holds
  ``manifest.json`` and ``torch/rank<r>.trace.json.gz``; see :mod:`..capture.artifacts`);
* an Nsight Systems SQLite export (or ``.nsys-rep``) of a multi-process run: the loader already
  returns one Trace per process, numbered in OS pid order.

The rank of a trace, first that is known wins: ``distributedInfo.rank`` of a Kineto trace (read
by the loader into ``meta.rank``; the discovery step peeks at the first MiB of the file for it so
that a parallel map can be planned without loading), then the file name (``rank(\\d+)``, else
trailing digits of the name without its suffixes), then the process index of a multi-process
nsys export. Ranks are returned sorted; two traces with one rank, or several traces of which
one has no rank, are an error that names the files.

Discovery (:func:`rank_sources`) and loading (:func:`load_source`) are separate so that a worker
pool can load and summarise one source per task; :func:`load_ranks` does both in this process.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import TraceFormatError, UsageError
from ..trace import Trace
from . import refuse_timeless_kernels, sniff
from .capture_folder import load_artifact_folder
from .files import named_members, sniff_head
from .kineto import load_kineto
from .rocprof_json import load_rocprof_json
from .nsys_sqlite import load_nsys_sqlite
from .nsys_rep import export_nsys_rep

_RANK_WORD = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_TRAILING = re.compile(r"(\d+)$")
_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".trace.json.gz", ".trace.json", ".json.gz", ".json",
             ".sqlite", ".nsys-rep", ".qdrep")
_RANK_FILES = (".json", ".json.gz", ".sqlite", ".nsys-rep", ".qdrep")
_DIST_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*"?(\d+)')


@dataclass(frozen=True)
class RankSource:
    """One file to load: a Kineto trace (one rank) or an nsys export (one rank per process)."""

    path: Path
    kind: str               # "kineto", "rocprof-json", "nsys-sqlite" or "nsys-rep"
    rank_hint: int | None   # distributedInfo in the file's head, else the file name; None if neither


def rank_from_name(path: str | os.PathLike) -> int | None:
    """``rank3.trace.json.gz`` -> 3, ``worker_12.json`` -> 12; None when the name has no number."""
    name = Path(path).name
    m = _RANK_WORD.search(name)
    if m:
        return int(m.group(1))
    stem = name
    for suffix in _SUFFIXES:
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    m = _TRAILING.search(stem)
    return int(m.group(1)) if m else None


def _peek_rank(path: Path) -> int | None:
    """``distributedInfo.rank`` when it sits in the first 64 KiB of the (gzip'ed) JSON document
    (PyTorch writes it before the events: at byte 4,493 of the largest fixture, an 8-GPU trace)."""
    head = sniff_head(path)
    m = _DIST_RANK.search(head) if head else None
    return int(m.group(1)) if m else None


def _kind(path: Path) -> str | None:
    kind = sniff(path)
    return kind if kind in ("kineto", "rocprof-json", "nsys-sqlite", "nsys-rep") else None


def _files_of(raw: str | os.PathLike) -> list[Path]:
    """The rank files one command-line input stands for."""
    path = Path(raw)
    if not path.exists():
        text = str(raw)
        if any(c in text for c in "*?["):
            hits = sorted(Path(p) for p in glob.glob(text, recursive=True))
            files = [p for h in hits for p in (_files_of(h) if h.is_dir() else [h])]
            if not files:
                raise UsageError(f"{text}: the pattern matches no file")
            return files
        raise UsageError(f"{path}: no such file or folder")
    if path.is_file():
        return [path]
    if (path / "manifest.json").exists():
        folder = load_artifact_folder(path)
        have_sqlite = {p.name[: -len(".sqlite")] for p in folder.nsys_sqlite}
        reports = [p for p in folder.nsys_reports if p.name.rsplit(".", 1)[0] not in have_sqlite]
        files = list(folder.torch) + list(folder.nsys_sqlite) + reports
        if not files:
            raise UsageError(f"{path}: capture folder holds no torch or nsys trace (torch/*.json.gz, nsys/*.sqlite)")
        return files
    files = named_members(path, _RANK_FILES)
    if not files:
        raise UsageError(f"{path}: folder holds no rank traces ({', '.join(_RANK_FILES)})")
    return files


def rank_sources(inputs: Iterable[str | os.PathLike]) -> list[RankSource]:
    """Every rank file the inputs name, in rank-hint order (unknown hints last, then by path).

    Files that are not traces of a run (Nsight Compute reports, CSVs, JSON that is not a trace)
    are not rank sources: a folder's other JSON files are skipped, an explicit one is an error."""
    inputs = list(inputs)
    out: list[RankSource] = []
    seen: set[Path] = set()
    for raw in inputs:
        explicit = Path(raw).is_file()
        for f in _files_of(raw):
            key = f.resolve()
            if key in seen:
                continue
            seen.add(key)
            try:
                kind = _kind(f)
            except TraceFormatError:
                if explicit:
                    raise
                continue
            if kind is None:
                if explicit:
                    raise TraceFormatError(f, "a Kineto trace or an Nsight Systems export of one rank",
                                           "a file of another kind (Nsight Compute or CSV)")
                continue
            hint = _peek_rank(f) if kind == "kineto" else None
            if hint is None and kind in ("kineto", "rocprof-json"):
                hint = rank_from_name(f)
            out.append(RankSource(path=f, kind=kind, rank_hint=hint))
    if not out:
        raise UsageError(f"no rank traces found in {', '.join(map(str, inputs))}")
    out.sort(key=lambda s: (s.rank_hint is None, s.rank_hint if s.rank_hint is not None else 0, str(s.path)))
    return out


def load_source(source: RankSource, *, require_gpu: bool = True) -> list[Trace]:
    """The Trace(s) of one source, ranks filled in as far as this file tells them (see the
    module docstring); :func:`check_ranks` decides across sources."""
    if source.kind == "kineto":
        traces = [load_kineto(source.path, require_gpu=require_gpu)]
    elif source.kind == "rocprof-json":
        traces = [load_rocprof_json(source.path, require_gpu=require_gpu)]
    else:
        path = source.path
        if source.kind == "nsys-rep":
            path = export_nsys_rep(path)
        traces = load_nsys_sqlite(path, require_gpu=require_gpu)
    traces = refuse_timeless_kernels(source.path, traces)
    out = []
    for t in traces:
        if t.meta.rank is None:
            r = source.rank_hint if source.rank_hint is not None else rank_from_name(source.path)
            if r is not None:
                t = dataclasses.replace(t, meta=dataclasses.replace(t.meta, rank=r))
        out.append(t)
    return out


def check_ranks(ranks: Sequence[int | None], labels: Sequence[str]) -> list[int]:
    """Final ranks of items (traces or summaries) given their ranks and labels, in the input
    order: a single item without a rank is rank 0; otherwise every rank must be known and
    distinct. Raises :class:`UsageError` naming the files otherwise."""
    ranks = list(ranks)
    if len(ranks) == 1 and ranks[0] is None:
        return [0]
    missing = [labels[i] for i, r in enumerate(ranks) if r is None]
    if missing:
        raise UsageError(
            f"cannot tell the rank of {', '.join(missing)}: no distributedInfo in the trace and no rank "
            f"number in the file name (name the files rank<N>.json.gz)")
    by_rank: dict[int, list[str]] = {}
    for r, label in zip(ranks, labels):
        by_rank.setdefault(int(r), []).append(label)
    dup = {r: ls for r, ls in by_rank.items() if len(ls) > 1}
    if dup:
        r, ls = min(dup.items())
        raise UsageError(f"rank {r} appears more than once: {', '.join(ls)} (one trace per rank expected)")
    return [int(r) for r in ranks]


def _label(t: Trace) -> str:
    pid = t.meta.process_id
    return f"{t.meta.source_path} (process {pid})" if t.meta.source_format.startswith("nsys") and pid else t.meta.source_path


def load_ranks(inputs: Iterable[str | os.PathLike], *, require_gpu: bool = True) -> list[Trace]:
    """Every rank's Trace, sorted by rank, ``meta.rank`` set on each (see :func:`check_ranks`)."""
    traces = [t for s in rank_sources(list(inputs)) for t in load_source(s, require_gpu=require_gpu)]
    ranks = check_ranks([t.meta.rank for t in traces], [_label(t) for t in traces])
    out = [t if t.meta.rank == r else dataclasses.replace(t, meta=dataclasses.replace(t.meta, rank=r))
           for t, r in zip(traces, ranks)]
    return sorted(out, key=lambda t: t.meta.rank)
