"""The text of a Kineto document as a stream of event chunks, never held whole in memory.

Model
-----
A Kineto trace is one JSON object: a few top-level keys (``schemaVersion``,
``deviceProperties``, ``distributedInfo``, ...), the ``traceEvents`` array that makes up almost
all of the bytes, and a few more keys after it. :func:`stream_document` reads the file (inflating
gzip, multi-member streams included) in a background thread, so that inflating overlaps decoding
on a second core (``zlib`` and file reads release the GIL), and hands the reader:

* the event text cut at event boundaries (``}`` ``,`` ``{``) into chunks of about ``chunk_bytes``
  of JSON, each a complete JSON array ``[ ... ]`` handed to the caller's ``decode``; a cut that
  lands inside a string (or a nested value) gives invalid JSON, ``decode`` says so, and the chunk
  is retried up to the next boundary;
* the top-level keys other than ``traceEvents`` as one small JSON object (``head`` + ``"traceEvents":
  []`` + ``tail``), decoded by the caller once the stream has ended.

Finding the parts without a JSON parser over the whole text: ``"traceEvents": [`` is taken as the
array's start only where the text before it, closed with ``"traceEvents":[]}``, is valid JSON (so
a match inside a string or a nested object is skipped). The array's end is the last ``]`` whose
following text closes the top-level object, that follows a ``}`` (or the array's ``[``), and
whose preceding text is a valid event array.

Limits of the model: the chunk buffer is reused, so what ``decode`` returns must not keep views
of the text past one chunk (the Kineto reader copies what it keeps). Progress is reported in
bytes of the file read (compressed bytes for gzip).

Truncated documents
-------------------
A file cut short (a copy stopped, a disk full, a gzip stream that ends early) is read up to the
cut: the events before it, up to the last one that decodes whole, are handed to ``decode`` as
usual, and :class:`Document` says where the text ended (``truncated_at``, bytes of JSON text;
``gzip_cut``; ``cut_after_events`` when the events array had closed before the cut and only
the keys after it are missing). The caller states the damage; a cut before any complete event
is still refused. A corrupt gzip stream (bad data, not a cut) is refused.

Limits (bad or hostile input)
-----------------------------
* Decompressed size: at most ``TRACESTORY_MAX_DECOMPRESSED`` bytes (a number, or with a K/M/G/T
  suffix: powers of 1024). Default: the larger of 64 GiB and 100x the compressed file (JSON
  traces compress 10-30x; a gzip bomb of zeros reaches about 1,000x). The text is streamed, so
  this limit bounds time, not memory.
* The text before ``traceEvents``, and any single event, may not exceed :data:`MAX_PART_BYTES`
  (64 MiB; real traces: a few KB). Memory is therefore bounded by one chunk, a few inflated
  pieces in flight and the kept columns, whatever the file holds.
* A document that does not start with ``{`` is refused at its first bytes (a bomb of zeros stops
  there). Nesting depth is bounded by the interpreter's recursion limit (``msgspec`` raises
  ``RecursionError`` past it, about 1,000 levels; Kineto nests 4-6): the reader turns that into
  a one-line error.
"""

from __future__ import annotations

import os
import queue
import re
import stat
import threading
import zlib
from pathlib import Path
from typing import Callable, Iterator, NoReturn, TypeVar

import msgspec
import numpy as np

from ..errors import TraceFormatError

MAX_DECOMPRESSED_ENV = "TRACESTORY_MAX_DECOMPRESSED"
DEFAULT_MAX_DECOMPRESSED = 64 << 30
DEFAULT_MAX_RATIO = 100
MAX_PART_BYTES = 64 << 20

READ_BYTES = 4 << 20  # compressed bytes per read
PIECE_BYTES = 8 << 20  # most inflated (or plain) bytes per piece handed over
QUEUE_PIECES = 4  # pieces in flight between the reading thread and the decoder

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_EVENT_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

Progress = Callable[[int, int], None]
T = TypeVar("T")


def max_decompressed(compressed_bytes: int, env: dict | None = None) -> int:
    """The decompressed-size limit for a gzip file of ``compressed_bytes`` (see the module doc)."""
    text = (os.environ if env is None else env).get(MAX_DECOMPRESSED_ENV, "").strip().upper()
    if not text:
        return max(DEFAULT_MAX_DECOMPRESSED, DEFAULT_MAX_RATIO * compressed_bytes)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?", text)
    if m is None:
        raise TraceFormatError(MAX_DECOMPRESSED_ENV, "a byte count such as 8G or 500000000", repr(text))
    return int(float(m.group(1)) * _SUFFIXES[m.group(2)])


# --------------------------------------------------------------------------- reading thread
def _pieces(path: Path, emit: Callable[[bytes, int], None]) -> bool:
    """Call ``emit(piece, bytes_read)`` for each piece of the document's (inflated) text; True
    when a gzip stream ended early (a cut file: what was inflated before the cut was emitted)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if f.read(2) != b"\x1f\x8b":
            f.seek(0)
            while piece := f.read(PIECE_BYTES):
                emit(piece, f.tell())
            return False
        f.seek(0)
        limit = max_decompressed(size)
        inflater, error = _inflater()
        emitted = 0

        def counted(piece: bytes, done: int) -> None:
            nonlocal emitted
            emitted += len(piece)
            emit(piece, done)

        try:
            cut = _inflate(path, f, size, limit, inflater, counted)
        except error as e:
            raise TraceFormatError(path, "a gzip-compressed trace", f"corrupt gzip data ({_zlib_says(path, e)})") from None
    if cut and error is not zlib.error:
        # ISA-L may hold back the last bytes of a stream cut mid-block: the text ends where zlib's does
        rest = bytearray()
        seen = 0

        def past(piece: bytes, done: int) -> None:
            nonlocal seen
            start = max(emitted - seen, 0)
            seen += len(piece)
            if start < len(piece):
                rest.extend(memoryview(piece)[start:])

        try:
            with open(path, "rb") as g:
                _inflate(path, g, size, limit, lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), past)
        except zlib.error:
            pass
        if rest:
            emit(bytes(rest), size)
    return cut


def _inflate(path: Path, f, size: int, limit: int, inflater: Callable, emit: Callable[[bytes, int], None]) -> bool:
    """Inflate the gzip file ``f`` (every member) into ``emit``; True when the stream ends early."""
    total = 0
    d = inflater()
    while block := f.read(READ_BYTES):
        data = block
        while True:
            piece = d.decompress(data, PIECE_BYTES)
            if piece:
                total += len(piece)
                if total > limit:
                    raise TraceFormatError(
                        path, f"at most {limit:,} bytes of JSON once decompressed ({MAX_DECOMPRESSED_ENV})",
                        f"more than that from {size:,} compressed bytes")
                emit(piece, f.tell())
            if d.eof:
                data = d.unused_data
                if not data:
                    break
                d = inflater()  # a multi-member gzip
                continue
            data = d.unconsumed_tail
            if not data and len(piece) < PIECE_BYTES:
                break
    piece = d.flush()
    if piece:
        emit(piece, size)
    return not d.eof   # a cut gzip file: the JSON text ends where the inflated bytes do


INFLATE_ENV = "TRACESTORY_INFLATE"


def _inflater() -> tuple[Callable, type[Exception]]:
    """A gzip stream's decompressor factory and its error class: ISA-L's (the ``isal`` package,
    about 3x faster than zlib here) when it is installed, unless ``TRACESTORY_INFLATE=zlib``;
    else zlib's. Both take ``decompress(data, max_length)`` and say ``eof`` /
    ``unused_data`` / ``unconsumed_tail`` alike."""
    if os.environ.get(INFLATE_ENV, "").strip().lower() != "zlib":
        try:
            from isal import isal_zlib
        except ImportError:
            pass
        else:
            return (lambda: isal_zlib.decompressobj(16 + isal_zlib.MAX_WBITS)), isal_zlib.error
    return (lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)), zlib.error


def _zlib_says(path: Path, error: Exception) -> str:
    """The message of a corrupt stream, worded by zlib whichever library found it (so that a
    refusal reads the same with or without ISA-L): zlib inflates the file again up to its error."""
    if isinstance(error, zlib.error):
        return str(error)
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        with open(path, "rb") as f:
            while block := f.read(READ_BYTES):
                data = block
                while data:
                    d.decompress(data, PIECE_BYTES)
                    if d.eof:
                        data = d.unused_data
                        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    else:
                        data = d.unconsumed_tail
    except zlib.error as e:
        return str(e)
    except OSError:
        pass
    return str(error)


class _Reader:
    """:func:`_pieces` in a background thread, through a bounded queue."""

    _END = object()

    def __init__(self, path: Path):
        self.path = path
        self.size = 0
        self.done = 0
        self.text_bytes = 0      # bytes of (inflated) JSON text handed over
        self.gzip_cut = False    # the gzip stream ended early (set before the end is signalled)
        self._q: queue.Queue = queue.Queue(maxsize=QUEUE_PIECES)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tracestory-inflate", daemon=True)

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _Stopped

    def _run(self) -> None:
        try:
            self.gzip_cut = _pieces(self.path, lambda piece, done: self._put((piece, done)))
            self._put(self._END)
        except _Stopped:
            pass
        except TraceFormatError as e:
            self._put_error(e)
        except OSError as e:
            self._put_error(TraceFormatError(self.path, "a readable file", str(e)))
        except MemoryError:
            self._put_error(TraceFormatError(self.path, "a trace that fits in memory", "more than this machine can hold"))

    def _put_error(self, e: Exception) -> None:
        try:
            self._put(e)
        except _Stopped:
            pass

    def __iter__(self) -> Iterator[bytes]:
        try:
            st = self.path.stat()
        except OSError as e:
            raise TraceFormatError(self.path, "a readable file", str(e)) from None
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            raise TraceFormatError(self.path, "a regular file", "a FIFO, device, socket or folder")
        self.size = st.st_size
        self._thread.start()
        try:
            while True:
                item = self._q.get()
                if item is self._END:
                    return
                if isinstance(item, Exception):
                    raise item
                piece, self.done = item
                self.text_bytes += len(piece)
                yield piece
        finally:
            self._stop.set()
            self._thread.join()


class _Stopped(Exception):
    """The consumer went away: the reading thread ends quietly."""


# --------------------------------------------------------------------------- cutting
class Document:
    """The top-level object around the events: :meth:`outer_json` is it with an empty
    ``traceEvents`` (complete once the stream has ended)."""

    def __init__(self):
        self.head = b""
        self.tail = b""
        # A cut document (see "Truncated documents" in the module docstring): the bytes of JSON
        # text read (the cut's offset), whether the gzip stream ended early, and whether the
        # cut fell after the events array had closed (no event lost).
        self.truncated_at: int | None = None
        self.gzip_cut = False
        self.cut_after_events = False

    def outer_json(self) -> bytes:
        return self.head + b'"traceEvents":[]' + self.tail


def stream_document(path: Path, document: Document, chunk_bytes: int, decode: Callable[[memoryview], T | None],
                    progress: Progress | None = None,
                    decode_last: Callable[[memoryview], T | None] | None = None) -> Iterator[T]:
    """``decode`` applied to each chunk of the events array, in file order; fills ``document``.

    A chunk is the JSON text ``[`` + whole events + ``]``, a view of a buffer that is reused for
    the next chunk: what ``decode`` returns must not keep views of it beyond the caller's use of
    one chunk. ``decode`` returns ``None`` for text that is not valid JSON: the cut fell inside a
    string, and the chunk is retried up to the next boundary. ``decode_last`` (default
    ``decode``) decodes the text after the last cut, where the end of the array is found by
    trying candidates: it must say ``None`` at once (a ``decode`` that hands chunks to another
    process and never says ``None`` needs one)."""
    reader = _Reader(path)
    pieces = iter(reader)
    text = _Buffer(_find_events(path, pieces, document))
    search = chunk_bytes
    for piece in pieces:
        text.append(piece)
        buf = text.buf
        while text.fill > chunk_bytes:
            m = _EVENT_BOUNDARY.search(buf, max(search, 1), text.fill)
            if m is None:
                search = max(search, text.fill - 4096)  # a boundary may straddle the next piece
                if text.fill > chunk_bytes + MAX_PART_BYTES:
                    raise TraceFormatError(path, f"trace events under {MAX_PART_BYTES >> 20} MiB each",
                                           f"{text.fill - chunk_bytes:,} bytes without an event boundary")
                break
            end, nxt = m.start() + 1, m.end() - 1  # events end with "}" at end - 1; the next "{" at nxt
            saved = buf[end]
            buf[end] = _CLOSE  # a separator byte (",", space, newline) becomes the array's "]"
            result = decode(memoryview(buf)[: end + 1])
            if result is None:
                buf[end] = saved
                search = nxt + 1
                continue
            yield result
            result = None  # the caller's objects: do not keep them alive over the next chunk
            text.keep_from(nxt)
            search = chunk_bytes
            if progress is not None:
                progress(reader.done, reader.size)
    document.gzip_cut = reader.gzip_cut
    result = _last_chunk(path, text, document, decode_last or decode)
    if document.truncated_at is not None:   # cut inside the document: it ends where the text does
        document.truncated_at = reader.text_bytes
    elif reader.gzip_cut:                   # the JSON closed: only the gzip stream's end is cut
        document.truncated_at, document.cut_after_events = reader.text_bytes, True
    if result is not None:
        yield result
    if progress is not None:
        progress(reader.size, reader.size)


class _Buffer:
    """``buf[:fill]`` is ``[`` + event text not yet decoded. One buffer for the whole stream:
    a fresh one per chunk would be paged in again each time (slow on VMs), and moving the
    remainder to the front keeps it small."""

    def __init__(self, start: bytearray):
        self.buf = start
        self.fill = len(start)

    def append(self, piece: bytes) -> None:
        end = self.fill + len(piece)
        if end > len(self.buf):
            grow = end - len(self.buf) + max(len(self.buf) // 2, len(piece))
            try:
                self.buf += bytes(grow)
            except BufferError:  # a caller still holds views of the old text: leave it to them
                new = bytearray(len(self.buf) + grow)
                new[: self.fill] = memoryview(self.buf)[: self.fill]
                self.buf = new
        self.buf[self.fill:end] = piece
        self.fill = end

    def keep_from(self, start: int) -> None:
        """Drop the text before ``start`` (decoded), keeping the leading ``[``."""
        rest = self.fill - start
        arr = np.frombuffer(self.buf, dtype=np.uint8)
        arr[1:1 + rest] = arr[start:self.fill]  # numpy copies overlapping ranges correctly
        del arr
        self.fill = 1 + rest


_CLOSE = ord("]")
_NON_SPACE = re.compile(rb"\S")
_SPACE = b" \t\r\n"
_ARRAY_END_AFTER = (ord("}"), ord("["))


def _find_events(path: Path, pieces: Iterator[bytes], document: Document) -> bytearray:
    """Read up to the start of the events array; returns ``[`` + the text after it."""
    head = bytearray()
    checked = 0
    started = False
    for piece in pieces:
        head += piece
        if not started and (first := _NON_SPACE.search(head)) is not None:
            started = True
            if head[first.start()] != ord("{"):
                _refuse_start(path, head)
        while (m := _EVENTS_KEY.search(head, checked)) is not None:
            checked = m.end()
            before = bytes(head[: m.start()])
            try:
                outer = msgspec.json.decode(before + b'"traceEvents":[]}')
            except (msgspec.DecodeError, RecursionError):
                continue
            if isinstance(outer, dict):
                document.head = before
                rest = bytearray(b"[")
                rest += memoryview(head)[m.end():]
                return rest
        checked = max(checked, len(head) - 4096)
        if len(head) > MAX_PART_BYTES:
            raise TraceFormatError(path, f"a traceEvents array within the first {MAX_PART_BYTES >> 20} MiB",
                                   f"{len(head):,} bytes without one")
    _refuse_whole(path, bytes(head))


def _refuse_start(path: Path, head: bytearray) -> None:
    text = bytes(head.lstrip()[:40])
    if text[:1] == b"[":
        raise TraceFormatError(path, "a Kineto trace (a JSON object with traceEvents)", "a JSON array at the top level")
    shown = text.decode("utf-8", "replace").strip()
    raise TraceFormatError(path, "a Kineto trace (JSON)", f"text that is not JSON (starts with {shown!r})")


def _refuse_whole(path: Path, text: bytes) -> NoReturn:
    """The whole document was read and holds no usable traceEvents array: say what it is."""
    if not text.strip():
        raise TraceFormatError(path, "a Kineto trace (JSON)", "an empty file")
    try:
        top = msgspec.json.decode(text)
    except RecursionError:
        raise TraceFormatError(path, NESTING_EXPECTED, "deeper nesting") from None
    except msgspec.DecodeError as e:
        shown = text[:40].decode("utf-8", "replace").strip()
        raise TraceFormatError(path, "a Kineto trace (JSON)", f"text that is not JSON ({e}; starts with {shown!r})") from None
    if isinstance(top, dict) and "traceEvents" in top:
        raise TraceFormatError(path, "traceEvents to be an array", f"a {type(top['traceEvents']).__name__} value")
    keys = sorted(top)[:8] if isinstance(top, dict) else []
    raise TraceFormatError(path, "a JSON object with a traceEvents array", f"an object with keys {keys} and no traceEvents")


NESTING_EXPECTED = "JSON nested at most about 1,000 levels deep (the interpreter's recursion limit)"


def _last_chunk(path: Path, text: _Buffer, document: Document, decode):
    """The stream has ended: the text is ``[`` + the last events + ``]`` + the keys after the
    array + ``}``. Finds the array's closing bracket; returns the last chunk decoded (``None``
    when it holds no event)."""
    pending = text.buf
    pos = text.fill
    closed = False
    for _ in range(64):
        pos = pending.rfind(b"]", 0, pos)
        if pos < 0:
            break
        tail = bytes(pending[pos + 1:text.fill])
        try:
            closes = isinstance(msgspec.json.decode(b'{"":0' + tail), dict)
        except (msgspec.DecodeError, RecursionError):
            closes = False
        if not closes:
            continue
        closed = True
        last = pos - 1
        while last > 0 and pending[last] in _SPACE:
            last -= 1
        if pending[last] not in _ARRAY_END_AFTER:
            continue  # the events array ends "...}]" or "[]": this "]" closes some other array
        if last == 0:
            document.tail = tail
            return None
        result = decode(memoryview(pending)[: pos + 1])
        if result is not None:
            document.tail = tail
            return result
    if closed:
        raise TraceFormatError(path, "a JSON array of trace events", "invalid JSON in traceEvents")
    return _before_the_cut(text, document, decode)


_EVENT_END = re.compile(rb"\}\s*(?=[,\]]|\s*$)")
CUT_ATTEMPTS = 256


def _before_the_cut(text: _Buffer, document: Document, decode):
    """The document ends inside ``traceEvents`` (a cut file): the events before the cut, up to
    the last one that decodes whole. Candidates are the ``}`` followed by ``,``, ``]`` or the
    end of the text, nearest the end first; one that lies inside the cut event (a nested
    object, a string) makes invalid JSON and the next is tried. ``None`` when no event of this
    last piece is complete (events of earlier chunks may have been)."""
    document.truncated_at = 0   # set to the bytes read by the caller
    document.tail = b"}"        # the keys after the events array are lost with the cut
    buf = text.buf
    ends = [m.start() for m in _EVENT_END.finditer(buf, 1, text.fill)]
    for pos in reversed(ends[-CUT_ATTEMPTS:]):
        if text.fill >= len(buf):
            text.append(b" ")
            text.fill -= 1
            buf = text.buf
        saved = buf[pos + 1]
        buf[pos + 1] = _CLOSE
        result = decode(memoryview(buf)[: pos + 2])
        buf[pos + 1] = saved
        if result is not None:
            tail = bytes(buf[pos + 1:text.fill]).lstrip()
            document.cut_after_events = tail[:1] == b"]"   # the array had closed: only later keys cut
            return result
    return None
