"""A server's ``usage`` is checked before it is believed (tracestory.loadgen.usage): against the
stub SSE server on loopback, request 1 reports a usage that is not a credible count (negative,
not an integer, far beyond max_tokens, a prompt count far from the prompt) and must become the
failure ``bad_usage`` with its reason, never a token count. Expected numbers come from the stub's
own rule (completion = max_tokens, prompt = 1000 + k % 24) and the bounds written in the module
docstring, worked out by hand below."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tracestory.loadgen import LoadConfig, benchmark_result, result_lines, run_load, summarize
from tracestory.loadgen.usage import check_usage, choices_per_request

from sse_stub import Stub
from sse_stub import stub_server_fixture  # noqa: F401  (the stub_server fixture)

MAX_TOKENS = 5        # every request asks for 5 tokens; the stub streams 5 token events


def _cfg(url, **kw) -> LoadConfig:
    base = {"url": url, "model": "m", "concurrency": 1, "num_requests": 4, "prompt_len_min": 3, "prompt_len_max": 3,
            "max_new_tokens": MAX_TOKENS, "timeout_s": 5}
    base.update(kw)
    return LoadConfig(**base)


# usage of request 1 -> the field its reason must name
BAD = [
    ({"prompt_tokens": 1001, "completion_tokens": -5}, "completion_tokens"),
    ({"prompt_tokens": -1, "completion_tokens": 5}, "prompt_tokens"),
    ({"prompt_tokens": 1001, "completion_tokens": 3.5}, "completion_tokens"),
    ({"prompt_tokens": 1001, "completion_tokens": 5.0}, "completion_tokens"),
    ({"prompt_tokens": "1001", "completion_tokens": 5}, "prompt_tokens"),
    ({"prompt_tokens": 1001, "completion_tokens": True}, "completion_tokens"),
    # 2 * 5 + 16 = 26 is the most a 5-token request may report
    ({"prompt_tokens": 1001, "completion_tokens": 3_900_000_000_000}, "completion_tokens"),
    ({"prompt_tokens": 1001, "completion_tokens": 27}, "completion_tokens"),
    # 5 token events streamed: at least 3 tokens
    ({"prompt_tokens": 1001, "completion_tokens": 2}, "completion_tokens"),
    # a prompt of 3 words "t<k>" is at most 3 * 4 + 2 = 14 bytes: at most 14 + 1024 tokens
    ({"prompt_tokens": 10**9, "completion_tokens": 5}, "prompt_tokens"),
]


@pytest.mark.parametrize("usage,field", BAD, ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD)])
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
def test_a_bad_usage_is_a_failure_with_its_reason(stub_server, usage, field, stream):
    events_bound = usage["completion_tokens"] == 2
    url = stub_server(Stub(usages={1: usage}))
    result = run_load(_cfg(url, stream=stream))
    r = result.records[1]
    if events_bound and not stream:   # no token events without streaming: that bound is not applied
        assert r.ok and r.output_tokens == 2
        return
    assert (r.ok, r.error_kind) == (False, "bad_usage")
    assert r.error.startswith(f"usage.{field}: expected ") and "found" in r.error
    # its counts are never the server's
    assert r.prompt_tokens_source == "planned" and r.output_tokens_source in ("chunks", "text")
    others = [x for k, x in enumerate(result.records) if k != 1]
    assert all(x.ok and x.output_tokens_source == "usage" for x in others)
    s = summarize(result)
    assert (s.ok, s.failed, s.failures) == (3, 1, {"bad_usage": 1})
    # the stub's rule for the 3 good ones: completion 5 each, prompt 1000 + k % 24
    assert s.output_tokens == 3 * MAX_TOKENS and s.input_tokens == 1000 + 1002 + 1003
    res = benchmark_result(result)
    assert (res["usage_rejected"], res["total_output_tokens"], res["failures"]) == (1, 15, {"bad_usage": 1})
    assert res["usage_rejected_first"] == r.error
    lines = result_lines(res, result.config, ("ttft",), (99.0,))
    assert any(x.startswith("Usage rejected: 1 completed requests") and r.error in x for x in lines)


@pytest.mark.parametrize("usage", [{"prompt_tokens": None, "completion_tokens": 5}, {"completion_tokens": 5},
                                   {"prompt_tokens": 1001, "completion_tokens": 26},
                                   {"prompt_tokens": 1001, "completion_tokens": 3}])
def test_usage_within_the_bounds_or_left_out_is_used(stub_server, usage):
    url = stub_server(Stub(usages={1: usage}))
    r = run_load(_cfg(url)).records[1]
    assert r.ok and r.output_tokens == usage["completion_tokens"] and r.output_tokens_source == "usage"
    want = (1001, "usage") if usage.get("prompt_tokens") is not None else (3, "planned")
    assert (r.prompt_tokens, r.prompt_tokens_source) == want


def test_check_usage_bounds_with_an_exact_tokenizer():
    kw = {"max_tokens": 100, "planned_prompt": 400, "prompt_bytes": 2000, "exact": True, "token_events": None}
    # exact: at most 2 * 400 + 1024 = 1824, at least 400 / 4 - 16 = 84
    assert check_usage(1824, 100, **kw) is None and check_usage(84, 100, **kw) is None
    assert check_usage(1825, 100, **kw) == "usage.prompt_tokens: expected at most 1824 (400 planned tokens), found 1825"
    assert check_usage(83, 100, **kw) == ("usage.prompt_tokens: expected at least 84 (400 planned tokens by "
                                          "--tokenizer), found 83")
    # word counts: the prompt's bytes bound it (2000 + 1024), no lower bound
    kw["exact"] = False
    assert check_usage(3024, 216, **kw) is None and check_usage(0, 0, **kw) is None
    assert "expected at most 3024 (a prompt of 2000 bytes)" in check_usage(3025, 100, **kw)
    assert check_usage(None, None, **kw) is None


def test_several_choices_per_request_widen_the_completion_bound():
    """``--extra-body '{"n": 4}'``: the usage sums 4 sequences, at most 2 x 5 x 4 + 16 = 56 tokens."""
    assert (choices_per_request({"n": 4, "best_of": 6}), choices_per_request({}),
            choices_per_request({"n": True})) == (6, 1, 1)
    kw = {"max_tokens": 5, "planned_prompt": 3, "prompt_bytes": 14, "exact": False, "token_events": None}
    assert check_usage(None, 56, choices=4, **kw) is None
    assert check_usage(None, 57, choices=4, **kw) == ("usage.completion_tokens: expected at most 56 (max_tokens 5 x 4 "
                                                     "choices), found 57")


def test_the_cli_never_prints_a_throughput_from_a_negative_usage(stub_server, tmp_path):
    """The re-audit's case: every response reports negative completion tokens. Before: a
    throughput of -1e12 tok/s and exit 0; now every request is a bad_usage failure, exit 1."""
    url = stub_server(Stub(usages={k: {"prompt_tokens": 1000, "completion_tokens": -10**12} for k in range(3)}))
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "tracestory.cli", "load", "--base-url", url, "--model", "m",
                        "--num-prompts", "3", "--max-concurrency", "1", "--random-input-len", "3",
                        "--random-output-len", "5", "--no-progress", "--skip-power-monitor", "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "Usage rejected: 3 completed requests" in p.stdout and "Failures by kind: bad_usage 3" in p.stdout
    tput = next(x for x in p.stdout.splitlines() if x.startswith("Output token throughput"))
    assert tput.split()[-1] == "0.00"          # no OK request: no token counted
    doc = json.loads(out.read_text())
    assert doc["summary"]["failures"] == {"bad_usage": 3} and doc["summary"]["output_tokens"] == 0
