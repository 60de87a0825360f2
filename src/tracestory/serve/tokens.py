"""The token rule shared by the server and the load generator (there is no real tokenizer).

A string prompt is split on whitespace; **every word is one token**. A word ``t<k>`` (``k``
decimal digits) is token id ``k mod vocab``; any other word is ``crc32(word as UTF-8) mod
vocab``. A chat request's prompt is the words of every message's ``content`` in order, with no
template tokens. A prompt may also be a list of token ids (``0 <= id < vocab``). Generated token
``i`` is returned as the text ``" t<i>"`` (a leading space, one streamed chunk per token), so a
completion's text splits back into its ids and its word count equals ``usage.completion_tokens``.

:func:`prompt_of_tokens` builds a prompt of exactly ``n`` tokens by that rule; the load
generator uses it so that ``prompt_tokens`` in the server's usage equals the length it asked for.
"""

from __future__ import annotations

import random
import re
import zlib

_TOKEN_WORD = re.compile(r"t(\d+)\Z")

# prompt_of_tokens draws ids below this bound, so its prompts mean the same ids for any vocab
# of at least this size (the tiny preset's vocab is 512).
PROMPT_ID_RANGE = 512


def tokenize(text: str, vocab: int) -> list[int]:
    """Token ids of ``text`` by the word rule above (one id per whitespace-separated word)."""
    ids = []
    for word in text.split():
        m = _TOKEN_WORD.match(word)
        if m is not None:
            ids.append(int(m.group(1)) % vocab)
        else:
            ids.append(zlib.crc32(word.encode("utf-8")) % vocab)
    return ids


def count_tokens(text: str) -> int:
    """Number of tokens of ``text`` by the word rule (its whitespace-separated word count)."""
    return len(text.split())


def token_text(token_id: int) -> str:
    """The text the server returns for one generated token: ``" t<id>"``."""
    return f" t{int(token_id)}"


def prompt_of_tokens(n: int, seed: int = 0) -> str:
    """A prompt of exactly ``n`` tokens (``n`` words ``t<k>``, ``k`` drawn from ``seed``)."""
    if n < 0:
        raise ValueError(f"prompt_of_tokens: n must be >= 0, got {n}")
    rng = random.Random(seed)
    return " ".join(f"t{rng.randrange(PROMPT_ID_RANGE)}" for _ in range(n))
