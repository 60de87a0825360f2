"""Request fields ``tracestory serve`` does not act on: answered 400 with the field's name.

The server decodes greedily, one choice, no log-probabilities, no tools, no structured output
and no stop strings. A request that asks for any of those gets HTTP 400 whose ``param`` names
the field, so a client can tell (an OpenAI server that ignored them silently would report
numbers for work it never did). A field set to the value that means "off" (``temperature`` 0,
``top_p`` 1, ``logprobs`` false, ``tools`` [], ``response_format`` ``{"type": "text"}``, ...)
or to null is accepted: the request asks for what greedy decoding does. Fields that change
nothing here are accepted with any value of the right type: ``seed`` (greedy decoding draws
nothing), ``user``, ``parallel_tool_calls``, ``include_stop_str_in_output``,
``skip_special_tokens``, ``spaces_between_special_tokens``. A field not listed at all is refused
as unknown (vLLM accepts unknown fields and ignores them). ``stream_options`` may hold
``include_usage`` only (the last chunk always carries ``usage``). A field of the other endpoint
(``prompt`` in a chat request; ``messages`` or ``max_completion_tokens`` in a completion) is
refused too.

Types are checked first (:mod:`.request_body`); this module checks values.
"""

from __future__ import annotations

import json

from .request_body import BadRequest

# field -> (the accepted values in words, test); None is always accepted
_OFF = {
    "temperature": ("0 (decoding is greedy)", lambda v: v == 0),
    "top_p": ("1 (decoding is greedy)", lambda v: v == 1),
    "top_k": ("-1 or 0 (decoding is greedy)", lambda v: v in (-1, 0)),
    "min_p": ("0 (decoding is greedy)", lambda v: v == 0),
    "presence_penalty": ("0", lambda v: v == 0),
    "frequency_penalty": ("0", lambda v: v == 0),
    "repetition_penalty": ("1", lambda v: v == 1),
    "best_of": ("1 (one choice)", lambda v: v == 1),
    "echo": ("false", lambda v: v is False),
    "logprobs": ("false (no log-probabilities)", lambda v: v is False),
    "top_logprobs": ("0 (no log-probabilities)", lambda v: v == 0),
    "prompt_logprobs": ("null (no log-probabilities)", lambda v: False),
    "stop": ('"" or [] (no stop strings)', lambda v: v in ("", [])),
    "stop_token_ids": ("[] (no stop tokens; see --eos-id)", lambda v: v == []),
    "min_tokens": ("0 (use ignore_eos)", lambda v: v == 0),
    "tools": ("[] (no tool calls)", lambda v: v == []),
    "functions": ("[] (no tool calls)", lambda v: v == []),
    "tool_choice": ('"none" (no tool calls)', lambda v: v == "none"),
    "function_call": ('"none" (no tool calls)', lambda v: v == "none"),
    "response_format": ('{"type": "text"} (no structured output)', lambda v: v == {"type": "text"}),
    "structured_outputs": ("null (no structured output)", lambda v: False),
    "guided_json": ("null (no structured output)", lambda v: False),
    "guided_regex": ("null (no structured output)", lambda v: False),
    "guided_choice": ("null (no structured output)", lambda v: False),
    "guided_grammar": ("null (no structured output)", lambda v: False),
    "logit_bias": ("{} (no logit bias)", lambda v: v == {}),
    "suffix": ('"" (no insertion)', lambda v: v == ""),
}
_NO_EFFECT = ("seed", "user", "parallel_tool_calls", "include_stop_str_in_output", "skip_special_tokens",
              "spaces_between_special_tokens")
_USED = ("model", "prompt", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options",
         "ignore_eos", "n")


# fields of the other endpoint: a chat request does not read a prompt, a completion no messages
_OTHER_ENDPOINT = {True: ("prompt",), False: ("messages", "max_completion_tokens")}


def unsupported_field(body: dict, chat: bool | None = None) -> BadRequest | None:
    """The first field of ``body`` (in body order) the server would not honour, as a
    :class:`BadRequest` naming it; None when every field is honoured. ``chat`` (when known)
    also refuses the other endpoint's fields."""
    for name in _OTHER_ENDPOINT.get(chat, ()):
        if body.get(name) is not None:
            where = "/v1/chat/completions reads 'messages'" if chat else \
                "/v1/completions reads 'prompt' and 'max_tokens'"
            return BadRequest(f"'{name}' is not read by this endpoint: {where}", name)
    for name, value in body.items():
        if value is None or name in _USED or name in _NO_EFFECT:
            continue
        if name not in _OFF:
            return BadRequest(f"unknown field '{name}': tracestory serve does not read it (leave it out)", name)
        accepted, ok = _OFF[name]
        if not ok(value):
            return BadRequest(f"'{name}' = {json.dumps(value)[:60]} is not supported by tracestory serve: "
                              f"send {accepted} or leave it out", name)
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            return BadRequest("'stream_options' must be an object", "stream_options")
        extra = [k for k, v in opts.items() if k != "include_usage" and v not in (None, False)]
        if extra:
            return BadRequest(f"stream_options.{extra[0]} is not supported by tracestory serve "
                              "(only include_usage; usage is always in the last chunk)", "stream_options")
    return None
