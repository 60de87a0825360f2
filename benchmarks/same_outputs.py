"""Byte-identical outputs: ``analyze --json`` and ``report`` (Markdown + JSON) of every fixture
input under ``tests/data`` (trace, kernel-metric and serving files, and capture folders), written
by the tree on ``PYTHONPATH`` into ``--out``, one folder per input, with each command's stdout,
stderr and exit code. Run it once per tree and ``diff -r`` the two folders::

    PYTHONPATH=/work/main/src python3 benchmarks/same_outputs.py --out /tmp/outs/main
    PYTHONPATH=src python3 benchmarks/same_outputs.py --out /tmp/outs/this
    diff -r /tmp/outs/main /tmp/outs/this && echo identical

Both runs read the same files and write through the same scratch folder, so paths written into
the outputs match. One process per tree (the commands run in turn through ``cli.main``); a
structural change that leaves state behind between commands would show up as a difference.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import sys
import tempfile
from pathlib import Path

SUFFIXES = (".json", ".json.gz", ".sqlite", ".csv", ".csv.gz", ".ncu-rep", ".ncu-rep.gz", ".jsonl", ".jsonl.gz",
            ".log", ".log.gz")
SKIP_PARTS = ("golden",)
RANK_FOLDERS = ("corpus/kineto_public/dlrm_8rank_v100", "corpus/h100/ddp_resnet50_train")  # multi-GPU inputs


def inputs(root: Path) -> list[Path]:
    """The capture folders (a manifest.json) and the files with an input's suffix outside them."""
    folders = sorted(p.parent for p in root.rglob("manifest.json"))
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and p.name.lower().endswith(SUFFIXES)
             and p.name != "manifest.json" and not any(s in p.parts for s in SKIP_PARTS)
             and not any(f in p.parents for f in folders)]
    ranks = [root / f for f in RANK_FOLDERS if (root / f).is_dir()]
    return [*folders, *ranks, *files]


def run(argv: list[str]) -> tuple[int, str, str]:
    from tracestory.cli import main

    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["tracestory", *argv]   # the report quotes its command line
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc or 0, out.getvalue(), err.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder to write (replaced)")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "tests" / "data"))
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    scratch = Path(tempfile.gettempdir()) / "tracestory-same-outputs"
    root = Path(args.data)
    for n, src in enumerate(inputs(root)):
        dest = out / str(src.relative_to(root)).replace("/", "__")
        dest.mkdir(parents=True)
        for cmd, files in (("analyze", ("analysis.json",)), ("report", ("report.md", "report.json"))):
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir()
            argv = (["analyze", str(src), "--json", str(scratch / "analysis.json")] if cmd == "analyze" else
                    ["report", str(src), "-o", str(scratch / "report.md"), "--json", str(scratch / "report.json")])
            rc, so, se = run(argv)
            (dest / f"{cmd}.out").write_text(f"exit {rc}\n--- stdout\n{so}--- stderr\n{se}")
            for f in files:
                if (scratch / f).exists():
                    shutil.copy(scratch / f, dest / f)
        print(f"{n + 1} {src.relative_to(root)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
