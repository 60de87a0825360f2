"""Attention computed as bmm + softmax ops (no attention kernel) is recognised from the CPU ops.

Real traces (tests/data/PROVENANCE.md). Expected values are from a plain JSON reading of each file,
written down here:

* TimeSformer-base (Hugging Face, eager attention): 25 ``aten::softmax`` ops; the model has 12
  blocks, each with a temporal and a spatial attention (24 softmaxes between ``Q @ K^T`` and
  ``P @ V`` matmuls); the 25th comes after the last ``aten::linear`` (the classifier's output).
  No kernel name says attention.
* A ViT through SDPA (flash kernels): attention is fused, no softmax op.
* A recommender training run (two steps sampled): its two softmaxes, one per step, are each inside
  ``fb::convex_sum`` (weights, not attention), while bmm/matmul ops run before and after them
  under other callers.
"""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import TEST_DATA

import tracestory
from tracestory.analysis.kernels import UNFUSED_ATTENTION, KernelFacts, unfused_attention
from tracestory.ingest.kineto import load_kineto
from tracestory.ingest.kineto_modules import load_module_ranges

TIMESFORMER = TEST_DATA / "field" / "AMD-AGI_TraceLens__h100_hf_timesformer_k400.json.gz"
VIT_SDPA = TEST_DATA / "field" / "AMD-AGI_TraceLens__h100_hf_vit_nsfw_detection.json.gz"
RECOMMENDER = TEST_DATA / "attention" / "hta_recommender_sampled_rank0.json.gz"


def _count(path, name):
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return sum(1 for e in events if e.get("cat") == "cpu_op" and e.get("name") == name)


def test_eager_attention_is_unfused_bmm_softmax():
    assert _count(TIMESFORMER, "aten::softmax") == 25  # the file, read with json
    evidence = unfused_attention(load_kineto(TIMESFORMER))
    assert len(evidence) == 1
    assert evidence[0].startswith("24 softmax ops between two matmul/bmm ops of the same caller")


def test_module_names_are_quoted_when_given():
    # 24 'nn.Module: TimesformerSelfAttention_<k>' python_function events in the file (json), each
    # inside a 'nn.Module: TimeSformerAttention_<k>' one
    evidence = unfused_attention(load_kineto(TIMESFORMER), load_module_ranges(TIMESFORMER))
    assert evidence[1].startswith("24 softmax ops inside modules named like attention "
                                  "(nn.Module: TimeSformerAttention_")
    assert unfused_attention(load_kineto(VIT_SDPA), load_module_ranges(VIT_SDPA)) == ()


def test_the_report_facts_say_unfused_instead_of_none():
    facts = tracestory.analyze(TIMESFORMER).runs[0].kernel_facts
    assert facts.attention == ()  # no kernel name says attention
    assert facts.attention_kind == UNFUSED_ATTENTION
    assert facts.unfused_attention and "24 softmax ops" in facts.unfused_attention[0]


@pytest.mark.parametrize("path", [VIT_SDPA, RECOMMENDER], ids=["sdpa", "recommender-convex-sum"])
def test_no_unfused_attention_where_there_is_none(path):
    assert unfused_attention(load_kineto(path)) == ()


def test_recommender_softmax_has_matmuls_around_it_but_other_callers():
    # the negative case is a real one: bmm/matmul ops exist on both sides of the softmax
    assert _count(RECOMMENDER, "aten::softmax") == 2
    assert _count(RECOMMENDER, "aten::bmm") > 0 and _count(RECOMMENDER, "aten::matmul") > 0


def test_attention_kind_reads_both_fields():
    fused = KernelFacts("eager", (), (("FlashAttention 2/3", 12, 1000),))
    assert fused.attention_kind == "fused"
    assert KernelFacts("eager", (), ()).attention_kind == "none found"
    both = KernelFacts("eager", (), (("cuDNN SDPA", 1, 10),), ("2 softmax ops between ...",))
    assert both.attention_kind == "fused and " + UNFUSED_ATTENTION
