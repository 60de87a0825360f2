"""examples/tiny_llama.py: its KV-cache decode step against the full causal forward, and the
README's ``capture torch --range decode`` example run as written.

Expected values: the decode step at position p must equal row p of the full forward over the
prompt plus the new token (causal attention: row p sees rows 0..p); the captured trace is read
with plain gzip + json.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import shlex
import sys

import torch

from conftest import REPO
from tracestory.cli import main

EXAMPLE = REPO / "examples" / "tiny_llama.py"


def _example():
    spec = importlib.util.spec_from_file_location("tiny_llama_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod              # dataclasses look the module up while it executes
    spec.loader.exec_module(mod)
    return mod


def test_decode_steps_equal_the_full_causal_forward():
    ex = _example()
    c = ex.Config(dim=32, n_heads=4, hidden=48, seq_len=5, batch=2)
    torch.manual_seed(0)
    layer = ex.Layer(c).double()
    seq = torch.randn(2, 8, 32, dtype=torch.float64)        # 5 prompt positions, then 3 new tokens
    with torch.inference_mode():
        full = layer(seq)
        cache = layer.prefill_cache(seq[:, :5], max_len=8)
        steps = [layer.decode_step(seq[:, p:p + 1], cache, p) for p in (5, 6, 7)]
    for p, out in zip((5, 6, 7), steps):
        assert torch.allclose(out[:, 0], full[:, p], atol=1e-12, rtol=0)


def test_readme_decode_capture_example(clean_cwd):
    line = next(x for x in (REPO / "README.md").read_text().splitlines() if "--range decode" in x)
    words = shlex.split(line.split("#")[0])
    assert words[:2] == ["tracestory", "capture"] and words[-2:] == ["python", "examples/tiny_llama.py"]
    argv = words[1:-2] + [sys.executable, str(EXAMPLE)]     # the same command, this interpreter
    assert main(argv) == 0
    with gzip.open(clean_cwd / "artifacts" / "tiny_llama" / "torch" / "rank0.trace.json.gz", "rt") as f:
        names = [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "user_annotation"]
    # --skip 20 --count 1: exactly one decode step recorded, with its attention and mlp inside
    assert (names.count("decode"), names.count("attention"), names.count("mlp")) == (1, 1, 1)
    assert "BENCHMARK" not in names
