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

Checks (the format has no kernel count, so the kernels are checked against each other)
--------------------------------------------------------------------------------------
* ncu ends every row with a newline: a file that does not ends mid-row (cut short). Its last
  row is dropped and stated (on the raw page that row is the last kernel).
* A row whose cell count differs from the header's (a cut line, a flipped quote or comma) is
  skipped and counted; on the raw page it refuses the file, since a row there is a kernel.
* Details page: every kernel profiled with one section set has the same metric rows. A kernel
  with under half the rows of the fullest kernel is a fragment (a damaged ID, a cut): dropped
  and stated with its ID and counts; one missing fewer rows (a damaged label, or a section
  that applies to some kernels only) is kept, its missing rows stated.
* Kernel IDs are ncu's result numbers, 0, 1, 2, ...: gaps and repeats are stated.

Values stay strings here; :func:`tracestory.ingest.ncu.build_record` parses numbers (thousands
separators) and scales units. Reader record = ``(identity dict, {name: (value, unit)}, rules)``.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from ..errors import TraceFormatError
from .files import check_size, inflate, refuse_special

_IDENT = {"ID": "id", "Process ID": "process_id", "Kernel Name": "name", "Context": "context",
          "Stream": "stream", "Device": "device", "CC": "cc", "Grid Size": "grid", "Block Size": "block"}
_DETAILS_COLS = ("Section Name", "Metric Name", "Metric Unit", "Metric Value")
_RAW_METRIC = re.compile(r"^[a-z0-9]+__[A-Za-z0-9_.]+$")


def _details_key(section: str, metric: str) -> str:
    """A details-page metric's key: ``Section/Display Name`` for a section's display names, the
    bare name for a raw metric (``sm__cycles_elapsed.avg``: ncu lists ``--metrics`` counters under
    "Command line profiler metrics"), so it meets the raw page's names."""
    metric = metric.strip()
    return metric if _RAW_METRIC.match(metric) else f"{section}/{metric}"


def _read_text(path: Path) -> str:
    check_size(path, refuse_special(path))
    with open(path, "rb") as f:
        data = f.read()
    return inflate(path, data, "an ncu CSV").decode("utf-8", "replace")


def _header_start(text: str) -> int:
    """Offset of the header line (``"ID","Process ID"`` ...), or -1."""
    pos = 0
    for line in text.splitlines(keepends=True):
        s = line.lstrip("\ufeff")
        if s.startswith(('"ID",', "ID,")):
            return pos + (len(line) - len(s))
        pos += len(line)
    return -1


def read_csv(path: Path, warnings: list[str] | None = None) -> tuple[str, list]:
    """``("ncu-csv-raw" | "ncu-csv-details", [(ident, metrics, rules), ...])``; the damage
    loaded around is appended to ``warnings``."""
    warnings = [] if warnings is None else warnings
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
    body = rows[1:]
    cut = not text.endswith(("\n", "\r")) and len(body) > 0
    if cut:
        body = body[:-1]
    details = all(c in header for c in _DETAILS_COLS)
    if cut and not details:
        warnings.append("the file ends mid-row (cut short): its last row (the last kernel) dropped; kernels "
                        "after it, if any, are missing")
    if details:
        kernels = _details(path, header, body, warnings, cut)
    else:
        kernels = _raw(path, header, body)
    _check_ids(kernels, warnings)
    return ("ncu-csv-details" if details else "ncu-csv-raw"), kernels


def _check_ids(kernels: list, warnings: list[str]) -> None:
    """ncu numbers its results 0, 1, 2, ...: state repeats and gaps."""
    ids = []
    for ident, _, _ in kernels:
        try:
            ids.append(int(str(ident.get("id", "")).strip()))
        except ValueError:
            continue  # refused with the file named when the record is built
    repeats = len(ids) - len(set(ids))
    if repeats:
        warnings.append(f"{repeats} kernel IDs appear more than once (a damaged ID column)")
    if ids:
        missing = (max(ids) - min(ids) + 1) - len(set(ids))
        if missing > 0:
            warnings.append(f"{missing} kernel IDs missing between {min(ids)} and {max(ids)} "
                            f"({len(set(ids))} kernels read)")


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


def _details(path: Path, header: list[str], rows: list[list[str]], warnings: list[str], cut: bool) -> list:
    col = {h: i for i, h in enumerate(header)}
    sec, name, unit, value = (col[c] for c in _DETAILS_COLS)
    rule = col.get("Rule Name")
    kernels: dict[str, tuple[dict, dict, list]] = {}
    short = blank_id = 0
    for r in rows:
        if not any(cell.strip() for cell in r):
            continue
        if not len(header) - 5 <= len(r) <= len(header):  # older ncu: no trailing rule cells
            short += 1
            continue
        if not r[col["ID"]].strip():
            blank_id += 1
            continue
        kid = r[col["ID"]]
        if kid not in kernels:
            kernels[kid] = (_ident(header, r), {}, [])
        _, metrics, rules = kernels[kid]
        if r[name].strip():
            metrics[_details_key(r[sec], r[name])] = (r[value], r[unit])
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
    if cut:
        last = next(reversed(kernels), None)
        what = f"its last kernel (ID {last.strip()}, {len(kernels.pop(last)[1])} metric rows)" if last else "its last row"
        warnings.append(f"the file ends mid-row (cut short): {what} dropped; kernels after it, if any, are missing")
    if short:
        warnings.append(f"{short} rows whose cell count does not match the header's {len(header)} skipped")
    if blank_id:
        warnings.append(f"{blank_id} rows without a kernel ID skipped")
    return _complete(kernels, warnings)


def _complete(kernels: dict[str, tuple[dict, dict, list]], warnings: list[str]) -> list:
    """Kernels checked against the fullest one: a kernel with under half its metric rows (a
    fragment: a damaged ID or a cut) is dropped, one missing fewer rows is kept; both stated."""
    if not kernels:
        return []
    fullest = max(kernels.values(), key=lambda k: len(k[1]))[1].keys()
    kept, dropped, partial = [], [], []
    for kid, k in kernels.items():
        missing = len(fullest - k[1].keys())
        if missing and 2 * len(k[1]) < len(fullest):
            dropped.append(f"ID {kid.strip()}: {len(k[1])} rows")
            continue
        if missing:
            partial.append(f"ID {kid.strip()}: {missing} missing")
        kept.append(k)
    if dropped:
        warnings.append(f"{len(dropped)} of {len(kernels)} kernels with under half the fullest kernel's "
                        f"{len(fullest)} metric rows (damaged or cut short), dropped: " + _listed(dropped))
    if partial:
        warnings.append(f"{len(partial)} kernels without some of the fullest kernel's {len(fullest)} metric rows "
                        "(their fields from those rows are empty): " + _listed(partial))
    return kept


def _listed(items: list[str], most: int = 5) -> str:
    return "; ".join(items[:most]) + (f"; {len(items) - most} more" if len(items) > most else "")
