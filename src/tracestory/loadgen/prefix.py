"""The ``prefix_repetition`` dataset (vLLM's): prompts that share a few long prefixes.

``--prefix-repetition-num-prefixes P`` prefixes of ``--prefix-repetition-prefix-len`` tokens
each, every prompt one of them followed by its own suffix of ``--prefix-repetition-suffix-len``
tokens, asking for ``--prefix-repetition-output-len`` tokens (vLLM's defaults: 10 prefixes,
256 + 256 tokens, 128 out). It measures what a prefix cache saves: every prompt after the first
P shares its first ``prefix-len`` tokens with an earlier one.

Which prefix request ``i`` gets: requests come in blocks of P; block ``b`` uses each prefix once,
in the order ``default_rng([seed, 5, b]).permutation(P)``, so after every complete block each
prefix has served equally many requests (vLLM builds ``N // P`` per prefix and shuffles them
all; here the count is known only block by block, as the run plans them).

Texts: without a tokenizer, words ``t<k>`` (:func:`tracestory.serve.prompt_of_tokens`, keys
``prefix/<seed>/<k>`` and ``suffix/<seed>/<i>``), joined by a space: exactly ``prefix + suffix``
tokens by the word rule. With a tokenizer, each part is made its exact length as the random
dataset does (:class:`~.datasets.RandomPrompts`); the joined prompt's length is counted again
(a token may merge across the join) and a prompt that is not ``prefix + suffix`` tokens is
counted in :attr:`PromptSource.inexact`.
"""

from __future__ import annotations

import numpy as np

from ..serve import prompt_of_tokens
from .config import LoadConfig
from .datasets import Prompt, RandomPrompts, TokenizerChoice


class PrefixRepetitionPrompts(RandomPrompts):
    def __init__(self, cfg: LoadConfig, tokenizer: TokenizerChoice):
        super().__init__(cfg, tokenizer)
        self.prefix_len, self.suffix_len = cfg.prefix_len, cfg.suffix_len
        self.num_prefixes, self.output_len = cfg.num_prefixes, cfg.prefix_output_len
        self._prefix_text: dict[int, str] = {}
        self._block: tuple[int, np.ndarray] | None = None

    def prefix_of(self, i: int) -> int:
        """The prefix index of request ``i``."""
        block, pos = divmod(i, self.num_prefixes)
        if self._block is None or self._block[0] != block:
            self._block = (block, np.random.default_rng([self.seed, 5, block]).permutation(self.num_prefixes))
        return int(self._block[1][pos])

    def _part(self, n: int, key: str, rng_key: list[int]) -> str:
        if self.choice.tokenizer is None:
            return prompt_of_tokens(n, key)
        return self._exact(n, np.random.default_rng(rng_key))[0]

    def prefix_text(self, k: int) -> str:
        if k not in self._prefix_text:
            self._prefix_text[k] = self._part(self.prefix_len, f"prefix/{self.seed}/{k}", [self.seed, 6, k])
        return self._prefix_text[k]

    def __getitem__(self, i: int) -> Prompt:
        text = self.prefix_text(self.prefix_of(i)) + " " + \
            self._part(self.suffix_len, f"suffix/{self.seed}/{i}", [self.seed, 7, i])
        want = self.prefix_len + self.suffix_len
        got = want if self.choice.tokenizer is None else self.count(text)
        if got != want:
            self.inexact += 1
        return Prompt(text, got, self.output_len)
