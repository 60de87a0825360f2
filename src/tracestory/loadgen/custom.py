"""The ``custom`` dataset (vLLM's ``--dataset-name custom``): a local JSONL file of prompts.

Each non-blank line is a JSON object with a string ``prompt`` and, optionally, an integer
``output_tokens`` >= 1. The output length (``max_tokens``) of a request is
``--custom-output-len N`` when given (N > 0, vLLM's flag), the line's ``output_tokens`` with
``--custom-output-len -1`` (then every line must have one), and without the flag the line's
``output_tokens`` when it has one, else 256 (vLLM's default). The prompt's length is counted by
the tokenizer in use (or the word rule, :mod:`.datasets`). Lines are shuffled with
``default_rng(seed)`` unless ``--disable-shuffle``; a run that needs more requests than there are
lines uses them again from the start (:attr:`PromptSource.reused`). The prompt is sent as is
(completions: ``prompt``; chat: the user message): no chat template is applied.

A line that is not such an object is refused with its number (file, expected, found); the whole
file is read once (a prompt list, not a trace: no size bound beyond memory).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import TraceFormatError, UsageError
from .config import LoadConfig
from .datasets import Prompt, PromptSource, TokenizerChoice

DEFAULT_OUTPUT_LEN = 256
_EXPECTED = 'JSONL lines {"prompt": "...", "output_tokens": N (optional, >= 1)}'


def read_custom(path: str | Path) -> list[tuple[str, int | None]]:
    """``(prompt, output_tokens or None)`` of every line of a custom JSONL file, in file order."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: expected a JSONL file of prompts, found {'a folder' if p.is_dir() else 'no such file'}")
    rows: list[tuple[str, int | None]] = []
    try:
        with p.open("rb") as fh:
            for n, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except (ValueError, RecursionError):
                    raise TraceFormatError(p, _EXPECTED, f"line {n} is not JSON: {raw[:60]!r}") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                    raise TraceFormatError(p, _EXPECTED, f"line {n} has no string 'prompt'")
                out = obj.get("output_tokens")
                if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
                    raise TraceFormatError(p, _EXPECTED, f"line {n} has output_tokens {json.dumps(out)[:40]}")
                rows.append((obj["prompt"], out))
    except OSError as e:
        raise UsageError(f"{p}: cannot read ({e.strerror or e})") from None
    if not rows:
        raise TraceFormatError(p, _EXPECTED, "no line")
    return rows


class CustomPrompts(PromptSource):
    def __init__(self, cfg: LoadConfig, tokenizer: TokenizerChoice):
        super().__init__(tokenizer)
        self.path = cfg.dataset_path
        self.rows = read_custom(cfg.dataset_path)
        if cfg.custom_output_len == -1:
            missing = sum(out is None for _, out in self.rows)
            if missing:
                raise TraceFormatError(self.path, "output_tokens on every line (--custom-output-len -1)",
                                       f"{missing} of {len(self.rows)} lines without it")
        self.fixed = cfg.custom_output_len if cfg.custom_output_len not in (None, -1) else None
        self.order = np.arange(len(self.rows)) if cfg.disable_shuffle else \
            np.random.default_rng(cfg.seed).permutation(len(self.rows))

    def __getitem__(self, i: int) -> Prompt:
        if i >= len(self.rows):
            self.reused = True
        text, out = self.rows[int(self.order[i % len(self.rows)])]
        olen = self.fixed if self.fixed is not None else (out if out is not None else DEFAULT_OUTPUT_LEN)
        return Prompt(text, self.count(text), olen)
