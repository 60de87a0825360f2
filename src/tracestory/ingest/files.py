"""The readers' common boundary: what a file is before it is opened, reading it into memory
(gzip or not) within a size limit, and how a reader states the damage it loaded around.

Refused before opening
----------------------
:func:`refuse_special` stats the path and refuses anything that is not a regular file:
opening a FIFO blocks until a writer appears, a character device (``/dev/zero``) never ends,
a socket cannot be opened at all. Every reader calls it first.

Size limit
----------
A whole-document read (:func:`read_bytes`) refuses, in one line, a file or a decompressed
stream larger than :func:`max_input_bytes`: ``TRACESTORY_MAX_INPUT_BYTES`` (bytes, ``k``/``M``/
``G``/``T`` suffixes allowed) or, unset, half the machine's physical memory (a parsed trace
needs several times its text). A file whose size is far beyond the bytes the filesystem stores
for it (a sparse file: more than 64x, above 1 GiB) is refused too: no profiler writes one, and
reading it would spend minutes on zeros.

Sniffing
--------
A format sniff or header read (:func:`sniff_head`, :func:`read_head`) reads at most
:data:`SNIFF_BYTES` (64 KiB) of the file, or of its gzip content, whatever the file's layout: a
Kineto trace written on one line is never read whole to find its "first line". What a format
needs to be recognised (a scheduler log's ``meta`` line, a telemetry header) must sit in those
bytes; a longer first line is not that format.

Damage stated
-------------
A reader that loads a damaged file around what it could not use (rows with impossible times,
a last row cut short) keeps the loaded part and states the damage: short strings with counts.
:func:`with_warnings` puts them on a :class:`~tracestory.trace.TraceMeta` (its ``warnings``
field when the model has one, else ``meta.extra["warnings"]``, which the JSON output carries)
and :func:`state` writes each as one ``FILE: warning: ...`` line through the
``tracestory.ingest`` logger (stderr unless the caller configures logging).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import stat
import zlib
from collections.abc import Sequence
from pathlib import Path

from ..errors import TraceFormatError
from ..units import fmt_bytes

log = logging.getLogger("tracestory.ingest")

_SPARSE_RATIO = 64
_SPARSE_MIN = 1 << 30
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kKMGT]?)i?B?\s*$")
_SCALE = {"": 1, "k": 1 << 10, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


# ------------------------------------------------------------------------- before opening
def refuse_special(path: str | os.PathLike) -> os.stat_result:
    """The file's ``stat`` when it is a regular file (symlinks followed); otherwise
    :class:`TraceFormatError` naming what it is, without opening it."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise TraceFormatError(path, "a readable file", e.strerror or str(e)) from None
    if not stat.S_ISREG(st.st_mode):
        what = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise TraceFormatError(path, "a regular file", what)
    return st


def max_input_bytes() -> int:
    """The largest document :func:`read_bytes` reads (see the module docstring)."""
    text = os.environ.get("TRACESTORY_MAX_INPUT_BYTES", "").strip()
    if text:
        m = _SIZE.match(text)
        if m:
            return int(float(m.group(1)) * _SCALE[m.group(2)])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def check_size(path: str | os.PathLike, st: os.stat_result, limit: int | None = None) -> None:
    """Refuse a file above the limit or a sparse one (see the module docstring)."""
    limit = max_input_bytes() if limit is None else limit
    if st.st_size > limit:
        raise TraceFormatError(path, f"a file of at most {fmt_bytes(limit)} (TRACESTORY_MAX_INPUT_BYTES)",
                               f"{fmt_bytes(st.st_size)}")
    check_sparse(path, st)


def check_sparse(path: str | os.PathLike, st: os.stat_result) -> None:
    """Refuse a sparse file (see the module docstring); the size limit is not applied: a
    streaming reader (Kineto) does not hold the whole document."""
    stored = getattr(st, "st_blocks", None)
    if stored is not None and st.st_size > _SPARSE_MIN and stored * 512 * _SPARSE_RATIO < st.st_size:
        raise TraceFormatError(path, "a file whose bytes are stored on disk",
                               f"a sparse file of {fmt_bytes(st.st_size)} holding {fmt_bytes(stored * 512)}")


# ------------------------------------------------------------------------- whole documents
def read_bytes(path: Path) -> bytes | bytearray:
    """The whole (decompressed) document. gzip is inflated into one preallocated buffer so that
    peak memory is about the decompressed size, not twice it."""
    st = refuse_special(path)
    check_size(path, st)
    limit = max_input_bytes()
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
            f.seek(0)
            if magic != b"\x1f\x8b":
                # readinto a buffer of the file's size: f.read() can peak at twice that.
                out = bytearray(st.st_size)
                n = f.readinto(out)
                del out[n:]
                return out
            size_hint = min(_gzip_size_hint(path), limit)
            out = bytearray(size_hint)
            filled = 0
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while True:
                block = f.read(4 << 20)
                if not block:
                    break
                while block:
                    piece = d.decompress(block)
                    filled = _put(out, filled, piece, limit, path)
                    block = d.unused_data
                    if block:  # a multi-member gzip: start the next member
                        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            filled = _put(out, filled, d.flush(), limit, path)
            if not d.eof:
                raise TraceFormatError(path, "a complete gzip stream", "a truncated gzip file (stream ends early)")
            del out[filled:]
            return out
    except zlib.error as e:
        raise TraceFormatError(path, "a gzip-compressed trace", f"corrupt gzip data ({e})") from None
    except MemoryError:
        raise TraceFormatError(path, "a file that fits in memory", f"{fmt_bytes(st.st_size)} on disk") from None
    except OSError as e:
        raise TraceFormatError(path, "a readable file", str(e)) from None


def inflate(path: Path, data: bytes, what: str) -> bytes:
    """``data`` (the bytes of ``path``) gunzipped when they start with the gzip magic, within
    :func:`max_input_bytes`; damaged gzip becomes :class:`TraceFormatError` naming ``what``."""
    if data[:2] != b"\x1f\x8b":
        return data
    limit = max_input_bytes()
    out, filled = bytearray(), 0
    try:
        while data:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            filled = _put(out, filled, d.decompress(data, limit + 1 - filled), limit, path)
            if d.unconsumed_tail:
                raise TraceFormatError(path, f"{what} of at most {fmt_bytes(limit)} once decompressed "
                                             "(TRACESTORY_MAX_INPUT_BYTES)", "more")
            filled = _put(out, filled, d.flush(), limit, path)
            if not d.eof:
                raise TraceFormatError(path, f"a complete gzip stream of {what}", "a truncated gzip file")
            data = d.unused_data
    except zlib.error as e:
        raise TraceFormatError(path, f"gzip-compressed {what}", f"corrupt gzip data ({e})") from None
    del out[filled:]
    return bytes(out)


def _put(out: bytearray, filled: int, piece: bytes, limit: int | None = None, path=None) -> int:
    end = filled + len(piece)
    if limit is not None and end > limit:
        raise TraceFormatError(path, f"at most {fmt_bytes(limit)} once decompressed (TRACESTORY_MAX_INPUT_BYTES)",
                               "more (a gzip bomb or a limit to raise)")
    if end > len(out):
        out.extend(b"\0" * (end - len(out) + (len(out) >> 2)))
    out[filled:end] = piece
    return end


def _gzip_size_hint(path: Path) -> int:
    """ISIZE from the gzip trailer (the size modulo 2**32): a hint only. A cut-off file ends in
    arbitrary bytes, so a hint above 1,000x the compressed size (JSON traces compress 10-30x) is
    not trusted: the buffer then starts at 8x and grows."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        n = f.tell()
        if n < 18:
            return 0
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), "little")
    return isize if n <= isize <= 1000 * n else n * 8


SNIFF_BYTES = 1 << 16


def _head(f, size: int) -> bytes:
    """At most ``size`` bytes of an open file's content, inflated when it is gzip; at most
    :data:`SNIFF_BYTES` bytes are read from the file either way."""
    head = f.read(min(size, SNIFF_BYTES))
    if head[:2] != b"\x1f\x8b":
        return head
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(head, size)
    taken = len(head)
    while len(out) < size:
        block = b""
        if not (d.eof and d.unused_data) and taken < SNIFF_BYTES:
            block = f.read(min(1 << 14, SNIFF_BYTES - taken))
            taken += len(block)
        if d.eof:                       # a multi-member gzip: the next member goes on
            rest = d.unused_data + block
            if rest[:2] != b"\x1f\x8b":
                break
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out += d.decompress(rest, size - len(out))
            continue
        if not block and not d.unconsumed_tail:
            break
        out += d.decompress(d.unconsumed_tail + block, size - len(out))
    return out


def read_head(path: str | os.PathLike, size: int = 4096) -> bytes:
    """The first ``size`` bytes (at most :data:`SNIFF_BYTES`) of the file, decompressed when it
    is gzip, for sniffing: special files refused before opening, a damaged gzip stream refused
    in one line."""
    refuse_special(path)
    try:
        with open(path, "rb") as f:
            return _head(f, min(size, SNIFF_BYTES))
    except zlib.error as e:
        raise TraceFormatError(path, "a gzip-compressed file", f"corrupt gzip data ({e})") from None
    except OSError as e:
        raise TraceFormatError(path, "a readable file", str(e)) from None


def sniff_head(path: str | os.PathLike, size: int = SNIFF_BYTES) -> bytes | None:
    """Like :func:`read_head` (``size`` bytes at most, gzip inflated) for a sniff that answers
    yes or no: None for anything that is not a readable regular file or is damaged gzip, so
    that the reader of the file's real format states what it is."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as f:
            return _head(f, size)
    except (OSError, zlib.error):
        return None


def first_line(head: bytes | None) -> bytes | None:
    """The first non-blank line of a sniffed head, or None when there is none or it does not
    end within the head (a head shorter than :data:`SNIFF_BYTES` is the whole file, so its last
    line counts as ended)."""
    if not head:
        return None
    start = len(head) - len(head.lstrip())
    end = head.find(b"\n", start)
    if end < 0:
        return head[start:] if len(head) < SNIFF_BYTES and start < len(head) else None
    return head[start:end]


# ------------------------------------------------------------------------- damage stated
def state(path: str | os.PathLike, warnings: Sequence[str]) -> None:
    """Each warning as one ``FILE: warning: ...`` line through the ``tracestory.ingest`` logger."""
    for w in warnings:
        log.warning("%s: warning: %s", path, w)


def with_warnings(meta, warnings: Sequence[str]):
    """``meta`` (a TraceMeta) carrying ``warnings``, added to any it has; unchanged when empty."""
    warnings = tuple(warnings)
    if not warnings:
        return meta
    names = {f.name for f in dataclasses.fields(meta)}
    if "warnings" in names:
        return dataclasses.replace(meta, warnings=tuple(meta.warnings or ()) + warnings)
    extra = dict(meta.extra)
    extra["warnings"] = tuple(extra.get("warnings", ())) + warnings
    return dataclasses.replace(meta, extra=extra)


def warnings_of(obj) -> tuple[str, ...]:
    """The damage a reader stated on a Trace, a TraceMeta or a KernelMetrics (empty: none)."""
    meta = getattr(obj, "meta", obj)
    own = getattr(meta, "warnings", None)
    if own:
        return tuple(own)
    extra = getattr(meta, "extra", None) or {}
    return tuple(extra.get("warnings", ()))


def named_members(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The members of ``folder`` (recursively, in name order) whose names end in one of
    ``suffixes``; one that is not a regular file (a FIFO, a folder, a dangling link) is refused
    in one line, never skipped: a rank left out would change every number without a word. Our
    own unfinished writes (``.partial-``) are not members."""
    named = [p for p in sorted(Path(folder).rglob("*")) if p.name.lower().endswith(suffixes)
             and ".partial-" not in str(p)]
    for p in named:
        if not p.is_file():
            what = ("a folder" if p.is_dir() else "a dangling link" if p.is_symlink() and not p.exists()
                    else "a special file (FIFO, socket or device)")
            raise TraceFormatError(p, "a trace file (a member of the folder named like one)", what)
    return named
