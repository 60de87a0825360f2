"""The floor of a msgspec read of Kineto events, per GiB of JSON text: the parse with every field
skipped, and tracestory's typed decode (``ingest.kineto``'s tagged union), on one slice of a trace.

Usage: ``PYTHONPATH=src python3 benchmarks/kineto_floor.py FILE.json [MiB]`` (plain JSON with
Kineto's indented layout or one line; the slice starts 100 MiB in, or at 0 for a smaller file).
The best of three decodes is reported; freeing the objects is not timed.
"""

from __future__ import annotations

import gc
import sys
import time

import msgspec

from tracestory.ingest import kineto
from tracestory.ingest.kineto_text import _EVENT_BOUNDARY as BOUNDARY  # the reader's own cut


class _Skip(msgspec.Struct, gc=False):
    pass


def events_slice(path: str, mib: int) -> bytes:
    """Whole events from a slice of the file, as one JSON array."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        start = 100 << 20 if size > (100 << 20) + (mib << 20) else 0
        f.seek(start)
        text = f.read(mib << 20)
    # from the file's start, skip the objects before the events (deviceProperties is an array too)
    first = BOUNDARY.search(text, text.find(b'"traceEvents"') + 1 if start == 0 else 0)
    last = None
    for last in BOUNDARY.finditer(text):
        pass
    if first is None or last is None or first.start() == last.start():
        raise SystemExit(f"{path}: expected several trace events in {mib} MiB, found fewer")
    return b"[" + text[first.end() - 1 : last.start() + 1] + b"]"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    chunk = events_slice(argv[0], int(argv[1]) if len(argv) > 1 else 128)
    gc.disable()
    for label, typ in (("every field skipped", list[_Skip]), ("typed (tracestory)", list[kineto._LEAN])):
        decoder = msgspec.json.Decoder(typ)
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time()
            events = decoder.decode(chunk)
            best = min(best, time.process_time() - t0)
            del events
        print(f"{label}: {best / len(chunk) * (1 << 30):.2f} s per GiB ({len(chunk) >> 20} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
