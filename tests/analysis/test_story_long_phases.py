"""The Execution Story on inputs that are long or have no order: a phase of 275,000 ops is folded
(the loop search is linear in the ops: it looked at every period up to half the phase, hours for
a million ops), and a kernel summary (nsys stats cuda_gpu_kern_sum: totals per name) gets no
story, since any order of its instances would be made up by the reader."""

from __future__ import annotations

import numpy as np
from conftest import TEST_DATA

from tracestory.analysis.story import MAX_PERIOD, best_repeat
from tracestory.cli import main


def test_a_long_phase_is_folded():
    body = np.array([1, 2, 3, 4, 2, 5, 1, 1, 3] * 50, dtype=np.int16)  # a 450-op loop body
    head = np.random.default_rng(0).integers(0, 9, 5000).astype(np.int16)
    keys = np.concatenate([head, np.tile(body, 600)])
    start, period, count = best_repeat(keys)
    # the body's own 9-op repeat covers all 270,000 ops after the head
    assert (period, period * count) == (9, 270_000) and start == 5000 and period <= MAX_PERIOD


def test_a_kernel_summary_has_no_execution_story(tmp_path):
    csv = TEST_DATA / "corpus" / "nsight" / "CodeGandee_llm-perf-opt__rtx5090_deepseek-ocr_decode_nsys_kern_sum.csv.gz"
    out = tmp_path / "r.md"
    assert main(["report", str(csv), "-o", str(out)]) == 0
    story = out.read_text().split("## Execution Story")[1].split("\n## ")[0]
    assert "n/a: the input holds totals per kernel name, not per-op start times" in story
    assert "LOOP" not in story and "GPU execution begins" not in story
