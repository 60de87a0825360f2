"""Nsight Compute ingest: every stable field against the raw metric read independently."""

from __future__ import annotations

import csv
import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import NCU_DETAILS, NCU_RAW, NCU_REP, TEST_DATA

from tracestory.errors import ToolNotFound, TraceFormatError
from tracestory.ingest.ncu import kernel_metrics_to_json, load_ncu, parse_value, to_base

NEW = ("triton_rmsnorm", "sdpa_flash", "fp8_scaled_mm")
NCU_DIR = TEST_DATA / "ncu"


def _raw_rows(path: Path) -> tuple[list[str], list[str], list[list[str]]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1], rows[2:]


def _num(cell: str) -> float:
    return float(cell.replace(",", ""))


# field -> raw metric; the test's own unit table turns the printed unit into base units
RAW_FIELDS = {
    "duration_ns": "gpu__time_duration.sum",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
    "registers_per_thread": "launch__registers_per_thread",
    "static_shared_mem_bytes": "launch__shared_mem_per_block_static",
    "dynamic_shared_mem_bytes": "launch__shared_mem_per_block_dynamic",
    "waves_per_sm": "launch__waves_per_multiprocessor",
    "sm_count": "launch__sm_count",
    "sm_frequency_hz": "smsp__cycles_elapsed.avg.per_second",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_throughput_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_bytes_read": "dram__bytes_read.sum",
    "dram_bytes_written": "dram__bytes_write.sum",
    "dram_bytes_per_s": "dram__bytes.sum.per_second",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "occupancy_limit_registers": "launch__occupancy_limit_registers",
    "occupancy_limit_shared_mem": "launch__occupancy_limit_shared_mem",
    "occupancy_limit_warps": "launch__occupancy_limit_warps",
    "occupancy_limit_blocks": "launch__occupancy_limit_blocks",
    "occupancy_limit_barriers": "launch__occupancy_limit_barriers",
    "tensor_pipe_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "fp32_pipe_pct": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "fp64_pipe_pct": "sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active",
    "l1_hit_rate_pct": "l1tex__t_sector_hit_rate.pct",
    "l2_hit_rate_pct": "lts__t_sector_hit_rate.pct",
    "shared_bank_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "shared_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "warp_cycles_per_issue": "smsp__average_warp_latency_per_inst_issued.ratio",
}
# printed unit -> factor to the field's unit (ns for duration, bytes, hertz, plain numbers)
UNIT = {"": 1, "%": 1, "us": 1e3, "usecond": 1e3, "ns": 1, "nsecond": 1, "msecond": 1e6,
        "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "byte/block": 1, "Kbyte/block": 1e3,
        "Mbyte/s": 1e6, "Gbyte/s": 1e9, "Tbyte/s": 1e12, "Kbyte/s": 1e3, "byte/s": 1, "Ghz": 1e9,
        "Mhz": 1e6, "block": 1, "register/thread": 1, "SM": 1, "cycle": 1}


def _expected(header, units, row, metric):
    j = header.index(metric)
    if row[j] == "":
        return None
    return _num(row[j]) * UNIT[units[j]]


@pytest.mark.parametrize("path", [NCU_RAW] + [NCU_DIR / f"{n}_raw.csv.gz" for n in NEW], ids=lambda p: p.name)
def test_raw_csv_every_field_matches_the_raw_metric(path):
    header, units, rows = _raw_rows(path)
    km = load_ncu(path)
    assert km.source_format == "ncu-csv-raw"
    assert len(km) == len(rows)
    for rec, row in zip(km.kernels, rows):
        assert rec.name == row[header.index("Kernel Name")]
        assert rec.id == int(row[header.index("ID")])
        for field, metric in RAW_FIELDS.items():
            want = _expected(header, units, row, metric)
            got = getattr(rec, field)
            if want is None:
                assert got is None, field
            elif field in ("duration_ns",) or isinstance(got, int):
                assert got == round(want), field
            else:
                assert got == pytest.approx(want, rel=1e-9), field
        assert rec.device_name == row[header.index("device__attribute_display_name")]
        gx, gy, gz = (int(_num(row[header.index(f"launch__grid_dim_{a}")])) for a in "xyz")
        assert rec.grid == (gx, gy, gz)


def test_raw_csv_flops_and_stalls_by_hand():
    header, _units, rows = _raw_rows(NCU_RAW)
    km = load_ncu(NCU_RAW)
    reasons = [h[len("smsp__average_warps_issue_stalled_"):-len("_per_issue_active.ratio")] for h in header
               if h.startswith("smsp__average_warps_issue_stalled_") and h.endswith("_per_issue_active.ratio")]
    assert "long_scoreboard" in reasons and "barrier" in reasons
    for rec, row in zip(km.kernels, rows):
        def m(name, row=row):
            return _num(row[header.index(name)])
        cyc = m("smsp__cycles_elapsed.avg")
        per = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum.per_cycle_elapsed"
        fp32 = (m(per.format("fadd")) + m(per.format("fmul")) + 2 * m(per.format("ffma"))) * cyc
        fp16 = (2 * m(per.format("hadd")) + 2 * m(per.format("hmul")) + 4 * m(per.format("hfma"))) * cyc
        assert rec.flops_by_precision["fp32"] == pytest.approx(fp32, rel=1e-9)
        assert rec.flops_by_precision["fp16"] == pytest.approx(fp16, rel=1e-9)
        # ncu's own derived metric for packed half FMAs agrees with our multiplier of 4
        assert 4 * m(per.format("hfma")) == pytest.approx(m("derived__smsp__sass_thread_inst_executed_op_hfma_pred_on_x4"), rel=1e-5, abs=1e-6)
        ratio = {r: m(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio") for r in reasons}
        total = sum(v for r, v in ratio.items() if r != "selected")
        for r in reasons:
            if r != "selected":
                assert rec.warp_stall_pct[r] == pytest.approx(100 * ratio[r] / total, rel=1e-9)
        assert "selected" not in rec.warp_stall_pct
        assert sum(rec.warp_stall_pct.values()) == pytest.approx(100.0)
    # kernel 0 by hand: long_scoreboard 13.533898 over 0.118644 + 0.033898 + 0.560381 + 4.406780
    # + 13.533898 + 0.016949 + 3.220339 + 1.764831 + 1.135593 = 24.791313 (the non-zero reasons)
    assert km[0].warp_stall_pct["long_scoreboard"] == pytest.approx(100 * 13.533898 / 24.791313, rel=1e-6)


def test_occupancy_limiter_is_the_smallest_block_limit():
    km = load_ncu(NCU_RAW)
    # kernel 0: limits registers 12, shared 32, warps 16, blocks 32, barriers 32 -> registers
    assert km[0].occupancy_limiters == ("registers",)
    # kernel 2 (reduce, 512 threads): registers 4, warps 4 -> both
    assert km[2].occupancy_limiters == ("registers", "warps")


# details label -> (raw metric, tolerance from the details page printing 2 decimals / 3 digits)
DETAILS_VS_RAW = {
    "duration_ns": 10.0, "sm_throughput_pct": 0.006, "memory_throughput_pct": 0.006, "dram_throughput_pct": 0.006,
    "achieved_occupancy_pct": 0.006, "theoretical_occupancy_pct": 0.006, "l1_hit_rate_pct": 0.006,
    "l2_hit_rate_pct": 0.006, "registers_per_thread": 0, "grid_size": 0, "block_size": 0, "sm_count": 0,
    "dynamic_shared_mem_bytes": 0, "static_shared_mem_bytes": 0, "occupancy_limit_registers": 0,
    "occupancy_limit_shared_mem": 0, "occupancy_limit_warps": 0, "occupancy_limit_blocks": 0,
    "occupancy_limit_barriers": 0, "warp_cycles_per_issue": 0.006, "waves_per_sm": 0.006,
}


def _details(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return list(csv.DictReader(f))


def test_details_csv_fields_match_the_labels():
    rows = _details(NCU_DETAILS)
    km = load_ncu(NCU_DETAILS)
    assert km.source_format == "ncu-csv-details" and len(km) == 6

    def label(kid, section, name):
        for r in rows:
            if r["ID"] == str(kid) and r["Section Name"] == section and r["Metric Name"] == name:
                return r["Metric Value"], r["Metric Unit"]
        raise KeyError(name)
    for rec in km.kernels:
        v, u = label(rec.id, "GPU Speed Of Light Throughput", "Duration")
        assert rec.duration_ns == round(_num(v) * UNIT[u])
        v, _ = label(rec.id, "Occupancy", "Achieved Occupancy")
        assert rec.achieved_occupancy_pct == _num(v)
        v, u = label(rec.id, "Memory Workload Analysis", "Memory Throughput")
        assert rec.dram_bytes_per_s == pytest.approx(_num(v) * UNIT[u])
        v, _ = label(rec.id, "Launch Statistics", "Registers Per Thread")
        assert rec.registers_per_thread == int(_num(v))
        # the details page has no stall, FLOP or DRAM-byte metrics: None, never 0
        assert rec.warp_stall_pct is None and rec.flops is None and rec.dram_bytes_read is None
        assert rec.tensor_pipe_pct is None and rec.arithmetic_intensity is None
    assert any(r[0] == "AchievedOccupancy" for r in km[0].rules)


@pytest.mark.parametrize("raw,details", [(NCU_RAW, NCU_DETAILS)] + [
    (NCU_DIR / f"{n}_raw.csv.gz", NCU_DIR / f"{n}_details.csv.gz") for n in NEW], ids=lambda p: Path(p).name)
def test_raw_and_details_agree_where_they_overlap(raw, details):
    a, b = load_ncu(raw), load_ncu(details)
    assert [k.name for k in a] == [k.name for k in b]
    for ka, kb in zip(a, b):
        for field, tol in DETAILS_VS_RAW.items():
            va, vb = getattr(ka, field), getattr(kb, field)
            assert (va is None) == (vb is None), field
            if va is not None:
                rel = 0.005 * abs(va)
                assert abs(va - vb) <= max(tol, rel), (field, va, vb)


@pytest.mark.parametrize("name", NEW)
def test_rep_and_raw_csv_of_the_same_capture_agree(name):
    rep, raw = load_ncu(NCU_DIR / f"{name}.ncu-rep.gz"), load_ncu(NCU_DIR / f"{name}_raw.csv.gz")
    assert rep.source_format == "ncu-rep" and len(rep) == len(raw) == 1
    kr, kc = rep[0], raw[0]
    for field in list(RAW_FIELDS) + ["flops", "dram_bytes"]:
        vr, vc = getattr(kr, field), getattr(kc, field)
        assert (vr is None) == (vc is None), field
        if vr is not None:
            assert vr == pytest.approx(vc, rel=2e-3, abs=1e-3), field  # CSV prints 6 decimals
    assert kr.dominant_precision == kc.dominant_precision
    assert kr.warp_stall_pct.keys() == kc.warp_stall_pct.keys()
    for r in kr.warp_stall_pct:
        assert kr.warp_stall_pct[r] == pytest.approx(kc.warp_stall_pct[r], abs=1e-3)


def test_rep_fields_against_ncu_report_directly(tmp_path):
    import ncu_report as nr
    plain = tmp_path / "g.ncu-rep"
    with gzip.open(NCU_REP, "rb") as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    ctx = nr.load_report(str(plain))
    actions = [ctx.range_by_idx(0).action_by_idx(i) for i in range(ctx.range_by_idx(0).num_actions())]
    km = load_ncu(NCU_REP)
    assert len(km) == len(actions) == 2
    for rec, a in zip(km.kernels, actions):
        def d(name, a=a):
            return a.metric_by_name(name).as_double()
        assert a.metric_by_name("gpu__time_duration.sum").unit() == "ns"
        assert rec.duration_ns == round(d("gpu__time_duration.sum"))
        assert rec.dram_throughput_pct == d("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")
        assert rec.dram_bytes_read == d("dram__bytes_read.sum")
        assert rec.dram_bytes_written == d("dram__bytes_write.sum")
        assert rec.sm_throughput_pct == d("sm__throughput.avg.pct_of_peak_sustained_elapsed")
        assert rec.achieved_occupancy_pct == d("sm__warps_active.avg.pct_of_peak_sustained_active")
        assert rec.registers_per_thread == int(d("launch__registers_per_thread"))
        assert rec.grid_size == int(d("launch__grid_size"))
        assert rec.tensor_pipe_pct == d("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active")
        tensor = d("sm__ops_path_tensor_src_bf16_dst_fp32.sum")
        assert rec.flops_by_precision["tensor_bf16"] == tensor
        assert rec.dominant_precision == "tensor_bf16"
        assert rec.name == a.name(nr.IAction.NameBase_DEMANGLED)
    # the GEMMs of the Llama layer: 2*M*N*K with M=512 tokens, K=4096, N=12288 and 4096
    assert km[0].flops_by_precision["tensor_bf16"] == 2 * 512 * 4096 * 12288
    assert km[1].flops_by_precision["tensor_bf16"] == 2 * 512 * 4096 * 4096


def test_fp8_capture_counts_fp8_tensor_flops():
    km = load_ncu(NCU_DIR / "fp8_scaled_mm.ncu-rep.gz")
    assert km[0].dominant_precision == "tensor_fp8"
    assert km[0].flops_by_precision["tensor_fp8"] == 2 * 4096 ** 3  # the captured 4096^3 _scaled_mm


def test_units_and_numbers():
    assert to_base(2.368, "us") == pytest.approx((2.368e-6, "second"))
    assert to_base(9.72973, "Gbyte/s") == pytest.approx((9.72973e9, "byte/second"))
    assert to_base(1.024, "Kbyte/block") == pytest.approx((1024.0, "byte/block"))
    assert to_base(3.16, "Ghz") == pytest.approx((3.16e9, "hz"))
    assert to_base(1.466, "%/Kbyte") == pytest.approx((1.466e-3, "%/byte"))
    assert to_base(5.0, "inst/cycle") == (5.0, "inst/cycle")
    assert parse_value("1,274") == 1274.0 and parse_value("62,914,560") == 62914560.0
    assert parse_value("") is None and parse_value("PolicySpread") == "PolicySpread"
    assert parse_value("(128, 1, 1)") == "(128, 1, 1)"


def test_prof_lines_before_the_header_are_skipped(tmp_path):
    text = NCU_RAW.read_text()
    p = tmp_path / "with_prof.csv"
    p.write_text("==PROF== Connected to process 749\nhello from the program\n==PROF== Disconnected\n" + text)
    a, b = load_ncu(p), load_ncu(NCU_RAW)
    assert [k.duration_ns for k in a] == [k.duration_ns for k in b]


def test_unknown_metrics_are_kept_in_json_under_raw_names():
    km = load_ncu(NCU_RAW)
    rows = kernel_metrics_to_json(km)
    json.dumps(rows)  # serializable
    header, _units, body = _raw_rows(NCU_RAW)
    assert rows[0]["raw"]["launch__cluster_scheduling_policy"] == "PolicySpread"
    assert rows[0]["raw"]["dram__cycles_elapsed.avg"] == pytest.approx(_num(body[0][header.index("dram__cycles_elapsed.avg")]))
    assert rows[0]["raw"]["lts__t_sector_op_read_hit_rate.pct"] == pytest.approx(58.080808)
    # mapped metrics are fields, not raw
    assert "gpu__time_duration.sum" not in rows[0]["raw"] and rows[0]["duration_ns"] == 2368
    # empty cells are absent (dramc__ triage metrics are blank on this H200 capture), never 0
    assert not any(k.startswith("FBSP.TriageCompute.dramc__") for k in rows[0]["raw"])
    d = kernel_metrics_to_json(load_ncu(NCU_DETAILS))
    assert d[0]["flops"] is None and d[0]["warp_stall_pct"] is None


def test_not_an_ncu_csv(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("Time (%),Total Time (ns),Instances\n1,2,3\n")
    with pytest.raises(TraceFormatError, match="ncu --csv"):
        load_ncu(p)


def test_zero_kernels(tmp_path):
    header = NCU_RAW.read_text().splitlines()[:2]
    p = tmp_path / "empty_raw.csv"
    p.write_text("\n".join(header) + "\n")
    with pytest.raises(TraceFormatError, match="zero kernels"):
        load_ncu(p)
    q = tmp_path / "empty_details.csv"
    q.write_text(NCU_DETAILS.read_text().splitlines()[0] + "\n")
    with pytest.raises(TraceFormatError, match="zero kernels"):
        load_ncu(q)


def test_missing_ncu_report_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "ncu_report", None)
    with pytest.raises(ToolNotFound, match="tracestory\\[ncu\\]"):
        load_ncu(NCU_REP)


def test_corrupt_rep(tmp_path):
    p = tmp_path / "bad.ncu-rep"
    p.write_bytes(b"NVR\x00" + b"\x00" * 64)
    with pytest.raises(TraceFormatError):
        load_ncu(p)
