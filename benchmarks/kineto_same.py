"""Same results before and after a change to the Kineto reader: ``analyze --json`` of each trace.

Usage: ``python3 benchmarks/kineto_same.py OUT_DIR FILE_OR_DIR...`` runs
``python3 -m tracestory.cli analyze FILE --json OUT_DIR/N.json`` for every ``.json`` / ``.json.gz``
file under the given paths (with the caller's ``PYTHONPATH`` and environment, so the same
command run with the old and the new code, or with ``TRACESTORY_DECODE_WORKERS`` set, gives two
folders to compare) and writes ``OUT_DIR/N.txt`` with the exit status and the stderr lines
(the one-line refusals and the damage warnings). Then compare the folders with ``diff -r``.
Files are numbered in sorted path order; ``OUT_DIR/index.txt`` maps numbers to paths.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def traces(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += [f for f in p.rglob("*") if f.name.endswith((".json", ".json.gz")) and f.is_file()]
        else:
            out.append(p)
    return sorted(out)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    files = traces(argv[1:])
    index = []
    for n, f in enumerate(files):
        js = out / f"{n}.json"
        r = subprocess.run([sys.executable, "-m", "tracestory.cli", "analyze", str(f), "--json", str(js)],
                           capture_output=True, text=True)
        (out / f"{n}.txt").write_text(f"rc {r.returncode}\n{r.stderr}")
        index.append(f"{n}\t{f}")
    (out / "index.txt").write_text("\n".join(index) + "\n")
    print(f"{len(files)} traces -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
