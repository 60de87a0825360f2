"""bench llama on a CPU: the library run returns frozen results without printing; the command's
JSON against the counted work worked out by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tracestory.bench import common, llama
from tracestory.models.llama_config import LlamaConfig, layer_params


def test_run_llama_returns_frozen_results_and_prints_nothing(capsys):
    cfg = LlamaConfig.from_name("tiny")
    seen = []
    results = llama.run_llama(cfg, common.open_device("cpu"), layers=1, phases=("decode", "prefill"), batch=2,
                              seqs=(3,), kv_lens=(5, 6), variants=("eager",), dtype="float32", warmup_ms=0,
                              rep_ms=0, on_case=seen.append)
    assert capsys.readouterr().out == ""
    assert seen == results
    assert [(r.phase, r.batch, r.seq, r.kv_len) for r in results] == [
        ("decode", 2, 1, 5), ("decode", 2, 1, 6), ("prefill", 2, 3, None)]
    # decode, fp32, 1 layer: weights 43,136 x 4 B + K and V of 2 rows x (kv+1) x 2 heads x 16 x 4 B
    assert [r.bytes for r in results[:2]] == [43_136 * 4 + 2 * 2 * 6 * 2 * 16 * 4, 43_136 * 4 + 2 * 2 * 7 * 2 * 16 * 4]
    assert results[2].bytes is None and results[2].tokens_per_s == pytest.approx(6 / (results[2].median_ns * 1e-9))
    with pytest.raises(dataclasses.FrozenInstanceError):
        results[0].layers = 2


def test_cli_tiny_on_cpu(tmp_path):
    from tracestory.cli import main

    out = tmp_path / "l.json"
    rc = main(["bench", "llama", "--preset", "tiny", "--device", "cpu", "--dtype", "fp32", "--layers", "2",
               "--phase", "decode", "prefill", "--kv-len", "8", "--seq", "4", "--warmup-ms", "0", "--rep-ms", "0",
               "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0
    rows = {(r["phase"], r["variant"]): r for r in doc["results"]}
    assert set(rows) == {("decode", "eager"), ("prefill", "eager")}
    cfg = LlamaConfig.from_name("tiny")
    # tiny: 64*64*2 + 2*64*32 + 3*64*160 + 2*64 = 43,136 params; fp32 = 4 B
    assert layer_params(cfg) == 43_136
    assert rows[("decode", "eager")]["bytes"] == 2 * (43_136 * 4 + 2 * 1 * 9 * 2 * 16 * 4)
    assert rows[("prefill", "eager")]["tokens_per_s"] == pytest.approx(4 / (rows[("prefill", "eager")]["median_ns"] * 1e-9))


def _cli(tmp_path, *extra):
    from tracestory.cli import main

    out = tmp_path / "l.json"
    rc = main(["bench", "llama", "--preset", "tiny", "--device", "cpu", "--dtype", "fp32", "--layers", "1",
               "--kv-len", "8", "--warmup-ms", "0", "--rep-ms", "0", "--json", str(out), *extra])
    return rc, (json.loads(out.read_text()) if out.exists() else None)


def test_cli_flex_fp8_and_window_on_cpu(tmp_path):
    rc, doc = _cli(tmp_path, "--attention-backend", "flex", "--fp8", "rowwise", "--sliding-window", "4")
    assert rc == 0
    r = doc["results"][0]
    assert (r["attention_backend"], r["fp8"], r["sliding_window"]) == ("flex", "rowwise", 4)
    # tiny, fp8 rowwise, fp32 activations: projections 43,008 params at 1 B; scales for the output
    # rows q 64 + k 32 + v 32 + o 64 + gate 160 + up 160 + down 64 = 576, 4 B each; norms 2 x 64 x 4 B;
    # K and V over the window's 4 positions (not kv+1 = 9): 2 x 4 x 2 heads x 16 x 4 B
    assert r["bytes"] == 43_008 + 576 * 4 + 2 * 64 * 4 + 2 * 4 * 2 * 16 * 4
    assert r["first_call_ms"] > 0
    assert doc["copy_roof"] is None and r["measured_copy_fraction"] is None   # measured on CUDA only


def test_cli_decode_attention_is_an_alias(tmp_path):
    rc, doc = _cli(tmp_path, "--decode-attention", "sdpa")
    assert rc == 0 and doc["args"]["attention_backend"] == "sdpa"
    assert doc["results"][0]["attention_backend"] == "sdpa"


@pytest.mark.parametrize("flags, message", [
    (["--attention-backend", "paged"], "argument --attention-backend: invalid choice: 'paged'"),
    (["--decode-attention", "flex"], "argument --decode-attention: invalid choice: 'flex'"),
    (["--fp8", "int4"], "argument --fp8: invalid choice: 'int4'"),
    (["--sliding-window", "x"], "argument --sliding-window: invalid int value: 'x'"),
])
def test_cli_bad_flag_values_exit_2(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        _cli(tmp_path, *flags)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--sliding-window", "4"], "--sliding-window needs --attention-backend flex, found matmul"),
    (["--attention-backend", "flex", "--sliding-window", "0"], "--sliding-window: expected a positive number of keys, found 0"),
])
def test_cli_bad_window_is_one_line_exit_2(tmp_path, capsys, flags, message):
    rc, doc = _cli(tmp_path, *flags)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and doc is None
    assert err.count("\n") == 0 and message in err
