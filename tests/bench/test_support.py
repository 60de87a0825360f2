"""The precision support table and its gate messages."""

import pytest

from tracestory.bench.support import require, sm_version, supported, unsupported_message
from tracestory.errors import UnsupportedGPU, UsageError


def test_sm_version_from_capability():
    assert sm_version((9, 0)) == 90
    assert sm_version((8, 9)) == 89
    assert sm_version((10, 3)) == 103


@pytest.mark.parametrize("precision,sm,ok", [
    ("bf16", 75, False), ("bf16", 80, True), ("bf16", 90, True),
    ("fp8", 86, False), ("fp8", 89, True), ("fp8", 90, True), ("fp8", 120, True),
    ("mxfp8", 90, False), ("mxfp8", 100, True), ("mxfp8", 120, True),
    ("nvfp4", 90, False), ("nvfp4", 100, True), ("nvfp4", 103, True), ("nvfp4", 120, False),
])
def test_table(precision, sm, ok):
    assert supported(precision, sm) is ok
    assert (unsupported_message(precision, sm) is None) is ok


def test_mxfp8_message_on_hopper():
    with pytest.raises(UnsupportedGPU) as e:
        require("mxfp8", 90)
    assert str(e.value) == "MXFP8 matmul needs Blackwell (SM100+); this GPU is SM90"


def test_other_messages_name_the_gpu():
    assert unsupported_message("nvfp4", 90) == "nvFP4 needs data-center Blackwell (SM100 or SM103); this GPU is SM90"
    assert unsupported_message("fp8", 80) == "FP8 matmul needs Ada or Hopper (SM89+); this GPU is SM80"
    require("fp8", 90)  # supported: no exception


def test_unknown_precision():
    with pytest.raises(UsageError, match="unknown precision 'int3'"):
        supported("int3", 90)
