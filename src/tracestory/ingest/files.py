"""Reading input files into memory, gzip or not, with one clear error for unreadable ones."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from ..errors import TraceFormatError


def read_bytes(path: Path) -> bytes | bytearray:
    """The whole (decompressed) document. gzip is inflated into one preallocated buffer so that
    peak memory is about the decompressed size, not twice it."""
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
            f.seek(0)
            if magic != b"\x1f\x8b":
                # readinto a buffer of the file's size: f.read() can peak at twice that.
                out = bytearray(os.fstat(f.fileno()).st_size)
                n = f.readinto(out)
                del out[n:]
                return out
            size_hint = _gzip_size_hint(path)
            out = bytearray(size_hint)
            filled = 0
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while True:
                block = f.read(4 << 20)
                if not block:
                    break
                while block:
                    piece = d.decompress(block)
                    filled = _put(out, filled, piece)
                    block = d.unused_data
                    if block:  # a multi-member gzip: start the next member
                        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            filled = _put(out, filled, d.flush())
            if not d.eof:
                raise TraceFormatError(path, "a complete gzip stream", "a truncated gzip file (stream ends early)")
            del out[filled:]
            return out
    except zlib.error as e:
        raise TraceFormatError(path, "a gzip-compressed trace", f"corrupt gzip data ({e})") from None
    except OSError as e:
        raise TraceFormatError(path, "a readable file", str(e)) from None


def _put(out: bytearray, filled: int, piece: bytes) -> int:
    end = filled + len(piece)
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
