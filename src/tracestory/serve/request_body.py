"""Reading one completion request body: JSON with a nesting limit, then strict field types.

Every client mistake is a :class:`BadRequest` (HTTP 400) naming the field: the body is not
JSON, nested deeper than ``max_depth`` (arrays and objects; a 100k-deep body is refused, not
answered with a recursion error), or a field has the wrong type. Types are strict, no coercion:
``stream`` and ``ignore_eos`` are JSON booleans (``"false"`` is refused, not read as true),
``max_tokens`` / ``max_completion_tokens`` positive integers, ``n`` the integer 1, ``model`` a
string, ``prompt`` a string or a list of token ids (or a batch of one of those), ``messages`` a
non-empty list of objects whose ``content`` is a string or a list of content parts, each an
object whose ``text`` (when present) is a string. The sampling fields the server ignores
(``temperature``, ``top_p``, ``stop``, ...) must still have their OpenAI types when given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .tokens import tokenize

MAX_JSON_DEPTH = 32
DEFAULT_MAX_TOKENS = 16

# ignored sampling fields and the JSON types they must have when present (None is always allowed)
_NUMBER_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                  "min_p", "top_k", "seed")
_BOOL_FIELDS = ("stream", "ignore_eos", "echo")


class BadRequest(Exception):
    """A client error: HTTP 400 with this message; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompt_ids: list[int]
    max_new_tokens: int
    stream: bool
    ignore_eos: bool


def json_depth(value, limit: int) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, ``[]`` is 1), counted without
    recursion; stops counting past ``limit`` (returns ``limit + 1``)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            d += 1
            if d > limit:
                return limit + 1
            deepest = max(deepest, d)
            stack.extend((x, d) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def load_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH):
    """The parsed body, or :class:`BadRequest` (not JSON, not UTF-8, too deep)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadRequest(f"the request body is nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON") from None
    if json_depth(body, max_depth) > max_depth:
        raise BadRequest(f"the request body is nested deeper than {max_depth} levels")
    return body


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_int(body: dict, names: tuple[str, ...], default: int) -> int:
    for name in names:
        if body.get(name) is not None:
            v = body[name]
            if not _is_int(v) or v < 1:
                raise BadRequest(f"'{name}' must be an integer >= 1, got {json.dumps(v)[:40]}", name)
            return v
    return default


def _bool(body: dict, name: str) -> bool:
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise BadRequest(f"'{name}' must be true or false, got {json.dumps(v)[:40]}", name)
    return v


def _check_sampling_types(body: dict) -> None:
    for name in _NUMBER_FIELDS:
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise BadRequest(f"'{name}' must be a number, got {json.dumps(v)[:40]}", name)
    for name in _BOOL_FIELDS:
        _bool(body, name)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise BadRequest("'stop' must be a string or a list of strings", "stop")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise BadRequest("'user' must be a string", "user")


def _message_text(i: int, msg) -> str:
    if not isinstance(msg, dict):
        raise BadRequest(f"messages[{i}] must be an object with 'role' and 'content'", "messages")
    if msg.get("role") is not None and not isinstance(msg["role"], str):
        raise BadRequest(f"messages[{i}].role must be a string", "messages")
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise BadRequest(f"messages[{i}].content[{j}] must be an object (a content part)", "messages")
            if "text" in part or part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    raise BadRequest(f"messages[{i}].content[{j}].text must be a string, got "
                                     f"{json.dumps(part.get('text'))[:40]}", "messages")
                texts.append(part["text"])
        return " ".join(texts)
    raise BadRequest(f"messages[{i}].content must be a string or a list of content parts", "messages")


def prompt_ids(body: dict, chat: bool, vocab: int) -> list[int]:
    """The prompt's token ids (token rule of :mod:`.tokens`)."""
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list of {role, content}", "messages")
        ids = []
        for i, msg in enumerate(msgs):
            ids += tokenize(_message_text(i, msg), vocab)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]            # a batch of one
        if isinstance(prompt, str):
            ids = tokenize(prompt, vocab)
        elif isinstance(prompt, list) and all(_is_int(t) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise BadRequest(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "prompt")
            ids = list(prompt)
        else:
            raise BadRequest("'prompt' must be a string or a list of token ids (one prompt per request)", "prompt")
    if not ids:
        raise BadRequest("the prompt has no tokens", "messages" if chat else "prompt")
    return ids


def parse_request(body, chat: bool, vocab: int) -> CompletionRequest:
    """Check a parsed body's fields (module docstring); raises :class:`BadRequest`."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", "model")
    if body.get("n") is not None and (not _is_int(body["n"]) or body["n"] != 1):
        raise BadRequest("only n = 1 is supported", "n")
    _check_sampling_types(body)
    ids = prompt_ids(body, chat, vocab)
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    max_new = _positive_int(body, names, DEFAULT_MAX_TOKENS)
    return CompletionRequest(model or None, ids, max_new, _bool(body, "stream"), _bool(body, "ignore_eos"))
