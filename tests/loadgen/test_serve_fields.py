"""``tracestory serve``: request fields it does not honour are answered 400 naming the field
(never ignored), the values that mean "off" are accepted, and ``GET /v1/models/{id}``. Expected
statuses and ``param`` values are the ones :mod:`tracestory.serve.request_fields` documents."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tracestory.serve import ServeOptions, start_server_thread
from tracestory.serve.request_fields import unsupported_field

REFUSED = [
    ({"logprobs": 1}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"temperature": 0.7}, "temperature"),
    ({"top_p": 0.9}, "top_p"),
    ({"top_k": 40}, "top_k"),
    ({"stop": ["\n"]}, "stop"),
    ({"best_of": 2}, "best_of"),
    ({"echo": True}, "echo"),
    ({"logit_bias": {"5": 1}}, "logit_bias"),
    ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"min_tokens": 3}, "min_tokens"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"stream_options": {"include_usage": True, "continuous_usage_stats": True}}, "stream_options"),
]
ACCEPTED = [
    {"temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0},
    {"logprobs": False, "tools": [], "tool_choice": "none", "response_format": {"type": "text"}},
    {"stop": [], "seed": 7, "user": "u", "presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1},
    {"logprobs": None, "tools": None, "response_format": None, "n": 1, "best_of": 1, "echo": False},
    {"stream_options": {"include_usage": False}},
]


@pytest.mark.parametrize(("extra", "field"), REFUSED)
def test_unsupported_field_names_the_field(extra, field):
    err = unsupported_field({"model": "tiny", "prompt": "t1", **extra})
    assert err is not None and err.param == field and field in str(err)


@pytest.mark.parametrize("extra", ACCEPTED)
def test_values_that_mean_off_are_accepted(extra):
    assert unsupported_field({"model": "tiny", "prompt": "t1", "max_tokens": 2, **extra}) is None


def test_fields_of_the_other_endpoint_are_refused():
    assert unsupported_field({"prompt": "t1", "messages": []}, chat=True).param == "prompt"
    assert unsupported_field({"prompt": "t1", "max_completion_tokens": 3}, chat=False).param == "max_completion_tokens"
    assert unsupported_field({"messages": [], "max_completion_tokens": 3}, chat=True) is None
    assert unsupported_field({"prompt": "t1", "max_tokens": 3}, chat=False) is None


def request(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module", name="server")
def server_fixture():
    h = start_server_thread(ServeOptions(port=0, served_model_names=("tiny", "org/tiny-2")))
    yield h.url
    h.stop()


def test_server_answers_400_with_the_field_for_completions_and_chat(server):
    for path, base in (("/v1/completions", {"prompt": "t1 t2"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "t1"}]})):
        for extra, field in (REFUSED[0], REFUSED[3], REFUSED[5], REFUSED[6], REFUSED[15], ({"n": 2}, "n")):
            status, body = request(server + path, {**base, "max_tokens": 2, **extra})
            assert status == 400 and body["error"]["param"] == field, (path, extra, body)
            assert body["error"]["type"] == "invalid_request_error" and field in body["error"]["message"]
        status, body = request(server + path, {**base, "max_tokens": 2, **ACCEPTED[0], **ACCEPTED[1]})
        assert status == 200 and body["usage"]["completion_tokens"] == 2


def test_models_retrieve(server):
    for name in ("tiny", "org/tiny-2"):
        status, body = request(f"{server}/v1/models/{name}")
        assert status == 200 and (body["id"], body["object"], body["owned_by"]) == (name, "model", "tracestory")
    listed = request(server + "/v1/models")[1]["data"]
    assert [m["id"] for m in listed] == ["tiny", "org/tiny-2"]
    status, body = request(server + "/v1/models/absent")
    assert status == 404 and body["error"] == {"message": "The model `absent` does not exist.",
                                               "type": "NotFoundError", "param": "model", "code": 404}
