"""``tracestory check report.md``: the report checklist against a Markdown report.

Prints one line per item (PASS / FAIL / N/A with the reason; rules in
:mod:`tracestory.render.checklist`). Exit code 0 when no item fails, 1 when any fails, 2 when
the input is not a readable Markdown report.
"""

from __future__ import annotations

import json
import sys

from .. import outputs
from .common import refuse_overwrite
from ..render.checklist import check_file, render_text
from ..render.jsonable import jsonable


def cmd_check(args) -> int:
    """With ``--json -`` the JSON is stdout's only content; the checklist text goes to stderr."""
    plan = refuse_overwrite(args.reports, ("--json", args.json))
    results = [check_file(p) for p in args.reports]
    text = sys.stderr if args.json and outputs.is_stdout(args.json) else sys.stdout
    for i, c in enumerate(results):
        if i:
            print(file=text)
        print("\n".join(render_text(c)), file=text)
    if args.json:
        plan.write_text(args.json, json.dumps([jsonable(c) for c in results], indent=1) + "\n", "--json")
        if not outputs.is_stdout(args.json):
            print(f"wrote {args.json}")
    return 1 if any(c.failed for c in results) else 0


def register(subparsers) -> None:
    p = subparsers.add_parser("check", help="evaluate the report checklist against a Markdown report",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+", metavar="REPORT", help="Markdown report(s) written by tracestory report")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    p.set_defaults(func=cmd_check)
