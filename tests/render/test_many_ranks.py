"""A report on 64 ranks reads in about the length of one rank's: ranks that behave alike are told
once, the slow one is named, and every rank keeps its row in the Appendix.

The 64 traces are written here from the real 2-rank H200 capture ``multigpu/tp2_uneven`` (see its
README): rank 17 is a copy of the capture's slow rank 1 (two extra 2048 x 7168 @ 7168 x 4096 GEMMs
before each of its 4 all-reduces per step), every other rank a copy of its rank 0, which waits in
the all-reduces. Each copy says its rank and a world of 64 in ``distributedInfo`` and in the
collective args of its ``record_param_comms`` ops."""

from __future__ import annotations

import gzip
import json
import re

from conftest import REPO

from tracestory.analysis.results import analyze_inputs
from tracestory.ingest import load_inputs
from tracestory.render.markdown import render_report

SOURCE = REPO / "tests" / "data" / "multigpu" / "tp2_uneven" / "torch"
RANKS, SLOW = 64, 17


def _write_ranks(folder):
    folder.mkdir()
    docs = [json.loads(gzip.open(SOURCE / f"rank{i}.trace.json.gz").read()) for i in (0, 1)]
    for r in range(RANKS):
        doc = json.loads(json.dumps(docs[1 if r == SLOW else 0]))
        doc["distributedInfo"].update(rank=r, world_size=RANKS)
        doc["distributedInfo"]["pg_config"][0].update(pg_size=RANKS, ranks=list(range(RANKS)))
        for e in doc["traceEvents"]:
            args = e.get("args")
            if isinstance(args, dict) and "Process Group Ranks" in args:
                args.update({"Process Group Ranks": str(list(range(RANKS))), "Group size": RANKS, "Rank": r})
        with gzip.open(folder / f"rank{r}.trace.json.gz", "wt", compresslevel=1) as f:
            json.dump(doc, f)
    return folder


def _section(text, name):
    return re.search(rf"^## {re.escape(name)}\n(.*?)(?=^## |\Z)", text, re.S | re.M).group(1)


def test_64_ranks_read_in_about_the_length_of_one(tmp_path):
    folder = _write_ranks(tmp_path / "ranks")
    one = render_report(analyze_inputs(load_inputs([folder / "rank0.trace.json.gz"])))
    many = render_report(analyze_inputs(load_inputs([folder])))
    n_one, n_many = len(one.splitlines()), len(many.splitlines())
    assert n_many <= 2.5 * n_one, (n_one, n_many)
    # the staged slow rank is named in the summary, as the one the others wait for
    summary = _section(many, "Executive Summary")
    assert f"GPU {SLOW} arrives last" in summary
    assert "**64 traces**, told once" in summary
    # a limitation shared by the 63 alike ranks is one line, not 63
    assert "63 traces (" in summary and summary.count("the phases cover") == 2
    # every rank has its row in the Appendix table
    appendix = _section(many, "Appendix")
    for r in range(RANKS):
        assert f"| rank{r}.trace.json.gz (rank {r}) |" in appendix
