"""Write ``tracestory analyze FILE --json`` of every file under a folder, to compare two trees.

For each file under ``--root`` (default ``tests/data``; every file is tried, the ones tracestory
refuses included) this writes ``OUT/<path>.json`` (the JSON document, when one was written) and
``OUT/<path>.rc`` (the exit code and the stderr lines), all in one process through ``cli.main``.
Run it once with each tree first on the path, then compare the two folders byte for byte:

    PYTHONPATH=/tmp/base/src python3 benchmarks/analyze_json_dump.py --out /tmp/json-base
    PYTHONPATH=$PWD/src     python3 benchmarks/analyze_json_dump.py --out /tmp/json-new
    diff -r /tmp/json-base /tmp/json-new && echo identical

``--twice`` analyses every file a second time in the same process and fails when the two JSON
documents differ (state kept between analyses would show here).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def dump(path: Path, out: Path) -> tuple[int, bytes]:
    from tracestory.cli import main

    out.parent.mkdir(parents=True, exist_ok=True)
    target = out.with_suffix(out.suffix + ".json")
    target.unlink(missing_ok=True)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            rc = main(["analyze", str(path), "--json", str(target)])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    rc = 0 if rc is None else rc
    out.with_suffix(out.suffix + ".rc").write_text(f"{rc}\n{err.getvalue()}")
    return rc, target.read_bytes() if target.exists() else b""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=REPO / "tests" / "data")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--twice", action="store_true", help="analyse each file again and compare")
    args = ap.parse_args()
    files = sorted(p for p in args.root.rglob("*") if p.is_file())
    written = differ = 0
    for p in files:
        rel = p.relative_to(args.root)
        rc, doc = dump(p, args.out / rel)
        written += bool(doc)
        if args.twice and doc:
            _, again = dump(p, args.out / "_again" / rel)
            if again != doc:
                differ += 1
                print(f"second analysis differs: {rel}", file=sys.stderr)
    print(f"{len(files)} files, {written} JSON documents written to {args.out}"
          + (f", {differ} differ on a second analysis" if args.twice else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
