"""Rank 0 of a TP=2 serving run under Nsight Compute (``tests/data/tp_serve_gpu_ncu``, README
there): the capture with ``--profile-rank 0`` ended ``ok``, ncu profiled rank 0's kernels and no
NCCL kernel, and ``tracestory report`` on the folder reads the kernels and the batch story.
Expected values from the fixture's files read here with plain ``csv``/``json``."""

from __future__ import annotations

import csv
import json
import tarfile
from pathlib import Path

import pytest

from tracestory.cli import main

TARBALL = Path(__file__).resolve().parents[1] / "data" / "tp_serve_gpu_ncu" / "serve_tp2_ncu.tar.gz"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ncu_fixture")
    with tarfile.open(TARBALL) as tf:
        tf.extractall(root, filter="data")
    return root / "serve_tp2_ncu"


def _raw_kernel_names(folder: Path) -> list[str]:
    with open(folder / "ncu" / "serve_tp2_ncu_raw.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    col = rows[0].index("Kernel Name")
    return [r[col] for r in rows[2:]]          # row 1: the units


def test_the_capture_ended_ok_with_one_rank_under_ncu(folder):
    cap = json.loads((folder / "manifest.json").read_text())["captures"][-1]
    assert cap["status"] == "complete" and cap["tool"] == "ncu"
    assert cap["settings"]["profile_rank"]["value"] == 0 and cap["settings"]["torchrun"]["value"] == 2
    server = cap["steps"][0]
    assert (server["name"], server["status"], server["exit_code"]) == ("ncu-profile", "ok", 0)
    assert server["stop_signal"] == "SIGINT" and server["stopped"] == "ranks"
    assert server["argv"][:6] == ["torchrun", "--nproc_per_node=2", "-m", "tracestory.capture.one_rank",
                                  "--rank", "0"]
    assert "regex:^(?!.*nccl).*" in server["argv"]
    assert [s["status"] for s in cap["steps"][1:]] == ["ok"] * 4
    summary = json.loads((folder / "ncu" / "load.summary.json").read_text())["summary"]
    assert (summary["ok"], summary["failed"]) == (11, 0)


def test_profiled_kernels_are_the_engines_and_none_is_nccl(folder):
    names = _raw_kernel_names(folder)
    assert len(names) == 40
    assert not [n for n in names if "nccl" in n.lower()]
    # the serving engine's own kernels: the FP8 GEMM (cuBLAS nvjet, FP8 inputs) and the fused glue
    assert any("nvjet" in n and "qqtst" in n for n in names)
    assert any("_add_rmsnorm_quant_kernel" in n for n in names) and any("_rope_qkv_kernel" in n for n in names)


def test_report_reads_kernels_and_batch_story(folder, tmp_path):
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    assert main(["report", str(folder), "-o", str(md), "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    assert sorted(k["name"] for k in doc["kernels"]) == sorted(_raw_kernel_names(folder))
    sched = [json.loads(x) for x in (folder / "ncu" / "serve.sched.jsonl").read_text().splitlines() if x.strip()]
    kinds = [x["type"] for x in sched]
    assert doc["batching"]["arrivals"] == kinds.count("arrival") == 11
    assert doc["batching"]["iterations"] == kinds.count("iteration") == 19
    text = md.read_text()
    assert "## Hardware Behavior Analysis" in text and "### Execution Story: Continuous Batching" in text
