"""``nn.Module`` call ranges from a Kineto trace, for GPU time per module.

torch.profiler with ``with_stack=True`` (and ``with_modules=True``) writes one
``python_function`` event per module call, named ``nn.Module: <Class>_<k>`` (``k`` numbers the
instances of that class), with the thread and the time span of the call. :func:`load_kineto`
keeps no ``python_function`` events (they are most of a stack-traced file and only these few
name modules), so this reads them on their own: it finds the ``"nn.Module: `` names in the
decompressed document with a byte search and decodes only the events around them.

A gzip file cut short (see :mod:`.kineto`, "Truncated traces") is read up to its cut, as the
trace itself is: the module calls whose event lies before the cut.

Limits: an event is cut out of the text as the ``{...}`` around the name with at most one
level of nested object (``args``, before or after the name), which is how Kineto writes them;
anything else is skipped.
This reads the file a second time: on a multi-GB trace that costs about as much as the
decompression.
"""

from __future__ import annotations

import math
import os
import re
import zlib
from pathlib import Path

import msgspec
import numpy as np

from ..errors import TraceFormatError
from ..trace import Table
from .files import read_bytes

_NEEDLE = b'"nn.Module: '
# one JSON object holding flat values and at most one level of nested objects
_EVENT = re.compile(rb"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")


class _ModuleEvent(msgspec.Struct):
    ph: str = ""
    name: str = ""
    pid: int | str = -1
    tid: int | str = -1
    ts: float = math.nan
    dur: float = math.nan


def _as_int(v) -> int:
    if isinstance(v, int):
        return v
    digits = re.search(r"-?\d+", str(v))
    return int(digits.group()) if digits else -1


def module_ranges_from_bytes(buf: bytes | bytearray) -> Table:
    """The module calls in a decompressed Kineto document (see :func:`load_module_ranges`)."""
    view = buf  # bytes or bytearray: searched in place, never copied (it can be GBs)
    decoder = msgspec.json.Decoder(_ModuleEvent)
    starts, ends, pids, tids, names = [], [], [], [], []
    pos = view.find(_NEEDLE)
    while pos >= 0:
        lo, m = pos, None
        for _ in range(3):  # the event's own "{", or an args object written before the name
            lo = view.rfind(b"{", 0, lo)
            if lo < 0:
                break
            m = _EVENT.match(view, lo)
            if m is not None and m.end() > pos:
                break
        nxt = pos + len(_NEEDLE)
        if m is not None and m.end() > pos:
            try:
                ev = decoder.decode(m.group())
            except (msgspec.DecodeError, msgspec.ValidationError):
                ev = None
            if ev is not None and ev.ph == "X" and ev.name.startswith("nn.Module: ") \
                    and math.isfinite(ev.ts) and math.isfinite(ev.dur):
                start = int(round(ev.ts * 1000.0))
                starts.append(start)
                ends.append(start + int(round(ev.dur * 1000.0)))
                pids.append(_as_int(ev.pid))
                tids.append(_as_int(ev.tid))
                names.append(ev.name)
                nxt = max(nxt, m.end())
        pos = view.find(_NEEDLE, nxt)
    name_col = np.empty(len(names), dtype=object)
    name_col[:] = names
    return Table({"start_ns": np.asarray(starts, dtype=np.int64), "end_ns": np.asarray(ends, dtype=np.int64),
                  "pid": np.asarray(pids, dtype=np.int64), "tid": np.asarray(tids, dtype=np.int64),
                  "name": name_col})


def load_module_ranges(path: str | os.PathLike) -> Table:
    """Module calls of a Kineto trace (``.json`` / ``.json.gz``): a table with ``start_ns``,
    ``end_ns`` (integer ns, the same ``rint(us * 1000)`` as :func:`load_kineto`), ``pid``,
    ``tid`` and ``name`` (str, ``"nn.Module: BertLayer_0"``); empty when the trace was taken
    without ``with_stack``/``with_modules``. Pass it to
    :func:`tracestory.analysis.operators.operators`."""
    try:
        buf = read_bytes(Path(path))
    except TraceFormatError as e:
        if "stream ends early" not in str(e):
            raise
        buf = _inflated_to_the_cut(Path(path))   # within the size limits: read_bytes got to the cut
    return module_ranges_from_bytes(buf)


def _inflated_to_the_cut(path: Path) -> bytearray:
    """The text a gzip stream cut short inflates to (every member up to the cut)."""
    out = bytearray()
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    with open(path, "rb") as f:
        while block := f.read(4 << 20):
            out += d.decompress(block)
            while d.eof and d.unused_data:
                rest = d.unused_data
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                out += d.decompress(rest)
    return out
