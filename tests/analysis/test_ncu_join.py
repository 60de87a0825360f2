"""Joining ncu kernels to trace kernels by name and launch order."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import H200_LLAMA, NCU_RAW, NCU_REP

from tracestory.analysis.ncu_join import join_ncu, name_key
from tracestory.ingest.kineto import load_kineto
from tracestory.ingest.ncu import KernelMetrics, KernelRecord, load_ncu


@pytest.fixture(scope="module")
def trace():
    return load_kineto(H200_LLAMA)


@pytest.fixture(scope="module")
def kernels_json():
    with gzip.open(H200_LLAMA) as f:
        doc = json.load(f)
    ks = sorted((e for e in doc["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    return ks


def test_name_key_matches_ncu_and_kineto_spellings():
    ncu = "void reduce_kernel<512, 1, ReduceOp<BFloat16, MeanOps<BFloat16, float, float, BFloat16>, unsigned int, BFloat16, 4, 8>>(T3)"
    kin = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::MeanOps"
           "<c10::BFloat16, float, float, c10::BFloat16>, unsigned int, c10::BFloat16, 4, 8> >(at::native::ReduceOp<...>)")
    assert name_key(ncu) == name_key(kin) == "reduce_kernel ReduceOp BFloat16 MeanOps"
    assert name_key("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT") == "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT"


def test_six_decode_kernels_align_in_order(trace, kernels_json):
    km = load_ncu(NCU_RAW)
    j = join_ncu(trace, km)
    assert j.aligned and j.matched == 6
    rows = [m.trace_row for m in j.matches]
    assert rows == list(range(rows[0], rows[0] + 6))  # a contiguous window: no kernel filter
    # the same computation repeats every layer of every decode step: ambiguity is reported
    assert j.ambiguous and j.candidates > 1
    total = sum(round(e["dur"] * 1000) for e in kernels_json)
    for m in j.matches:
        same = [e for e in kernels_json if e["name"] == m.trace_name]
        assert m.name_count == len(same)
        assert m.time_share == pytest.approx(sum(e["dur"] * 1000 for e in same) / total, rel=1e-4)
    # the first match is the 49th kernel of the trace (sorted by start): elementwise mul of the RMSNorm
    assert kernels_json[rows[0]]["name"].startswith("void at::native::vectorized_elementwise_kernel<8, at::native::BinaryFunctor")


def test_filtered_gemms_align_as_a_subsequence(trace, kernels_json):
    j = join_ncu(trace, load_ncu(NCU_REP))
    assert j.aligned and j.matched == 2
    a, b = (m.trace_row for m in j.matches)
    assert kernels_json[a]["name"] == "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT"
    assert kernels_json[b]["name"] == "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT"
    assert b > a + 1  # other kernels (copies, attention) ran between: --kernel-name filtered them


def test_unknown_kernel_is_unmatched(trace):
    km = KernelMetrics("x", "ncu-rep", (KernelRecord(id=0, name="my_custom_kernel"),))
    j = join_ncu(trace, km)
    assert j.matched == 0 and not j.aligned and j.matches[0].time_share is None
