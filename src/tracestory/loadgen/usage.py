"""Sanity checks on a server's ``usage`` object: a count the server reports is trusted only when
it is a plausible count for the request that was sent.

Model
-----
A completed request whose ``usage`` fails a check is **rejected**: it becomes a failure of kind
``bad_usage`` whose error says which field, what was expected and what was found, so that a
server's nonsense never turns into a throughput ("3.9e12 tok/s, exit 0"); the result's
``failures`` and ``usage_rejected`` count these requests. Checks, each applied to a field the
server sent (a field left out or ``null`` is not reported, and our own count is used as before):

* **a non-negative JSON integer**: ``true``, ``12.5``, ``12.0``, ``"12"`` and ``-5`` are refused;
* ``completion_tokens`` at most ``2 * max_tokens * choices + 16`` (the request's ``max_tokens``;
  ``choices`` is ``n`` or ``best_of`` of ``--extra-body``, whichever is larger, else 1: the usage
  sums every choice; the margin covers a stop token or a reasoning section counted apart, not a
  10x over-count);
* streaming: ``completion_tokens`` at least half the stream's token events (a chunk with
  non-empty text carries at least one token);
* ``prompt_tokens`` at most an upper bound from our own count: with an exact tokenizer
  ``2 * planned + 1024`` (BOS, chat template), without one the prompt's UTF-8 bytes + 1024 (a
  token covers at least one byte; word counts are too rough to compare against, see
  :mod:`.datasets`);
* with an exact tokenizer, ``prompt_tokens`` at least ``planned / 4 - 16`` (a different
  tokenizer on the server, or a server that truncates, is not what the run measured).

Limits: the bounds catch absurd counts (negative, 1e12, a 10x mismatch), not a count off by a
few tokens; a server that truncates prompts on purpose (``truncate_prompt_tokens`` in
``--extra-body``) with ``--tokenizer`` given is rejected by the lower bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COMPLETION_FACTOR, COMPLETION_SLACK = 2, 16
PROMPT_FACTOR, PROMPT_SLACK = 2, 1024
PROMPT_FLOOR_DIVISOR, PROMPT_FLOOR_SLACK = 4, 16
EVENTS_DIVISOR = 2


def choices_per_request(extra_body: Mapping[str, Any]) -> int:
    """How many sequences one request asks for (``n`` / ``best_of`` of the body, at least 1)."""
    asked = [v for v in (extra_body.get("n"), extra_body.get("best_of")) if isinstance(v, int) and not
             isinstance(v, bool)]
    return max([1, *asked])


def _integer(name: str, value: Any) -> str | None:
    """Why ``value`` is not a count (None when it is one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"usage.{name}: expected a non-negative integer, found {value!r}"[:200]
    if value < 0:
        return f"usage.{name}: expected a non-negative integer, found {value}"
    return None


def check_usage(prompt_tokens: Any, completion_tokens: Any, *, max_tokens: int, planned_prompt: int,
                prompt_bytes: int, exact: bool, token_events: int | None, choices: int = 1) -> str | None:
    """The reason the server's usage is not credible, or None when it passes every check of the
    module docstring (``choices``: sequences the request asks for, :func:`choices_per_request`). ``None`` for a field means the server did not report it (not checked).
    ``token_events``: the streamed events with text (None when not streaming)."""
    if completion_tokens is not None:
        why = _integer("completion_tokens", completion_tokens)
        if why:
            return why
        most = COMPLETION_FACTOR * max_tokens * choices + COMPLETION_SLACK
        if completion_tokens > most:
            asked = f"max_tokens {max_tokens}" + (f" x {choices} choices" if choices > 1 else "")
            return f"usage.completion_tokens: expected at most {most} ({asked}), found {completion_tokens}"
        if token_events is not None and completion_tokens < token_events / EVENTS_DIVISOR:
            return (f"usage.completion_tokens: expected at least {-(-token_events // EVENTS_DIVISOR)} (the stream "
                    f"carried {token_events} token events), found {completion_tokens}")
    if prompt_tokens is not None:
        why = _integer("prompt_tokens", prompt_tokens)
        if why:
            return why
        most = (PROMPT_FACTOR * planned_prompt if exact else prompt_bytes) + PROMPT_SLACK
        if prompt_tokens > most:
            basis = f"{planned_prompt} planned tokens" if exact else f"a prompt of {prompt_bytes} bytes"
            return f"usage.prompt_tokens: expected at most {most} ({basis}), found {prompt_tokens}"
        least = planned_prompt / PROMPT_FLOOR_DIVISOR - PROMPT_FLOOR_SLACK
        if exact and prompt_tokens < least:
            return (f"usage.prompt_tokens: expected at least {int(least)} ({planned_prompt} planned tokens by "
                    f"--tokenizer), found {prompt_tokens}")
    return None
