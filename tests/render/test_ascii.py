"""ASCII chart primitives: units, bar lengths, bin coverage, lanes, log axis (hand-computed)."""

import numpy as np
import pytest

from tracestory.render.ascii import (FULL, IDLE, PARTIAL, TRACE, Bar, Lane, bar_chart,
                                     category_glyphs, coverage, fmt_bytes, fmt_ms, fmt_ns,
                                     fmt_pct, lanes_timeline, log_axis, log_histogram,
                                     log_position, time_axis)


@pytest.mark.parametrize("ns,text", [
    (0, "0 ns"), (999, "999 ns"), (1000, "1.00 us"), (12_345, "12.3 us"), (999_499, "999 us"),
    (3_210_000, "3.21 ms"), (45_600_000, "45.6 ms"), (1_500_000_000, "1.50 s"), (None, "n/a"),
])
def test_fmt_ns_picks_the_unit(ns, text):
    assert fmt_ns(ns) == text


def test_other_formats():
    assert fmt_ms(1_234_567) == "1.235"
    assert fmt_pct(0.5234) == "52.3%"
    assert fmt_pct(None) == "n/a"
    assert fmt_bytes(1536) == "1.50 KiB"
    assert fmt_bytes(150109880320) == "140 GiB"   # 150109880320 / 2**30 = 139.8


def test_bar_lengths_are_proportional():
    lines = bar_chart([Bar("a", 4.0, "4"), Bar("bb", 2.0, "2"), Bar("c", 1.0, "1")], width=40)
    # label width 2, text width 1 -> bar area 40 - 2 - 1 - 4 = 33 cells
    bars = [line.split("│")[1] for line in lines]
    assert bars[0].count(FULL) == 33
    # 2/4 of 33 cells = 16.5 -> 16 full + one half cell
    assert bars[1].count(FULL) == 16 and bars[1].count(PARTIAL) == 1
    # 1/4 of 33 cells = 8.25 cells = 16.5 half cells; round() halves to even -> 16 -> 8 full
    assert bars[2].count(FULL) == 8 and bars[2].count(PARTIAL) == 0
    assert all(len(line) <= 40 for line in lines)


def test_coverage_per_bin_by_hand():
    # bins [0,10) [10,20) [20,30); intervals [5,15) and [12,30)
    cov = coverage(np.array([5, 12]), np.array([15, 30]), np.array([0, 10, 20, 30]))
    assert cov.tolist() == [5.0, 5.0 + 8.0, 10.0]


def test_category_glyphs_distinct():
    cats = ("gemm", "attention", "norm", "elementwise", "reduction", "softmax", "embedding",
            "rope", "quantization", "moe_routing", "communication", "memcpy", "memset", "other")
    g = category_glyphs(cats)
    assert len(set(g)) == len(cats)
    assert g[0] == "G" and g[1] == "A" and g[-1] == "o"
    assert IDLE not in g and TRACE not in g


def test_lanes_timeline_places_glyphs():
    # window [0, 1000) in 10 columns: width = label 4 + 3 + 10 = 17 -> bins of 100 ns
    lane = Lane("s7", np.array([0, 500]), np.array([200, 502]), np.array([0, 1]))
    lines = lanes_timeline([lane], ["gemm", "attention"], 0, 1000, width=17)
    row = lines[0].split("│")[1]
    assert row == "GG" + IDLE * 3 + TRACE + IDLE * 4   # 2 ns of 100 is below the 5% fill
    legend = " ".join(lines[-3:])
    assert "G=gemm" in legend and "A=attention" not in legend
    assert all(len(line) <= 17 or line.startswith("legend") for line in lines[:-1])


def test_time_axis_labels_in_a_fitting_unit():
    line1, line2 = time_axis(0, 4_000_000, 81, indent=6)
    assert line2.strip().startswith("(ms) 0")
    # span 4 ms / 8 = 0.5 ms step: ticks 0, 0.5, ..., 4.0 -> 7 inner marks plus both ends
    assert line1.count("┼") == 7 and line1.strip()[0] == "├" and line1.strip()[-1] == "┤"
    assert line2.split()[1:] == ["0", "0.50", "1.00", "1.50", "2.00", "2.50", "3.00", "3.50", "4.00"]


def test_log_position_and_axis():
    cols = log_position(np.array([1e3, 1e4, 1e5, 0.0]), 1e3, 1e6, 30)
    assert cols.tolist() == [0, 10, 20, 0]
    ticks, labels = log_axis(1e3, 1e6, 30)
    assert [i for i, c in enumerate(ticks) if c == "┼"] == [0, 10, 20, 29]
    assert labels.split() == ["1us", "10us", "100us", "1ms"]


def test_log_histogram_width_and_height():
    lines = log_histogram(np.array([1500, 2000, 30_000, 500_000, 500_000]), width=60, height=4)
    assert all(len(line) <= 60 for line in lines)
    # the tallest column holds 2 values and reaches the top row
    assert lines[0].strip().startswith("2 │")
    assert log_histogram(np.array([0, -1])) == []
