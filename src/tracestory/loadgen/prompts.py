"""Which prompt source a run uses: ``--dataset-name`` -> the class that builds prompt ``i``
(:mod:`.datasets` random and sharegpt, :mod:`.custom`, :mod:`.prefix`, :mod:`.sonnet`)."""

from __future__ import annotations

from .config import LoadConfig
from .custom import CustomPrompts
from .datasets import PromptSource, RandomPrompts, ShareGPTPrompts, TokenizerChoice
from .prefix import PrefixRepetitionPrompts
from .sonnet import SonnetPrompts

SOURCES = {"random": RandomPrompts, "sharegpt": ShareGPTPrompts, "custom": CustomPrompts,
           "prefix_repetition": PrefixRepetitionPrompts, "sonnet": SonnetPrompts}


def prompt_source(cfg: LoadConfig, tokenizer: TokenizerChoice) -> PromptSource:
    return SOURCES[cfg.dataset](cfg, tokenizer)
