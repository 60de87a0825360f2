"""The one unit chooser: edge values pinned by hand (the unit is chosen after rounding)."""

from __future__ import annotations

import pytest

from tracestory.units import fmt_bytes, fmt_ns, fmt_pct, fmt_si


@pytest.mark.parametrize("ns, text", [
    (0, "0 ns"), (999.4, "999 ns"), (999.6, "1.00 us"), (1_000, "1.00 us"), (12_345, "12.3 us"),
    (999_499, "999 us"), (999_999, "1.00 ms"), (1_500_000, "1.50 ms"), (2_500_000_000, "2.50 s"),
    (-999_999, "-1.00 ms"), (None, "n/a"), (float("nan"), "n/a"),
])
def test_fmt_ns_edges(ns, text):
    assert fmt_ns(ns) == text


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"), (1_048_575, "1.00 MiB"),
    (3 * 2**30, "3.00 GiB"), (None, "n/a"),
])
def test_fmt_bytes_edges(n, text):
    assert fmt_bytes(n) == text


def test_fmt_si_and_pct():
    assert fmt_si(4.27e12, "B/s") == "4.27 TB/s"
    assert fmt_si(999.9e9, "FLOP/s") == "1.00 TFLOP/s"
    assert fmt_si(None, "B/s") == "n/a"
    assert fmt_pct(0.523) == "52.3%" and fmt_pct(None) == "n/a"


def test_a_return_type_before_the_name_is_not_the_name():
    """cuBLAS's gemvx kernel as nsys prints it: its return type (std::enable_if<...>::type) comes
    first; the name is gemvx's kernel. Words that are not a C++ type stay (a memcpy)."""
    from tracestory.units import kernel_base, short_name

    gemvx = ("std::enable_if<!T7, void>::type internal::gemvx::kernel<int, int, __nv_bfloat16, float, (bool)0>"
             "(cublasGemvParamsEx<int>)")
    assert kernel_base(gemvx) == "gemvx::kernel"
    assert short_name(gemvx).startswith("gemvx::kernel[")
    assert short_name("Memcpy HtoD (Pinned -> Device)") == "Memcpy HtoD (Pinned -> Device)"
    assert short_name("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(P)") == (
        "cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_al…")
