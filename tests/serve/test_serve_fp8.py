"""``tracestory serve --fp8 rowwise|tensorwise``: the server's projections run in FP8.

Second sources: the seven projection names of a Llama layer (wq wk wv wo wg wu wd, read from the
model's definition) for what must be quantised; the OpenAI completion contract (``max_tokens``
tokens with ``ignore_eos``) for the served request; the FP8 matmul itself is checked against a
float64 reference in tests/models."""

from __future__ import annotations

import json
import urllib.request

import pytest

pytest.importorskip("torch")

from tracestory.cli import build_parser  # noqa: E402
from tracestory.models.fp8 import Fp8Weight  # noqa: E402
from tracestory.serve import ServeOptions, build_server, start_server_thread, wait_healthy  # noqa: E402

PROJECTIONS = ("wq", "wk", "wv", "wo", "wg", "wu", "wd")


@pytest.mark.parametrize("mode", ["rowwise", "tensorwise"])
def test_every_projection_is_fp8_and_the_log_says_so(tmp_path, mode):
    log = tmp_path / "s.jsonl"
    engine, _api = build_server(ServeOptions(fp8=mode, layers=2, num_blocks=32, event_log=str(log)))
    layers = engine.model.stack.layers
    assert len(layers) == 2
    for layer in layers:
        assert all(isinstance(getattr(layer, p), Fp8Weight) and getattr(layer, p).mode == mode for p in PROJECTIONS)
    engine.log.close()
    meta = json.loads(log.read_text().splitlines()[0])
    assert meta["type"] == "meta" and meta["fp8"] == mode


def test_an_fp8_server_answers_a_request(tmp_path):
    h = start_server_thread(ServeOptions(port=0, fp8="rowwise", num_blocks=64, event_log=str(tmp_path / "s.jsonl")))
    try:
        wait_healthy(h.url, timeout_s=30)
        body = json.dumps({"model": "tiny", "prompt": "hello there", "max_tokens": 5, "ignore_eos": True}).encode()
        req = urllib.request.Request(h.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            doc = json.loads(r.read())
        assert doc["usage"]["completion_tokens"] == 5
    finally:
        h.stop()


def test_fp8_flag_accepts_the_three_modes_only():
    parser = build_parser()
    assert parser.parse_args(["serve", "--fp8", "tensorwise"]).fp8 == "tensorwise"
    assert parser.parse_args(["serve"]).fp8 == "off"
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["serve", "--fp8", "e5m2"])
    assert e.value.code == 2
