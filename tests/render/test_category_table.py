"""The kernel-category table: totals against direct SQL / plain JSON sums, the Amdahl ceiling by hand."""

from __future__ import annotations

import dataclasses
import gzip
import json
import sqlite3

import pytest
from conftest import H200_LLAMA, NSYS_2022, NSYS_2024, TEST_DATA

from tracestory.analysis.category_totals import category_totals
from tracestory.cli import main
from tracestory.analysis.categories import Rule, Taxonomy, taxonomy
from tracestory.render.category_table import category_table, category_table_text
from tracestory.trace import Table
from tracestory.ingest.kineto import load_kineto
from tracestory.ingest.nsys_csv import load_nsys_csv
from tracestory.ingest.nsys_sqlite import load_nsys_sqlite

def table(traces, tax="moe", **kw):
    traces = traces if isinstance(traces, list) else [traces]
    tax = taxonomy(tax) if isinstance(tax, str) else tax
    return category_table(category_totals(traces, tax, **kw))


MOE = ("expert_gemm", "attention_gemm", "gate_gemm", "routing_permute", "quant_dequant", "norm", "allreduce", "other")


@pytest.mark.parametrize("path", [NSYS_2022, NSYS_2024], ids=["2022", "2024"])
def test_sqlite_totals_match_sql(path):
    con = sqlite3.connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    parts = [t for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET") if t in tables]
    total = sum(con.execute(f"SELECT sum(end - start) FROM {t}").fetchone()[0] for t in parts)
    (n_kernels,), = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    con.close()
    res = table(load_nsys_sqlite(path))
    assert [c["category"] for c in res["categories"]] == list(MOE)
    assert res["total_time_ns"] == total == sum(c["time_ns"] for c in res["categories"])
    assert res["kernel_count"] == n_kernels
    assert res["total_time_ms"] == pytest.approx(total / 1e6)
    json.dumps(res)  # JSON-ready


def test_kineto_totals_match_plain_json():
    with gzip.open(H200_LLAMA) as f:
        doc = json.load(f)
    evs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    total = sum(round(e["dur"] * 1000) for e in evs)
    res = table(load_kineto(H200_LLAMA))
    assert res["total_time_ns"] == total
    assert sum(c["kernel_count"] for c in res["categories"]) == len(evs)
    assert abs(sum(c["percent"] for c in res["categories"]) - 100.0) < 1e-9


def test_amdahl_by_hand_on_a_summary_csv():
    # cuda_gpu_kern_sum.csv: fused_moe 1000 ns (3), nvjet 500 ns (2), rms_norm 7 ns (1)
    tax = Taxonomy(name="t", categories=("expert_gemm", "gate_gemm", "other"),
                   rules=(Rule("expert_gemm", "fused_moe"), Rule("gate_gemm", "nvjet")))
    res = table(load_nsys_csv(TEST_DATA / "nsys" / "cuda_gpu_kern_sum.csv"), tax, samples=1)
    cats = {c["category"]: c for c in res["categories"]}
    assert cats["expert_gemm"]["time_ns"] == 1000 and cats["expert_gemm"]["kernel_count"] == 3
    assert cats["gate_gemm"]["sample_kernels"] == ["nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NNT"]
    assert cats["expert_gemm"]["percent"] == pytest.approx(100 * 1000 / 1507)
    a = res["amdahl"]
    assert a["max_speedup"] == pytest.approx(1507 / 507)  # 1 / (1 - 1000/1507)
    assert "2.97x" in a["explanation"]
    assert res["has_timeline"] is False
    text = category_table_text(res)
    assert "expert_gemm" in text and "Amdahl" in text


def test_amdahl_edge_cases():
    csv = load_nsys_csv(TEST_DATA / "nsys" / "cuda_gpu_kern_sum.csv")
    all_expert = Taxonomy(name="t", categories=("expert_gemm", "other"), rules=(Rule("expert_gemm", "."),))
    res = table(csv, all_expert)
    assert res["amdahl"]["max_speedup"] is None and "unbounded" in res["amdahl"]["explanation"]
    none = Taxonomy(name="t", categories=("expert_gemm", "other"), rules=(Rule("expert_gemm", "^nothing$"),))
    assert table(csv, none)["amdahl"]["max_speedup"] == pytest.approx(1.0)


def test_a_kernel_without_a_name_is_counted(tmp_path):
    # the summary CSV's 6 kernel rows: 1000 ns fused_moe (3), 500 ns nvjet (2), 7 ns rms_norm (1);
    # the last row loses its name (name code -1, as a reader writes for a missing name)
    (trace,) = load_nsys_csv(TEST_DATA / "nsys" / "cuda_gpu_kern_sum.csv")
    names = trace.kernels["name"].copy()
    names[-1] = -1
    cols = {c: trace.kernels[c] for c in trace.kernels.columns} | {"name": names}
    unnamed = dataclasses.replace(trace, kernels=Table(cols))
    tax = Taxonomy(name="t", categories=("expert_gemm", "other"), rules=(Rule("expert_gemm", "fused_moe"),))
    res = table(unnamed, tax)
    assert res["total_time_ns"] == 1507 and res["kernel_count"] == 6
    other = res["categories"][1]
    assert other["time_ns"] == 507 and other["kernel_count"] == 3 and "" in other["sample_kernels"]


def test_categories_command_writes_the_table(tmp_path, capsys):
    out = tmp_path / "cats.json"
    # The older spelling (--input, --output) still works; the taxonomy is named (the default is llm).
    assert main(["categories", "--input", str(NSYS_2022), "--output", str(out), "--taxonomy", "moe"]) == 0
    doc = json.loads(out.read_text())
    con = sqlite3.connect(NSYS_2022)
    (n_kernels,), = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    con.close()
    assert doc["taxonomy"] == "moe" and doc["kernel_count"] == n_kernels
    assert "Amdahl ceiling (expert_gemm)" in capsys.readouterr().out


def test_categories_takes_a_positional_input_and_defaults_to_llm(tmp_path, capsys):
    out = tmp_path / "cats.json"
    assert main(["categories", str(NSYS_2022), "-o", str(out)]) == 0
    assert json.loads(out.read_text())["taxonomy"] == "llm"
