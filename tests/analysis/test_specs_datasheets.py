"""Datasheet rows for the GPUs of the field traces and their peers, matched by the device names
profilers print. Expected numbers are the datasheets' figures, written here by hand (dense: the
sparse tensor figures halved; MI250X: one of the module's two GCDs, the unit ROCm shows)."""

from __future__ import annotations

import pytest

from tracestory.specs import datasheet_peaks, peaks_warning

T = 1e12


@pytest.mark.parametrize("device,row,dram_tbps,dtype,tflops", [
    ("AMD Instinct MI300X", "AMD Instinct MI300X", 5.3, "bf16", 1307.4),
    ("AMD Instinct MI300X VF", "AMD Instinct MI300X", 5.3, "fp8", 2614.9),  # SR-IOV name in the field trace
    ("AMD Instinct MI250X/MI250", "AMD Instinct MI250X (one GCD)", 1.6, "fp16", 191.5),
    ("AMD Instinct MI250X", "AMD Instinct MI250X (one GCD)", 1.6, "fp64_tensor", 47.85),
    ("NVIDIA H800", "NVIDIA H800 SXM", 3.35, "bf16", 989.4),
    ("NVIDIA H800", "NVIDIA H800 SXM", 3.35, "fp64", 1),
    ("NVIDIA H800 PCIe", "NVIDIA H800 PCIe", 2.0, "fp8", 1513),
    ("Tesla V100-SXM2-16GB", "NVIDIA V100 SXM2", 0.9, "fp16", 125),
    ("Tesla V100-SXM2-32GB", "NVIDIA V100 SXM2", 0.9, "fp32", 15.7),
    ("Tesla V100-PCIE-16GB", "NVIDIA V100 PCIe", 0.9, "fp16", 112),
    ("Tesla V100S-PCIE-32GB", "NVIDIA V100S PCIe", 1.134, "fp16", 130),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB", 1.555, "tf32", 156),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 40GB", 1.555, "bf16", 312),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM", 2.039, "bf16", 312),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe", 1.935, "fp64_tensor", 19.5),
    ("NVIDIA A100-PCIE-80GB", "NVIDIA A100 80GB PCIe", 1.935, "bf16", 312),  # nvidia-smi spells PCIE
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM", 2.039, "fp32", 19.5),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB", 1.555, "fp64", 9.7),
    ("NVIDIA L40S", "NVIDIA L40S", 0.864, "fp8", 733),
    ("NVIDIA L40S", "NVIDIA L40S", 0.864, "bf16", 362.05),  # 733 is the sparse figure
    ("NVIDIA L40S", "NVIDIA L40S", 0.864, "fp16", 362.05),
    ("NVIDIA L40S", "NVIDIA L40S", 0.864, "tf32", 183),
    ("NVIDIA L40S", "NVIDIA L40S", 0.864, "fp32", 91.6),
    ("NVIDIA B200", "NVIDIA B200", 8.0, "fp4", 9000),
    ("NVIDIA B200", "NVIDIA B200", 8.0, "fp64", 37),
])
def test_rows_by_profiler_device_name(device, row, dram_tbps, dtype, tflops):
    p = datasheet_peaks(device)
    assert p is not None and p.name == row
    assert p.dram_bytes_per_s == pytest.approx(dram_tbps * T)
    assert p.flops(dtype) == pytest.approx(tflops * T)
    assert peaks_warning(device) is None


@pytest.mark.parametrize("device,dtype", [
    ("Tesla V100-SXM2-16GB", "bf16"),  # Volta has no BF16 tensor path
    ("Tesla V100-SXM2-16GB", "tf32"),
    ("AMD Instinct MI250X", "fp8"),
    ("NVIDIA A100-SXM4-40GB", "fp8"),
])
def test_precisions_a_chip_lacks_are_absent_not_guessed(device, dtype):
    assert datasheet_peaks(device).flops(dtype) is None


def test_every_new_row_names_its_source():
    for device in ("AMD Instinct MI300X", "AMD Instinct MI250X", "NVIDIA H800", "NVIDIA H800 PCIe",
                   "Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB", "Tesla V100S-PCIE-32GB",
                   "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA L40S"):
        src = datasheet_peaks(device).source
        assert "datasheet" in src.lower() or "data sheet" in src.lower()


def test_h800_is_not_read_as_h100_and_mi300a_is_unknown():
    assert datasheet_peaks("NVIDIA H800").name != "NVIDIA H100 SXM"
    assert datasheet_peaks("AMD Instinct MI300A") is None  # an APU with other rates: no guess


def test_l40_is_not_given_the_l40s_row():
    # The L40 (no S) has half the L40S's tensor rates (BF16 181.05 TFLOPS dense): no row, no guess.
    assert datasheet_peaks("NVIDIA L40") is None
