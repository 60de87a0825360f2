"""``ncu --csv`` exports (raw and details pages) -> reader records for :mod:`.ncu`.

Layout
------
Both pages start with the same identity columns (``"ID","Process ID","Process Name","Host Name",
"Kernel Name",...``); anything before that header (``==PROF==`` lines, the program's own output)
is skipped.

* ``--page raw``: after the identity columns, one column per metric (sorted), then a units row
  (empty cells under the identity columns), then one row per kernel.
* ``--page details``: long format with ``Section Name, Metric Name, Metric Unit, Metric Value``
  per row; rows with an empty metric name and a ``Rule Name`` are the rule results. Older ncu
  versions have no rule columns and add ``Kernel Time``; both are handled.

Values stay strings here; :func:`tracestory.ingest.ncu.build_record` parses numbers (thousands
separators) and scales units. Reader record = ``(identity dict, {name: (value, unit)}, rules)``.
"""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

from ..errors import TraceFormatError

_IDENT = {"ID": "id", "Process ID": "process_id", "Kernel Name": "name", "Context": "context",
          "Stream": "stream", "Device": "device", "CC": "cc", "Grid Size": "grid", "Block Size": "block"}
_DETAILS_COLS = ("Section Name", "Metric Name", "Metric Unit", "Metric Value")


def _read_text(path: Path) -> str:
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8", "replace")


def _header_start(text: str) -> int:
    """Offset of the header line (``"ID","Process ID"`` ...), or -1."""
    pos = 0
    for line in text.splitlines(keepends=True):
        s = line.lstrip("\ufeff")
        if s.startswith(('"ID",', "ID,")):
            return pos + (len(line) - len(s))
        pos += len(line)
    return -1


def read_csv(path: Path) -> tuple[str, list]:
    """``("ncu-csv-raw" | "ncu-csv-details", [(ident, metrics, rules), ...])``."""
    text = _read_text(path)
    start = _header_start(text)
    if start < 0:
        first = next((ln for ln in text.splitlines() if ln.strip()), "")
        raise TraceFormatError(path, 'an ncu --csv export (a header starting "ID","Process ID",...)',
                               f"a file whose first line is {first[:80]!r}" if first else "an empty file")
    rows = list(csv.reader(io.StringIO(text[start:])))
    header = rows[0]
    if "Kernel Name" not in header:
        raise TraceFormatError(path, 'an ncu --csv export with a "Kernel Name" column',
                               f"columns {header[:6]}")
    if all(c in header for c in _DETAILS_COLS):
        return "ncu-csv-details", _details(path, header, rows[1:])
    return "ncu-csv-raw", _raw(path, header, rows[1:])


def _ident(header: list[str], row: list[str]) -> dict:
    return {key: row[header.index(col)] for col, key in _IDENT.items() if col in header}


def _raw(path: Path, header: list[str], rows: list[list[str]]) -> list:
    if not rows:
        return []
    units = rows[0]
    if units and units[0].strip() != "":
        # Exported with --print-units off? No units row: every value is already what ncu printed.
        units, body = [""] * len(header), rows
    else:
        body = rows[1:]
    metric_cols = [i for i, h in enumerate(header) if h not in _IDENT and i >= header.index("Kernel Name")
                   and h not in ("Host Name", "Process Name")]
    out = []
    for r in body:
        if len(r) != len(header):
            if not any(cell.strip() for cell in r):
                continue
            raise TraceFormatError(path, f"rows of {len(header)} cells like the header",
                                   f"a row of {len(r)} cells")
        metrics = {header[i]: (r[i], units[i] if i < len(units) else "") for i in metric_cols}
        out.append((_ident(header, r), metrics, ()))
    return out


def _details(path: Path, header: list[str], rows: list[list[str]]) -> list:
    col = {h: i for i, h in enumerate(header)}
    sec, name, unit, value = (col[c] for c in _DETAILS_COLS)
    rule = col.get("Rule Name")
    kernels: dict[str, tuple[dict, dict, list]] = {}
    for r in rows:
        if len(r) < len(header) - 5 or not r[col["ID"]].strip():
            continue
        kid = r[col["ID"]]
        if kid not in kernels:
            kernels[kid] = (_ident(header, r), {}, [])
        _, metrics, rules = kernels[kid]
        if r[name].strip():
            metrics[f"{r[sec]}/{r[name]}"] = (r[value], r[unit])
        elif rule is not None and rule < len(r) and r[rule].strip():
            speedup = None
            if "Estimated Speedup" in col and col["Estimated Speedup"] < len(r):
                cell = r[col["Estimated Speedup"]].strip().replace(",", "")
                try:
                    speedup = float(cell) if cell else None
                except ValueError:
                    speedup = None
            rtype = r[col["Rule Type"]] if "Rule Type" in col else ""
            desc = r[col["Rule Description"]] if "Rule Description" in col else ""
            rules.append((r[rule], rtype, desc, speedup))
    return list(kernels.values())
