"""The bounded checks that tell a serving file or a rocprof trace from a Kineto trace, apart
from the readers: :func:`~tracestory.ingest.load_inputs` asks them of every input, and the
reader of a format (with its record types) is imported only when its check says so
(:mod:`tracestory.lazy`). Each reads at most the first 64 KiB
(:func:`~tracestory.ingest.files.sniff_head`) and never parses a file of another format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from .files import SNIFF_BYTES, first_line, sniff_head

SNIFF_MARKERS = (b'"CPU HIP API"', b'"CPU HSA API"', b'"GPU Barriers', b'"HSASystemAttributes.')


def is_rocprof_head(head: bytes | None) -> bool:
    """Whether the first bytes of a JSON document are rocprof v1's (see :data:`SNIFF_MARKERS`)."""
    return bool(head) and any(m in head for m in SNIFF_MARKERS)


def is_scheduler_log(path: str | Path) -> bool:
    """Sniff rule: the first non-blank line (of the file, or of its gzip content) is a JSON
    object with ``"type": "meta"`` and an integer ``version``. At most the first 64 KiB are read
    (:func:`~tracestory.ingest.files.sniff_head`): a longer first line is not a meta line."""
    line = first_line(sniff_head(path))
    if line is None or not line.startswith(b"{") or b'"meta"' not in line:
        return False  # cheap refusal: other formats are never parsed here
    try:
        obj = msgspec.json.decode(line)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return False  # not a readable scheduler log: the trace readers say what it is
    return isinstance(obj, dict) and obj.get("type") == "meta" and is_int(obj.get("version"))


def is_int(v: Any) -> bool:
    """An integer that is not a bool (JSON ``true`` is not a version number)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_summary_file(path: str | Path) -> bool:
    """Sniff rule: a ``.json`` file under 1 MiB holding ``{"config": {...}, "summary": {"mode": ...,
    "ttft": {...}}}`` (what ``tracestory load --json`` writes, about 2 KB). Only a file whose first
    64 KiB open a JSON object naming ``"config"`` or ``"summary"`` is parsed."""
    p = Path(path)
    try:
        if not p.name.lower().endswith(".json") or p.stat().st_size > 1 << 20:
            return False
        head = sniff_head(p)
        if not head or not head.lstrip().startswith(b"{") or (b'"summary"' not in head and b'"config"' not in head):
            return False  # cheap refusal: a trace is never parsed here
        doc = json.loads(head if len(head) < SNIFF_BYTES else p.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    s = doc.get("summary") if isinstance(doc, dict) else None
    return isinstance(s, dict) and "mode" in s and isinstance(s.get("ttft"), dict)
