"""Integer columns of a SQLite rowid table read straight from the file's B-tree pages with numpy.

Why
---
Going through SQLite costs ~40 ns per value in its virtual machine (measured: a bare
``SELECT max(c1), ..., max(c17)`` over 2 M kernel rows takes 1.4 s) before Python sees a
value. Nsight Systems activity tables are plain rowid tables of small integer records, so the
records can be decoded for all rows at once with a few numpy gathers per column instead.

Model (the SQLite file format, https://www.sqlite.org/fileformat.html)
-----------------------------------------------------------------------
* The file is a sequence of pages of ``page_size`` bytes (header offset 16; 1 means 65536),
  page ``p`` (1-based) at byte ``(p - 1) * page_size``; the usable size ``U`` is the page size
  minus the reserved bytes (header offset 20).
* A table is a B-tree rooted at ``sqlite_master.rootpage``. Interior pages (type 0x05) hold
  cells ``(left child page u32, rowid key varint)`` plus a right-most child in the page header;
  all leaves (type 0x0D) are at the same depth, so walking the tree level by level, children in
  cell order then the right-most one, lists the leaves in rowid order.
* A leaf page has a cell count (u16 at header offset 3) and a cell pointer array (u16 offsets
  from the page start) after its 8-byte header. A cell is ``payload size varint, rowid varint,
  record``; a record is ``header size varint, one serial type varint per column, values``.
* Serial types: 0 NULL, 1/2/3/4/5/6 big-endian two's-complement integers of 1/2/3/4/6/8 bytes,
  7 a float, 8 and 9 the constants 0 and 1, >= 12 blobs and text of ``(t - 12) // 2`` bytes.

Decoding, for one step of ~1 MiB of leaves at a time (small enough for the gathers to stay in
the L2 cache): every record's start is computed once from the cell pointers and the two
leading varints; the record headers (serial types) of all rows are gathered 8 bytes at a time
into a byte matrix; walking the columns up to the last one asked for, a running offset adds
each column's width, and a value is read through a big-endian 8-byte window at any byte offset
(a strided view of the page buffer), shifted right arithmetically by ``64 - 8 * width`` bits,
which also sign-extends. Steps are decoded by a small thread pool (numpy releases the GIL in
the gathers) and copied into the output columns in leaf order.

Limits (then :func:`read_columns` returns ``None`` and the caller uses SQLite)
-------------------------------------------------------------------------------
Only what is verified is decoded; anything else falls back: a WAL journal next to the file,
a page that is not a table B-tree page, a record whose payload spills to overflow pages, a
record header that is not exactly one byte per column (text longer than 57 bytes, rows from
before an ``ALTER TABLE ADD COLUMN``), a float or text value in a column asked for, a column
that aliases the rowid, or a row count that differs from SQLite's ``count(*)``. NULL is read as
-1, like the SQLite path. Besides the output columns, memory holds at most two steps per
thread (``_CHUNK_BYTES`` of pages each, plus that step's per-row index arrays and values).
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

# ~1 MiB of pages per step keeps a step's gathers in the L2 cache (4x faster than 16 MiB).
_CHUNK_BYTES = 1 << 20
_THREADS = 4
_LEAF, _INTERIOR = 0x0D, 0x05

# Serial type -> value width in bytes (types 0..127; only single-byte serial types are read).
_WIDTH = np.zeros(128, np.int64)
_WIDTH[1:7] = (1, 2, 3, 4, 6, 8)
_WIDTH[7] = 8
_WIDTH[12:] = (np.arange(12, 128) - 12) // 2
# Right shift that keeps the top `width` bytes of a big-endian 8-byte window.
_SHIFT = np.where((_WIDTH > 0) & (_WIDTH <= 8), 64 - 8 * _WIDTH, 0).astype(np.int64)
_SHIFT[0] = _SHIFT[8] = _SHIFT[9] = 0


class _Unsupported(Exception):
    """The fast path does not apply; the caller reads through SQLite."""


def read_columns(path: Path, root_page: int, n_columns: int, wanted: dict[str, int], expected_rows: int,
                 rowid_alias: int | None = None, dtypes: dict[str, type] | None = None) -> dict[str, np.ndarray] | None:
    """``key -> column`` (NULL as -1, rowid order) for ``wanted`` = ``key -> column index`` of a
    rowid table with ``n_columns`` columns rooted at ``root_page``, int64 unless ``dtypes`` names
    a narrower type (values are cast as numpy casts); ``None`` when a record or page is outside
    what this reader verifies (see the module docstring)."""
    if not wanted or (rowid_alias is not None and rowid_alias in wanted.values()) or sys.byteorder != "little":
        return None  # (the byte tricks below assume a little-endian machine)
    wal = Path(str(path) + "-wal")
    if wal.exists() and wal.stat().st_size > 0:
        return None  # committed pages may live in the journal
    try:
        with open(path, "rb", buffering=0) as f:
            return _read(f, root_page, n_columns, wanted, expected_rows, dtypes or {})
    except (_Unsupported, OSError, IndexError, ValueError):
        return None


def _read(f, root_page: int, n_columns: int, wanted: dict[str, int], expected_rows: int,
          dtypes: dict[str, type]) -> dict[str, np.ndarray]:
    head = os.pread(f.fileno(), 100, 0)
    if len(head) < 100 or head[:16] != b"SQLite format 3\x00" or head[18] > 1 or head[19] > 1:
        raise _Unsupported  # read/write versions 2 = WAL mode
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    usable = page_size - head[20]
    if n_columns + 1 >= 128 or usable < 480:
        raise _Unsupported
    leaves = _leaf_pages(f, root_page, page_size)
    out = {k: np.empty(expected_rows, dtypes.get(k, np.int64)) for k in wanted}
    per_chunk = max(1, _CHUNK_BYTES // page_size)
    spans = [leaves[i:i + per_chunk] for i in range(0, len(leaves), per_chunk)]

    local = threading.local()

    def decode(pages: np.ndarray) -> tuple[dict[str, np.ndarray], int]:
        # One page buffer per thread for the whole read. A fresh buffer per step lets malloc
        # give the heap back and fault it in again every step (measured on 2 M kernel rows:
        # 132 000 minor page faults instead of 14 000, +0.3 s of system time).
        if not hasattr(local, "buf"):
            local.buf = np.empty(per_chunk * page_size + 8, np.uint8)
        buf = _read_pages(f, pages, page_size, local.buf)
        return _decode_leaves(buf, len(pages), page_size, usable, n_columns, wanted)

    row = 0

    def place(cols: dict[str, np.ndarray], n: int) -> None:
        nonlocal row
        if row + n > expected_rows:
            raise _Unsupported
        for k, v in cols.items():
            out[k][row:row + n] = v
        row += n

    workers = max(1, min(len(spans), os.cpu_count() or 1, _THREADS))
    if workers == 1:
        for pages in spans:
            place(*decode(pages))
    else:
        # numpy releases the GIL in the gathers. At most 2 steps per thread are in flight, so
        # the memory held besides the output columns stays a few steps' worth.
        with ThreadPoolExecutor(workers) as pool:
            pending: deque = deque()
            try:
                for pages in spans:
                    pending.append(pool.submit(decode, pages))
                    if len(pending) >= 2 * workers:
                        place(*pending.popleft().result())
                while pending:
                    place(*pending.popleft().result())
            except BaseException:
                for fut in pending:
                    fut.cancel()
                raise
    if row != expected_rows:
        raise _Unsupported
    return out


def _leaf_pages(f, root: int, page_size: int) -> np.ndarray:
    """Leaf page numbers of the B-tree at ``root``, in key order (level-order walk). Only
    interior pages are read here; the leaves' page type is checked when they are decoded."""
    level = np.array([root], np.int64)
    for _ in range(64):  # a B-tree of 2**64 rows is not this deep
        if (level <= 1).any():
            raise _Unsupported  # page 1 is sqlite_master's
        # all leaves are at one depth: the first page of a level tells what the level is
        kind = _read_pages(f, level[:1], page_size)[0]
        if kind == _LEAF:
            return level
        if kind != _INTERIOR:
            raise _Unsupported
        buf = _read_pages(f, level, page_size)
        if not (buf[np.arange(len(level)) * page_size] == _INTERIOR).all():
            raise _Unsupported
        children = []
        for i in range(len(level)):  # one iteration per interior page, not per row
            page = buf[i * page_size:(i + 1) * page_size]
            n = int(page[3]) << 8 | int(page[4])
            ptr = page[12:12 + 2 * n].view(">u2").astype(np.int64)
            cell = (ptr[:, None] + np.arange(4)).reshape(-1)
            children.append(page[cell].view(">u4").astype(np.int64))
            children.append(np.array([int.from_bytes(page[8:12].tobytes(), "big")], np.int64))
        level = np.concatenate(children)
    raise _Unsupported


def _read_pages(f, pages: np.ndarray, page_size: int, into: np.ndarray | None = None) -> np.ndarray:
    """The pages concatenated in the given order, plus 8 zero bytes for the 8-byte windows
    (at the start of ``into`` when given: a buffer at least that large)."""
    size = len(pages) * page_size + 8
    buf = np.empty(size, np.uint8) if into is None else into[:size]
    buf[-8:] = 0
    view = memoryview(buf)
    # runs of consecutive page numbers are read with one call each
    breaks = np.flatnonzero(np.diff(pages) != 1) + 1
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), len(pages)]
    for a, b in zip(starts, ends):
        got = os.preadv(f.fileno(), [view[a * page_size:b * page_size]], (int(pages[a]) - 1) * page_size)
        if got != (b - a) * page_size:
            raise _Unsupported  # truncated file
    return buf


def _window(buf: np.ndarray, dtype: str) -> np.ndarray:
    """``w[i]`` = the value of ``dtype`` stored at byte ``i`` of ``buf`` (any alignment)."""
    size = np.dtype(dtype).itemsize
    return np.ndarray(shape=(len(buf) - size + 1,), dtype=dtype, buffer=buf, strides=(1,))


def _decode_leaves(buf: np.ndarray, n_pages: int, page_size: int, usable: int, n_columns: int,
                   wanted: dict[str, int]) -> tuple[dict[str, np.ndarray], int]:
    base = np.arange(n_pages, dtype=np.int64) * page_size
    if not (buf[base] == _LEAF).all():
        raise _Unsupported
    u16, u64 = _window(buf, ">u2"), _window(buf, "<u8")
    ncell = u16[base + 3].astype(np.int64)
    n = int(ncell.sum())
    # cell k of page i: its pointer (u16 from the page start) is at base_i + 8 + 2k
    page_base = np.repeat(base, ncell)
    k = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(ncell) - ncell, ncell)
    cell = page_base + u16[page_base + 8 + 2 * k]
    # payload size: a varint of at most 3 bytes here (larger payloads overflow anyway)
    w = u64[cell]
    b0, b1, b2 = w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF
    c0, c1 = b0 >> 7, b1 >> 7
    if (c0 & c1 & (b2 >> 7)).any():
        raise _Unsupported
    payload = np.where(c0 == 0, b0, np.where(c1 == 0, ((b0 & 0x7F) << 7) | b1,
                                             ((b0 & 0x7F) << 14) | ((b1 & 0x7F) << 7) | b2)).astype(np.int64)
    if (payload > usable - 35).any():
        raise _Unsupported  # spills to overflow pages
    rec = cell + (1 + c0 + (c0 & c1)).astype(np.int64)
    rec += _varint_length(u64[rec])  # skip the rowid
    if not (buf[rec] == n_columns + 1).all():
        raise _Unsupported  # multi-byte serial types or a different column count
    if (rec + payload > page_base + usable).any():
        raise _Unsupported  # a cell pointer or size that does not fit its page
    del page_base, k, w, b0, b1, b2, c0, c1, payload
    # serial types of columns 0..last for every row: one 8-byte gather per 8 columns, seen as
    # an (n, 8 * words) byte matrix (little-endian words keep the bytes in file order)
    last = max(wanted.values())
    words = last // 8 + 1
    heads = np.empty((n, words), np.uint64)
    for i in range(words):
        heads[:, i] = u64[rec + 1 + 8 * i]
    types = heads.view(np.uint8)
    by_index: dict[int, list[str]] = {}
    for key, j in wanted.items():
        by_index.setdefault(j, []).append(key)
    i64 = _window(buf, ">i8")
    off = rec + (n_columns + 1)  # where the values start (a new array: updated in place below)
    out = {}
    for j in range(last + 1):
        t = types[:, j]
        lo, hi = int(t.min()), int(t.max())
        if j in by_index:
            out.update(dict.fromkeys(by_index[j], _values(i64, off, t, lo, hi)))
        if j < last:
            off += int(_WIDTH[lo]) if lo == hi else _WIDTH[t]
    return out, n


def _varint_length(w: np.ndarray) -> np.ndarray:
    """Byte length (1..9) of the varints whose first 8 bytes are ``w`` (little-endian words)."""
    length = np.ones(len(w), np.int64)
    going = (w >> np.uint64(7)) & np.uint64(1)
    for k in range(1, 9):
        if not going.any():
            break
        length += going.astype(np.int64)
        if k < 8:
            going &= (w >> np.uint64(8 * k + 7)) & np.uint64(1)
    return length


def _values(window: np.ndarray, off: np.ndarray, t: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Integer values of serial types ``t`` at byte offsets ``off`` (NULL as -1)."""
    if hi > 9 or (lo <= 7 <= hi and (lo == hi or (t == 7).any())):
        raise _Unsupported  # a float or text where an integer is expected
    if lo == hi and lo in (0, 8, 9):  # NULL, 0 or 1 in every row: no bytes to read
        return np.full(len(off), (-1, 0, 1)[(0, 8, 9).index(lo)], np.int64)
    v = window[off]
    v.byteswap(inplace=True)  # big-endian bytes -> native order, then read as native int64
    v = v.view(np.int64)
    if lo == hi:  # the usual case: one width for the whole column in this step
        v >>= int(_SHIFT[lo])
        return v
    v >>= _SHIFT[t]
    if lo == 0:
        v[t == 0] = -1
    if hi >= 8:
        v[t == 8] = 0
        v[t == 9] = 1
    return v
