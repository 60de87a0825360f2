"""Flags of `tracestory load`: URL validation (one line, exit 2), --goodput in ms,
--percentile-metrics / --metric-percentiles / --metadata parsing, the older flags as aliases."""

from __future__ import annotations

import json
import math
import re
import socket
import subprocess
import sys

import pytest

from tracestory.cli import build_parser
from tracestory.loadgen.session import config_from_args
from tracestory.errors import UsageError
from tracestory.loadgen import (
    LoadConfig,
    parse_goodput,
    parse_metadata,
    parse_metric_percentiles,
    parse_percentile_metrics,
    validate_base_url,
)


@pytest.mark.parametrize("url, expected", [
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
    ("https://example.org/api", "https://example.org/api"),
    ("http://[::1]:8000", "http://[::1]:8000"),
])
def test_good_urls(url, expected):
    assert validate_base_url(url) == expected


@pytest.mark.parametrize("url, why", [
    ("127.0.0.1:8000", "no scheme: add http://"),
    ("localhost", "no scheme"),
    ("ftp://h:21", "scheme 'ftp'"),
    ("http://", "no host"),
    ("http://h:99999", "the port is not a number"),
    ("http://h:abc", "the port is not a number"),
    ("http://h:0", "port 0"),
    ("http://h:80/x?y=1", "query or fragment"),
    ("http://a b:80", "whitespace"),
    ("http://u:p@h:80", "credentials"),
])
def test_bad_urls_say_what_is_wrong(url, why):
    with pytest.raises(UsageError) as e:
        validate_base_url(url)
    assert why in str(e.value) and repr(url) in str(e.value)


def test_cli_bad_url_is_one_line_exit_2():
    p = subprocess.run([sys.executable, "-m", "tracestory.cli", "load", "--base-url", "localhost:8000",
                        "--model", "m", "--no-progress"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "tracestory: error: --base-url: expected http://HOST[:PORT][/PATH] or https://..., found "
        "'localhost:8000' (no scheme: add http://)"]


def test_goodput_in_ms():
    assert parse_goodput(["ttft:500", "tpot:50", "e2el:1e3"]) == {"ttft": 500.0, "tpot": 50.0, "e2el": 1000.0}
    assert parse_goodput(None) == {}
    for bad, msg in (("ttft=5", "METRIC:MS"), ("itl:5", "METRIC:MS"), ("ttft:-1", "> 0"), ("ttft:x", "number"),
                     ("ttft:inf", "> 0")):
        with pytest.raises(UsageError, match=msg):
            parse_goodput([bad])
    with pytest.raises(UsageError, match="twice"):
        parse_goodput(["ttft:1", "ttft:2"])


def test_percentiles_metrics_metadata():
    assert parse_percentile_metrics("ttft, e2el,ttft") == ("ttft", "e2el")
    assert parse_metric_percentiles("50,90,99.9") == (50.0, 90.0, 99.9)
    assert parse_metadata(["gpu=H100", "note=a=b"]) == {"gpu": "H100", "note": "a=b"}
    for fn, bad in ((parse_percentile_metrics, "ttft,foo"), (parse_metric_percentiles, "0"),
                    (parse_metric_percentiles, "101"), (parse_metric_percentiles, "x"), (parse_metadata, ["nokey"])):
        with pytest.raises(UsageError):
            fn(bad)


def args_of(*words):
    return build_parser().parse_args(["load", "--model", "m", *words])


def test_vllm_flags_and_the_older_names():
    c = config_from_args(args_of("--host", "10.0.0.2", "--port", "9000", "--backend", "openai-chat",
                                 "--request-rate", "inf", "--max-concurrency", "8", "--num-prompts", "50",
                                 "--random-input-len", "100", "--random-output-len", "20",
                                 "--random-range-ratio", "0.25", "--goodput", "ttft:300"))
    assert c.request_url == "http://10.0.0.2:9000/v1/chat/completions" and c.chat
    assert math.isinf(c.request_rate) and c.max_concurrency == 8 and c.num_requests == 50
    assert (c.prompt_len_min, c.prompt_len_max, c.min_new_tokens, c.max_new_tokens) == (75, 125, 15, 25)
    assert c.goodput_ms == {"ttft": 300.0} and c.mode == "concurrency"
    old = config_from_args(args_of("--url", "http://h:1", "--target-qps", "4", "--duration", "30",
                                   "--num-requests", "7", "--prompt-len-min", "8", "--prompt-len-max", "16",
                                   "--max-new-tokens", "4", "--slo-ttft", "0.5", "--slo-itl", "0.05",
                                   "--endpoint", "chat"))
    assert old.request_url == "http://h:1/v1/chat/completions" and old.request_rate == 4.0
    assert (old.duration_s, old.num_requests, old.prompt_len_min, old.prompt_len_max) == (30.0, 7, 8, 16)
    assert (old.min_new_tokens, old.max_new_tokens) == (4, 4)
    assert old.goodput_ms == {"ttft": 500.0, "tpot": 50.0} and old.mode == "poisson"
    assert LoadConfig(url="http://h", model="m", concurrency=3).max_concurrency == 3


def test_bad_values_are_usage_errors():
    for kw, msg in (({"request_rate": 0.0}, "--request-rate"), ({"burstiness": 0.0}, "--burstiness"),
                    ({"max_concurrency": 0}, "--max-concurrency"), ({"endpoint": "v1/x"}, "--endpoint"),
                    ({"dataset": "sharegpt"}, "--dataset-path"), ({"model": "a b"}, "--model"),
                    ({"prompt_len_min": 10, "prompt_len_max": 5}, "--prompt-len-max")):
        with pytest.raises(UsageError, match=msg):
            LoadConfig(url="http://h", model=kw.pop("model", "m"), **kw).validate()
    with pytest.raises(UsageError, match="--random-range-ratio"):
        config_from_args(args_of("--random-range-ratio", "1.5"))


def run_cli(cwd, *words):
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{port.getsockname()[1]}"   # bound, not listening: refused
    try:
        return subprocess.run([sys.executable, "-m", "tracestory.cli", "load", "--base-url", url, "--model", "org/m",
                               "--num-prompts", "1", "--max-concurrency", "1", "--no-progress", *words],
                              cwd=cwd, capture_output=True, text=True, timeout=60)
    finally:
        port.close()


def test_files_only_when_asked_and_vllm_default_name(tmp_path):
    p = run_cli(tmp_path)
    assert p.returncode == 1, p.stderr                    # nothing completed
    assert list(tmp_path.iterdir()) == []                 # nothing written into the current folder
    assert "Successful requests:                     0" in p.stdout
    p = run_cli(tmp_path, "--save-result", "--label", "lbl", "--result-dir", "out")
    names = [x.name for x in (tmp_path / "out").iterdir()]
    assert len(names) == 1 and re.fullmatch(r"lbl-infqps-concurrency1-m-\d{8}-\d{6}\.json", names[0]), names
    res = json.loads((tmp_path / "out" / names[0]).read_text())
    assert (res["completed"], res["failed"], res["failures"]) == (0, 1, {"connection_refused": 1})
    assert res["mean_ttft_ms"] is None and "ttfts" not in res      # per-request lists only with --save-detailed


def test_unwritable_or_clashing_outputs_are_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    p = run_cli(tmp_path, "--output", str(tmp_path / "f" / "sub" / "r.jsonl"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "cannot create its folder" in p.stderr
    data = tmp_path / "sg.json"
    data.write_text("[]")
    p = run_cli(tmp_path, "--dataset-name", "sharegpt", "--dataset-path", str(data), "--output", str(data))
    assert p.returncode == 2 and "refusing to overwrite" in p.stderr and data.read_text() == "[]"
    p = run_cli(tmp_path, "--dataset-name", "sharegpt", "--dataset-path", str(data))
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"tracestory: error: {data}: expected a ShareGPT JSON list of {{\"conversations\": [{{\"from\": ..., "
        f"\"value\": ...}}, ...]}}, found no conversation with two text turns among 0 entries"]
