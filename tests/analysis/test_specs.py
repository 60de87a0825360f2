"""GPU peak table and measured overrides."""

from __future__ import annotations

import json

import pytest

from tracestory.errors import TraceFormatError
from tracestory.specs import SPECS, datasheet_peaks, peaks_for, peaks_warning


@pytest.mark.parametrize("device,row,dram_tbps,bf16_tflops", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM", 3.35, 989.4),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", 2.0, 756),
    ("NVIDIA H200", "NVIDIA H200", 4.8, 989.4),
    ("NVIDIA B200", "NVIDIA B200", 8.0, 2250),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM", 2.039, 312),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB", 1.555, 312),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe", 1.935, 312),
    ("NVIDIA L40S", "NVIDIA L40S", 0.864, 362.05),
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", 1.008, 165.2),
    ("NVIDIA GeForce RTX 3060", "NVIDIA GeForce RTX 3060", 0.360, 25.5),
    ("NVIDIA GeForce RTX 5070 Ti", "NVIDIA GeForce RTX 5070 Ti", 0.896, 175.8),
])
def test_datasheet_rows(device, row, dram_tbps, bf16_tflops):
    p = datasheet_peaks(device)
    assert p.name == row
    assert p.dram_bytes_per_s == pytest.approx(dram_tbps * 1e12)
    assert p.flops("bf16") == pytest.approx(bf16_tflops * 1e12)
    assert p.source  # every row cites its source


def test_every_row_has_fp32_and_a_source_and_dense_fp8_is_twice_bf16_where_present():
    for _, name, flops, dram, source in SPECS:
        assert "fp32" in flops and dram > 0 and len(source) > 20, name
        if "fp8" in flops:
            assert flops["fp8"] == pytest.approx(2 * flops["bf16"], rel=0.02), name


def test_order_pcie_before_generic_and_3060_ti_unknown():
    assert peaks_for("NVIDIA H100 PCIe").name == "NVIDIA H100 PCIe"
    assert peaks_for("NVIDIA GeForce RTX 3060 Ti") is None
    assert "RTX 3060 Ti" in peaks_warning("NVIDIA GeForce RTX 3060 Ti")
    assert peaks_for("Tesla T4") is None and peaks_warning("NVIDIA H200") is None


def test_h200_measured_roofs_by_default():
    p = peaks_for("NVIDIA H200")
    assert p.dram_bytes_per_s == 4.27e12
    assert p.flops("bf16") == 790e12 and p.flops("fp8") == 1258e12
    assert p.flops("fp32") == 67e12  # not measured: datasheet
    assert p.datasheet_dram_bytes_per_s == 4.8e12
    assert "689-790" in p.source
    assert set(p.measured) >= {"dram", "bf16", "fp8"}
    ds = peaks_for("NVIDIA H200", measured=False)
    assert ds.flops("bf16") == pytest.approx(989.4e12) and ds.measured == ()
    assert p.ridge_flop_per_byte("bf16") == pytest.approx(790e12 / 4.27e12)


def test_overrides_file_toml_and_json(tmp_path):
    t = tmp_path / "peaks.toml"
    t.write_text('dram_bytes_per_s = 3.0e12\nsource = "my copy bench"\n[flops_per_s]\nbf16 = 7.0e14\n')
    p = peaks_for("NVIDIA H100 80GB HBM3", t)
    assert p.dram_bytes_per_s == 3.0e12 and p.flops("bf16") == 7.0e14 and "my copy bench" in p.source
    j = tmp_path / "manifest.json"
    j.write_text(json.dumps({"peaks": {"name": "A100", "dram_bytes_per_s": 1.7e12}}))
    assert peaks_for("NVIDIA H100 80GB HBM3", j).dram_bytes_per_s == 3.35e12  # name does not match
    assert peaks_for("NVIDIA A100-SXM4-40GB", j).dram_bytes_per_s == 1.7e12
    m = peaks_for("NVIDIA A100-SXM4-40GB", manifest={"peaks": {"flops_per_s": {"bf16": 2.9e14}}})
    assert m.flops("bf16") == 2.9e14


def test_bad_overrides_file(tmp_path):
    b = tmp_path / "bad.json"
    b.write_text('{"peaks": {"dram_tbps": 3}}')
    with pytest.raises(TraceFormatError, match="dram_tbps"):
        peaks_for("NVIDIA H200", b)
    c = tmp_path / "bad.toml"
    c.write_text("this is = = not toml")
    with pytest.raises(TraceFormatError, match="TOML or JSON"):
        peaks_for("NVIDIA H200", c)


def test_full_override_makes_an_unlisted_gpu_usable(tmp_path):
    f = tmp_path / "t4.json"
    f.write_text(json.dumps({"dram_bytes_per_s": 3.2e11, "flops_per_s": {"fp16": 6.5e13}}))
    p = peaks_for("Tesla T4", f)
    assert p.dram_bytes_per_s == 3.2e11 and p.flops("fp16") == 6.5e13 and "t4.json" in p.source
