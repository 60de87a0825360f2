"""models.pdl's switches, read without a GPU (the kernels' PDL path itself runs in tests/gpu)."""

import pytest
import torch

from tracestory.models import pdl
from tracestory.models.switches import env_on


def test_pdl_is_never_on_for_a_cpu_tensor(monkeypatch):
    monkeypatch.setenv(pdl.ENV, "1")
    assert pdl.enabled(torch.device("cpu")) is False
    assert pdl.enabled(torch.zeros(1).device) is False


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("No", False), ("1", True), ("", True)])
def test_the_switch_reads_like_the_other_engine_switches(monkeypatch, value, on):
    monkeypatch.setenv(pdl.ENV, value)
    assert env_on(pdl.ENV) is on


def test_launch_options_name_the_attribute_only_when_used():
    assert pdl.launch_options(False) == {}
    assert pdl.launch_options(True) == {"launch_pdl": True}


def test_kernel_options_carry_the_constexpr_and_the_launch_option(monkeypatch):
    assert pdl.kernel_options(torch.device("cpu")) == {"USE_PDL": False}
    monkeypatch.setattr(pdl, "enabled", lambda device: True)
    assert pdl.kernel_options(torch.device("cpu")) == {"USE_PDL": True, "launch_pdl": True}
