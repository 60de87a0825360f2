"""``render.jsonable`` on both kinds of record of the results: frozen dataclasses and the
``msgspec.Struct`` records that are cheaper to create (docs/PERFORMANCE.md "Tiny-trace
analyze"). Expected values are written out by hand from the field lists of the classes."""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np

from tracestory.analysis.breakdown import KernelStat
from tracestory.analysis.timeline import Gap
from tracestory.render.jsonable import jsonable


def test_a_struct_record_becomes_its_fields_in_order_with_numpy_values_made_plain():
    k = KernelStat("gemm", "GEMM", np.int64(3000), 2, np.float64(1500.0), 1000, 2000, float("nan"))
    assert isinstance(k, msgspec.Struct)
    out = jsonable(k)
    assert out == {"name": "gemm", "category": "GEMM", "time_ns": 3000, "count": 2, "mean_ns": 1500.0,
                   "min_ns": 1000, "max_ns": 2000, "percent": None}   # NaN -> None, as for dataclasses
    assert list(out) == ["name", "category", "time_ns", "count", "mean_ns", "min_ns", "max_ns", "percent"]
    assert type(out["time_ns"]) is int and type(out["mean_ns"]) is float


def test_struct_and_dataclass_records_give_the_same_json_and_arrays_are_left_out():
    @dataclasses.dataclass(frozen=True)
    class Twin:
        a: int
        b: tuple
        c: np.ndarray

    class StructTwin(msgspec.Struct, frozen=True):
        a: int
        b: tuple
        c: np.ndarray

    arr = np.arange(3)
    gap = Gap(start_ns=10, dur_ns=20, before="gemm", after="softmax", launch_wait_ns=5)
    expected = {"a": 1, "b": [{"start_ns": 10, "dur_ns": 20, "before": "gemm", "after": "softmax",
                               "launch_wait_ns": 5}]}
    assert jsonable(Twin(1, (gap,), arr)) == jsonable(StructTwin(1, (gap,), arr)) == expected


def test_struct_records_stay_frozen_and_hashable_like_the_dataclasses_they_replaced():
    k = KernelStat("gemm", "GEMM", 3000, 2, 1500.0, 1000, 2000, 50.0)
    try:
        k.count = 3   # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("a record must not change after it is made")
    assert k == KernelStat("gemm", "GEMM", 3000, 2, 1500.0, 1000, 2000, 50.0) and hash(k) == hash(
        KernelStat("gemm", "GEMM", 3000, 2, 1500.0, 1000, 2000, 50.0))
