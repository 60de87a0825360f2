"""tracestory ranks: the multi-GPU analysis through the parallel map, on the real 2-GPU capture."""

from __future__ import annotations

import json

from conftest import TEST_DATA
from tracestory.cli import main

TP2 = TEST_DATA / "multigpu" / "tp2_uneven"


def test_in_process_and_pool_agree_and_name_the_staged_rank(tmp_path, capsys):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert main(["ranks", str(TP2), "--workers", "1", "--json", str(one), "-o", str(tmp_path / "r.md")]) == 0
    assert main(["ranks", str(TP2), "--workers", "2", "--json", str(two)]) == 0
    assert json.loads(one.read_text()) == json.loads(two.read_text())
    out = capsys.readouterr().out
    # examples/tp_llama.py --slow-rank 1 gave rank 1 the extra GEMMs (tests/data/multigpu/README.md)
    assert "GPU 1 arrives last" in out
    assert "MULTI-GPU COMMUNICATION TIMELINE" in (tmp_path / "r.md").read_text()


def test_one_rank_is_a_usage_error(capsys):
    assert main(["ranks", str(TP2 / "torch" / "rank0.trace.json.gz")]) == 2
    assert "at least 2 ranks" in capsys.readouterr().err
