"""The prompts of a load run: ``random`` (given token lengths) or ``sharegpt`` (a local file);
``custom`` and ``prefix_repetition`` are :mod:`.custom` and :mod:`.prefix`, and
:func:`~.prompts.prompt_source` picks one.

Tokens
------
With ``--tokenizer`` (a ``transformers`` tokenizer name or folder, loaded with
``local_files_only=True``: nothing is downloaded) every length is counted by that tokenizer
(``encode(text, add_special_tokens=False)``; a server that adds a BOS token reports one more).
Without it, because it is not given, ``transformers`` is not installed, or the tokenizer is not
available offline, lengths are **word counts** and prompts are built of words ``t<k>``: exact
for ``tracestory serve`` (one token a word), about 1-3 tokens a word for real tokenizers.
:func:`load_tokenizer` returns the choice with a one-line statement that the CLI prints and the
summary keeps.

random
------
Request ``i`` asks for an input length from ``default_rng([seed, 1])`` and an output length
(``max_tokens``) from ``default_rng([seed, 2])``, uniform integers in the configured inclusive
ranges, drawn in index order (vLLM's ``--random-input-len L --random-range-ratio r`` is the
range ``[floor(L (1 - r)), floor(L (1 + r))]``). Its text, with a tokenizer: random ids from ``default_rng([seed, 3, i])`` among the
vocabulary's word tokens (:func:`word_token_ids`; every non-special id when it has too few),
decoded and re-encoded;
when the round trip changes the count, the re-encoded ids are cut or extended and the round
trip repeated (at most 10 times); a prompt still not exact keeps its real count as its length
and is counted in :attr:`PromptSource.inexact`. Without a tokenizer:
``tracestory.serve.prompt_of_tokens(n, seed * 1_000_003 + i)``.

sharegpt
--------
A JSON list of objects with ``conversations: [{"from": ..., "value": "..."}, ...]`` (the
ShareGPT format vLLM reads). Entries with at least two turns whose first two values are strings
are usable; they are shuffled with ``default_rng(seed)`` (kept in file order with
``--disable-shuffle``); turn 0 is the prompt, turn 1's
length is the output length (or ``--sharegpt-output-len``). As vLLM does, a pair is skipped when
the prompt or (without a fixed output length) the output has fewer than 4 tokens, the prompt
more than 1024 or both together more than 2048. When the run needs more requests than there
are kept pairs, the shuffled list is reused from its start (:attr:`PromptSource.reused`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TraceFormatError, UsageError
from ..serve import count_tokens, prompt_of_tokens
from .config import LoadConfig

_ROUND_TRIPS = 10
_SHAREGPT = "a ShareGPT JSON list of {\"conversations\": [{\"from\": ..., \"value\": ...}, ...]}"


@dataclass(frozen=True)
class TokenizerChoice:
    tokenizer: Any | None           # a transformers tokenizer, or None (word counts)
    name: str | None                # what was asked for
    exact: bool                     # lengths counted by a real tokenizer
    statement: str                  # one line: what is used


@dataclass(frozen=True)
class Prompt:
    text: str
    prompt_len: int                 # tokens by the tokenizer in use (word count without one)
    output_len: int                 # max_tokens asked


def load_tokenizer(name: str | None) -> TokenizerChoice:
    """The tokenizer ``name`` from local files, or the word rule with a statement why."""
    fallback = ("prompts are built of words and lengths are word counts: exact for tracestory serve, "
                "approximate for other servers")
    if not name:
        return TokenizerChoice(None, None, False, f"no --tokenizer given: {fallback}")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return TokenizerChoice(None, name, False, f"--tokenizer {name}: transformers is not installed "
                                                  f"(pip install transformers): {fallback}")
    try:
        tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as e:  # noqa: BLE001  (transformers raises OSError, ValueError, ... by cause)
        why = " ".join(str(e).split()).split(". ")[0][:160]
        return TokenizerChoice(None, name, False, f"--tokenizer {name}: cannot be loaded offline "
                                                  f"({type(e).__name__}: {why}): {fallback}")
    return TokenizerChoice(tok, name, True, f"--tokenizer {name}: prompt and output lengths are exact token counts")


class PromptSource:
    """Prompt ``i`` of a run, built on demand (texts are not kept)."""

    inexact = 0                     # prompts whose length could not be made exact
    reused = False                  # a dataset's pairs were used more than once

    def __init__(self, tokenizer: TokenizerChoice):
        self.choice = tokenizer

    def count(self, text: str) -> int:
        tok = self.choice.tokenizer
        if tok is None:
            return count_tokens(text)
        return len(tok.encode(text, add_special_tokens=False))

    def __getitem__(self, i: int) -> Prompt:
        raise NotImplementedError


class _Draws:
    """Uniform integers in ``[lo, hi]`` from one generator, by index, drawn in blocks."""

    def __init__(self, lo: int, hi: int, seed):
        self._rng = np.random.default_rng(seed)
        self._lo, self._hi = lo, hi
        self._values = np.empty(0, dtype=np.int64)

    def __getitem__(self, i: int) -> int:
        while i >= self._values.size:
            self._values = np.concatenate([self._values, self._rng.integers(self._lo, self._hi + 1, size=1024)])
        return int(self._values[i])


def word_token_ids(tok, sample: int = 20_000, least: int = 8) -> list[int]:
    """Ids to build prompts from: tokens that decode to a space and a word of letters and
    encode back to themselves alone (such tokens, joined, usually re-encode to the same ids);
    checked over at most ``sample`` ids of the vocabulary. Fewer than ``least`` of them: every
    id but the special ones."""
    special = set(tok.all_special_ids)
    ids = [t for t in range(len(tok)) if t not in special]
    step = max(1, len(ids) // sample)
    words = []
    for t in ids[::step]:
        text = tok.decode([t])
        if len(text) > 1 and text[0] == " " and text[1:].isalpha() and \
                list(tok.encode(text, add_special_tokens=False)) == [t]:
            words.append(t)
    return words if len(words) >= least else ids


class RandomPrompts(PromptSource):
    def __init__(self, cfg: LoadConfig, tokenizer: TokenizerChoice):
        super().__init__(tokenizer)
        self.seed = cfg.seed
        self.inputs = _Draws(cfg.prompt_len_min, cfg.prompt_len_max, [cfg.seed, 1])
        self.outputs = _Draws(cfg.min_output, cfg.max_new_tokens, [cfg.seed, 2])
        if tokenizer.tokenizer is not None:
            self._ids = np.array(word_token_ids(tokenizer.tokenizer), dtype=np.int64)

    def __getitem__(self, i: int) -> Prompt:
        n, out = self.inputs[i], self.outputs[i]
        if self.choice.tokenizer is None:
            return Prompt(prompt_of_tokens(n, self.seed * 1_000_003 + i), n, out)
        text, got = self._exact(n, np.random.default_rng([self.seed, 3, i]))
        if got != n:
            self.inexact += 1
        return Prompt(text, got, out)

    def _exact(self, n: int, rng) -> tuple[str, int]:
        tok = self.choice.tokenizer
        ids = [int(x) for x in rng.choice(self._ids, size=n)]
        for _ in range(_ROUND_TRIPS):
            text = tok.decode(ids)
            enc = list(tok.encode(text, add_special_tokens=False))
            if len(enc) == n:
                return text, n
            ids = enc[:n] if len(enc) > n else enc + [int(x) for x in rng.choice(self._ids, size=n - len(enc))]
        text = tok.decode(ids)
        return text, self.count(text)


class ShareGPTPrompts(PromptSource):
    def __init__(self, cfg: LoadConfig, tokenizer: TokenizerChoice):
        super().__init__(tokenizer)
        self.path = cfg.dataset_path
        self.fixed_output = cfg.sharegpt_output_len
        self.pairs = read_sharegpt(cfg.dataset_path)
        self.order = np.arange(len(self.pairs)) if cfg.disable_shuffle else \
            np.random.default_rng(cfg.seed).permutation(len(self.pairs))
        self._kept: list[tuple[int, int, int]] = []     # (pair index, prompt len, output len)
        self._pos = 0                                   # next position in self.order

    def _scan_one(self) -> None:
        k = int(self.order[self._pos])
        self._pos += 1
        prompt, completion = self.pairs[k]
        plen = self.count(prompt)
        olen = self.fixed_output if self.fixed_output is not None else self.count(completion)
        if plen < 4 or (self.fixed_output is None and olen < 4) or plen > 1024 or plen + olen > 2048:
            return
        self._kept.append((k, plen, olen))

    def __getitem__(self, i: int) -> Prompt:
        while i >= len(self._kept) and self._pos < len(self.order):
            self._scan_one()
        if not self._kept:
            raise TraceFormatError(self.path, "ShareGPT pairs with a prompt of 4-1024 tokens, an output of at least "
                                   "4 and at most 2048 together", f"none among {len(self.pairs)} conversations")
        if i >= len(self._kept):
            self.reused = True
        k, plen, olen = self._kept[i % len(self._kept)]
        return Prompt(self.pairs[k][0], plen, olen)


def read_sharegpt(path: str | Path) -> list[tuple[str, str]]:
    """(prompt, completion) of every usable conversation of a ShareGPT file, in file order."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: expected a ShareGPT JSON file, found {'a folder' if p.is_dir() else 'no such file'}")
    try:
        doc = json.loads(p.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise TraceFormatError(p, _SHAREGPT, f"unreadable JSON ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(doc, list):
        raise TraceFormatError(p, _SHAREGPT, f"a JSON {type(doc).__name__}")
    pairs = []
    for entry in doc:
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        turns = [t.get("value") if isinstance(t, dict) else None for t in conv[:2]]
        if all(isinstance(t, str) for t in turns):
            pairs.append((turns[0], turns[1]))
    if not pairs:
        raise TraceFormatError(p, _SHAREGPT, f"no conversation with two text turns among {len(doc)} entries")
    return pairs
