"""`tracestory load --warmup-run` and the runbook's environment variables: the warm-up's requests
reach the server but never the measured result, its result JSON has the measured one's keys, and
every setting says where it came from (flag > environment > default). Expected values are the
requests the stub server counted, the variables set here, and the rules written in each test."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tracestory.cli import build_parser
from tracestory.loadgen.session import config_from_args
from tracestory.errors import UsageError
from tracestory.loadgen.env import parse_env_value, resolve_env
from tracestory.loadgen.warmup import DEFAULT_WARMUP_REQUESTS, warmup_config, warmup_result_path

from sse_stub import Stub
from sse_stub import stub_server_fixture  # noqa: F401  (the stub_server fixture)


def _values(**flags):
    keys = ("duration", "request_rate", "prompt_len_min", "prompt_len_max", "max_new_tokens", "warmup_run",
            "warmup_duration", "warmup_requests")
    return {k: flags.get(k) for k in keys}


def test_flag_beats_environment_beats_default():
    env = {"TRACE_DURATION": "90", "TARGET_QPS": "12", "TRACESTORY_LOAD_REQUEST_RATE": "8",
           "PROMPT_LEN_MIN": "512", "PROMPT_LEN_MAX": " ", "WARMUP_RUN": "yes"}
    values = _values(duration=30.0)
    got = resolve_env(values, env)
    assert values["duration"] == 30.0 and got["duration"] == {"value": 30.0, "source": "flag"}
    # our name wins over the runbook's when both are set
    assert values["request_rate"] == 8.0 and got["request_rate"]["source"] == "env TRACESTORY_LOAD_REQUEST_RATE"
    assert values["prompt_len_min"] == 512 and got["prompt_len_min"]["source"] == "env PROMPT_LEN_MIN"
    # an empty (blank) variable is unset: the default
    assert values["prompt_len_max"] is None and got["prompt_len_max"]["source"] == "default"
    assert values["warmup_run"] is True and got["warmup_run"]["source"] == "env WARMUP_RUN"
    assert got["max_new_tokens"] == {"value": None, "source": "default"}
    nothing = _values()
    assert resolve_env(nothing, {})["request_rate"] == {"value": "inf", "source": "default"}
    assert math.isinf(nothing["request_rate"]) and nothing["warmup_run"] is False


def test_an_explicit_vllm_length_flag_is_not_overridden_by_the_runbook_variables():
    args = build_parser().parse_args(["load", "--model", "m", "--random-input-len", "100",
                                      "--random-output-len", "20"])
    got = resolve_env(vars(args), {"PROMPT_LEN_MIN": "512", "PROMPT_LEN_MAX": "1024", "MAX_NEW_TOKENS": "64"},
                      blocked={"prompt_len_min": "--random-input-len", "prompt_len_max": "--random-input-len",
                               "max_new_tokens": "--random-output-len"})
    c = config_from_args(args)
    assert (c.prompt_len_min, c.prompt_len_max, c.max_new_tokens) == (100, 100, 20)
    assert got["prompt_len_min"]["source"] == "flag --random-input-len"


@pytest.mark.parametrize("name,kind,text,expected", [
    ("TRACE_DURATION", "seconds", "abc", "TRACE_DURATION: expected a number of seconds > 0, found 'abc'"),
    ("TRACE_DURATION", "seconds", "-5", "TRACE_DURATION: expected a number of seconds > 0, found '-5'"),
    ("TRACE_DURATION", "seconds", "inf", "TRACE_DURATION: expected a number of seconds > 0, found 'inf'"),
    ("TARGET_QPS", "rate", "0", "TARGET_QPS: expected a rate > 0 requests/s or inf, found '0'"),
    ("PROMPT_LEN_MIN", "tokens", "5.5", "PROMPT_LEN_MIN: expected a whole number of tokens >= 1, found '5.5'"),
    ("MAX_NEW_TOKENS", "tokens", "0", "MAX_NEW_TOKENS: expected a whole number of tokens >= 1, found '0'"),
    ("WARMUP_RUN", "bool", "maybe", "WARMUP_RUN: expected 1/0, true/false, yes/no or on/off, found 'maybe'"),
])
def test_bad_environment_values_name_the_variable(name, kind, text, expected):
    with pytest.raises(UsageError) as e:
        parse_env_value(name, kind, text)
    assert str(e.value) == expected


def test_good_environment_values():
    assert parse_env_value("TARGET_QPS", "rate", "inf") == math.inf
    assert parse_env_value("TARGET_QPS", "rate", "12.5") == 12.5
    assert parse_env_value("WARMUP_RUN", "bool", "0") is False
    assert parse_env_value("MAX_NEW_TOKENS", "tokens", " 512 ") == 512


def test_cli_bad_environment_value_is_one_line_exit_2():
    env = {**os.environ, "TRACE_DURATION": "ninety"}
    p = subprocess.run([sys.executable, "-m", "tracestory.cli", "load", "--model", "m", "--no-progress"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "tracestory: error: TRACE_DURATION: expected a number of seconds > 0, found 'ninety'"]


def test_warmup_config_keeps_the_settings_and_changes_the_stop_rule_and_the_draws():
    from tracestory.loadgen import LoadConfig

    cfg = LoadConfig(url="http://h", model="m", request_rate=12.0, duration_s=90.0, num_requests=None, seed=3,
                     prompt_len_min=512, prompt_len_max=1024, max_new_tokens=128)
    w = warmup_config(cfg, None, None)
    assert (w.num_requests, w.duration_s, w.request_rate) == (DEFAULT_WARMUP_REQUESTS, None, 12.0)
    assert (w.prompt_len_min, w.prompt_len_max, w.max_new_tokens, w.url) == (512, 1024, 128, "http://h")
    assert w.seed != cfg.seed
    assert warmup_config(cfg, None, 5.0).duration_s == 5.0 and warmup_config(cfg, None, 5.0).num_requests is None
    with pytest.raises(UsageError, match="--warmup-requests"):
        warmup_config(cfg, 0, None)
    with pytest.raises(UsageError, match="--warmup-duration"):
        warmup_config(cfg, None, -1.0)
    assert warmup_result_path(__import__("pathlib").Path("r/x.json")).as_posix() == "r/x.warmup.json"


def test_warmup_run_is_sent_saved_apart_and_not_counted(tmp_path, stub_server):
    stub = Stub()
    url = stub_server(stub)
    env = {**os.environ, "WARMUP_RUN": "1", "TARGET_QPS": "200", "PROMPT_LEN_MIN": "3", "PROMPT_LEN_MAX": "6",
           "MAX_NEW_TOKENS": "4", "TRACE_DURATION": "60"}
    for k in ("TRACESTORY_LOAD_REQUEST_RATE", "TRACESTORY_LOAD_DURATION", "TRACESTORY_LOAD_WARMUP_RUN"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "tracestory.cli", "load", "--base-url", url, "--model", "m",
                        "--num-prompts", "5", "--warmup-requests", "3", "--max-concurrency", "1", "--duration", "30",
                        "--save-result", "--result-dir", str(tmp_path), "--result-filename", "run.json",
                        "--no-progress"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    # the server saw 3 warm-up requests, then 5 measured ones
    assert stub.n == 8
    main = json.loads((tmp_path / "run.json").read_text())
    warm = json.loads((tmp_path / "run.warmup.json").read_text())
    assert set(main) == set(warm)                                  # the same shape
    assert (main["run_kind"], warm["run_kind"]) == ("measured", "warmup")
    assert (main["completed"], main["num_prompts"]) == (5, 5)      # the warm-up is not counted
    assert (warm["completed"], warm["num_prompts"]) == (3, 3)
    assert main["warmup"]["completed"] == 3 and main["warmup"]["file"].endswith("run.warmup.json")
    # same prompt settings, other prompts: the first 3 bodies are the warm-up's
    prompts = [b["prompt"] for b in stub.bodies]
    assert not set(prompts[:3]) & set(prompts[3:])
    assert all(3 <= len(x.split()) <= 6 for x in prompts) and {b["max_tokens"] for b in stub.bodies} == {4}
    # where each setting came from
    s = main["settings"]
    assert s["request_rate"] == {"value": 200.0, "source": "env TARGET_QPS"}
    assert s["duration"] == {"value": 30.0, "source": "flag"}        # the flag beats TRACE_DURATION
    assert s["warmup_run"] == {"value": True, "source": "env WARMUP_RUN"}
    assert s["warmup_requests"] == {"value": 3, "source": "flag"}
    assert s["max_new_tokens"] == {"value": 4, "source": "env MAX_NEW_TOKENS"}
    assert main["request_rate"] == 200.0 and main["duration_limit_s"] == 30.0
    assert "load: --request-rate 200.0 from TARGET_QPS" in p.stderr
    assert "warm-up, not counted" in p.stdout


def test_warmup_duration_implies_the_warmup_and_saves_beside_the_summary(tmp_path, stub_server):
    stub = Stub()
    url = stub_server(stub)
    env = {k: v for k, v in os.environ.items() if k not in ("WARMUP_RUN", "TRACESTORY_LOAD_WARMUP_RUN")}
    summary = tmp_path / "load.summary.json"
    p = subprocess.run([sys.executable, "-m", "tracestory.cli", "load", "--base-url", url, "--model", "m",
                        "--num-prompts", "2", "--max-concurrency", "1", "--warmup-duration", "0.3",
                        "--random-input-len", "4", "--random-output-len", "2", "--json", str(summary),
                        "--no-progress"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    config = json.loads(summary.read_text())["config"]
    assert config["settings"]["warmup_run"] == {"value": True, "source": "implied by --warmup-duration"}
    warm = json.loads((tmp_path / "load.summary.warmup.json").read_text())
    assert warm["run_kind"] == "warmup" and warm["duration_limit_s"] == 0.3 and warm["num_prompts"] is None
    # rate inf with only a duration: a closed loop of 1 for 0.3 s, then the 2 measured requests
    assert stub.n == warm["completed"] + warm["failed"] + 2 and warm["completed"] >= 1
    assert config["warmup"]["completed"] == warm["completed"]
    assert json.loads(summary.read_text())["summary"]["planned"] == 2
