"""An ``ncu --csv --page details`` export of ``--metrics`` counters (Nsight Compute 2021.2, no
gpu__time_duration; tests/data/corpus/nsight/PROVENANCE.md): the counters are read under their
raw names, each kernel's duration is its SMs' elapsed cycles over their rate, and FLOPs are left
out where the tensor pipe ran but no tensor FLOP counter was collected. Expected values: the CSV
read with the csv module."""

from __future__ import annotations

import csv
import gzip

from conftest import TEST_DATA

from tracestory.ingest.ncu import load_ncu

FA = (TEST_DATA / "corpus" / "nsight"
      / "leleucas_Actual-Parameter-Collection-for-Machine-Learning-Operators__a100_gpt2_flashattn_fp16_ncu.csv.gz")


def _metrics():
    out: dict[int, dict[str, float]] = {}
    with gzip.open(FA, "rt", newline="") as f:
        for row in csv.DictReader(f):
            if "__" in row["Metric Name"]:  # the raw counters of --metrics
                out.setdefault(int(row["ID"]), {})[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    return out


def test_durations_from_elapsed_cycles_and_flops_only_where_complete():
    m = _metrics()
    km = load_ncu(FA)
    assert [k.id for k in km.kernels] == sorted(m)
    for k in km.kernels:
        cycles, rate = m[k.id]["sm__cycles_elapsed.avg"], m[k.id]["sm__cycles_elapsed.avg.per_second"]
        assert k.duration_derived and k.duration_ns == round(cycles / rate * 1e9)
        assert k.sm_frequency_hz == rate
        tensor = m[k.id]["sm__inst_executed_pipe_tensor.sum"]
        assert (k.flops is None) is (tensor > 0)
    # the fused attention kernel: 9.34 us by the cycles; the Wqkv GEMM (12.7 us) is the longest
    longest = max(km.kernels, key=lambda k: k.duration_ns)
    assert longest.name.startswith("ampere_fp16_s16816gemm") and longest.duration_ns == 12704
