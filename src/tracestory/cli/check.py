"""``tracestory check report.md``: does a report hold every part the report format asks for?

A self-check of tracestory's own output, not a verdict on your program: it grades a Markdown report
(one written by ``tracestory report``, perhaps edited by hand) against the 11-section report format
the tool follows (an executive summary with a key insight, the execution story, the charts, the
hardware section, findings with evidence, a reproduction guide that runs, ...). Use it when you
edit or extend a report, or in CI to keep generated reports complete. Prints one line per item (PASS / FAIL / N/A with the reason; rules in
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
    p = subparsers.add_parser("check", help="self-check a written report against tracestory's report format "
                                             "(every section present and filled; not a verdict on the program)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+", metavar="REPORT", help="Markdown report(s) written by tracestory report")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    p.set_defaults(func=cmd_check)
