"""The ``sonnet`` dataset (vLLM's): prompts made of lines of a local poem file.

A prompt is ``"Pick as many lines as you can from these poem lines:\\n"``, then the file's first
lines as a shared prefix, then lines drawn at random (with replacement). The counts follow
vLLM's rule with the average line length ``a`` (tokens per line over the file) and the base
sentence's length ``b``: ``round((--sonnet-input-len - b) / a)`` lines in all, of which the
first ``max(round((--sonnet-prefix-len - b) / a), 0)`` are the prefix (vLLM's defaults: 550
tokens in, 200 of prefix, 150 out). Lines for request ``i`` come from
``default_rng([seed, 8, i])``. vLLM draws again a prompt longer than the input length; here a
prompt is drawn at most 10 times and, still too long, kept with its real length and counted in
:attr:`PromptSource.inexact`. Lengths are counted by the tokenizer in use (or the word rule);
no chat template is applied (vLLM counts the chat-formatted prompt when the tokenizer has a
template, a few tokens more).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import TraceFormatError, UsageError
from .config import LoadConfig
from .datasets import Prompt, PromptSource, TokenizerChoice

BASE_PROMPT = "Pick as many lines as you can from these poem lines:\n"
_DRAWS = 10


def read_lines(path: str | Path) -> list[str]:
    """The non-blank lines of a text file, each with its newline."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: expected a text file of poem lines, found {'a folder' if p.is_dir() else 'no such file'}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceFormatError(p, "a UTF-8 text file of poem lines", f"unreadable ({e})") from None
    lines = [x.rstrip("\r\n") + "\n" for x in text.splitlines() if x.strip()]
    if not lines:
        raise TraceFormatError(p, "a UTF-8 text file of poem lines", "no line with text")
    return lines


class SonnetPrompts(PromptSource):
    def __init__(self, cfg: LoadConfig, tokenizer: TokenizerChoice):
        super().__init__(tokenizer)
        self.lines = read_lines(cfg.dataset_path)
        self.seed, self.input_len, self.output_len = cfg.seed, cfg.sonnet_input_len, cfg.sonnet_output_len
        avg = sum(self.count(x) for x in self.lines) / len(self.lines)
        base = self.count(BASE_PROMPT)
        if self.input_len <= base:
            raise UsageError(f"--sonnet-input-len: expected more than the base prompt's {base} tokens, "
                             f"found {self.input_len}")
        self.num_lines = max(round((self.input_len - base) / avg), 1) if avg > 0 else 1
        self.num_prefix = min(max(round((cfg.sonnet_prefix_len - base) / avg), 0), self.num_lines) if avg > 0 else 0
        self.prefix = "".join(self.lines[:self.num_prefix])

    def __getitem__(self, i: int) -> Prompt:
        rng = np.random.default_rng([self.seed, 8, i])
        for _ in range(_DRAWS):
            picks = rng.integers(0, len(self.lines), size=self.num_lines - self.num_prefix)
            text = BASE_PROMPT + self.prefix + "".join(self.lines[k] for k in picks)
            n = self.count(text)
            if n <= self.input_len:
                return Prompt(text, n, self.output_len)
        self.inexact += 1
        return Prompt(text, n, self.output_len)
