"""``tracestory load``: a streaming load generator for OpenAI-compatible servers, with the flags
and the result keys of ``vllm bench serve`` (docs/LOADGEN.md).

:class:`LoadConfig` says what to run (:mod:`.config`), :func:`run_load` sends the requests
(:mod:`.generator`: arrivals and ramp-up from :mod:`.arrivals`, prompts from :mod:`.prompts`
(random, sharegpt, custom JSONL, prefix repetition), bodies from :mod:`.body`, backoff from
:mod:`.backoff`; :mod:`.profile` asks the server to start and stop its profiler), :func:`benchmark_result` turns the records into vLLM's flat result in ms
(:mod:`.metrics`) and :func:`summarize` into our nested summary in ns that ``tracestory
report`` reads (:mod:`.stats`). :mod:`.env` reads the capture runbook's environment variables
(flag > environment > default, each setting's source kept) and :mod:`.warmup` configures the
warm-up run that ``--warmup-run`` sends first. aiohttp (the ``load`` extra) is imported only when
a run starts.
"""

from __future__ import annotations

from .arrivals import arrival_offsets_ns
from .config import (
                        LoadConfig,
                        parse_extra_body,
                        parse_goodput,
                        parse_metadata,
                        parse_metric_percentiles,
                        parse_percentile_metrics,
                        validate_base_url,
)
from .custom import read_custom
from .datasets import load_tokenizer, read_sharegpt
from .generator import ERROR_KINDS, LoadProgress, LoadResult, RequestRecord, run_load
from .metrics import benchmark_result, result_lines
from .prompts import prompt_source
from .stats import Distribution, LoadSummary, distribution, percentile, summarize

__all__ = [
                        "ERROR_KINDS",
                        "Distribution",
                        "LoadConfig",
                        "LoadProgress",
                        "LoadResult",
                        "LoadSummary",
                        "RequestRecord",
                        "arrival_offsets_ns",
                        "benchmark_result",
                        "distribution",
                        "load_tokenizer",
                        "parse_extra_body",
                        "parse_goodput",
                        "parse_metadata",
                        "parse_metric_percentiles",
                        "parse_percentile_metrics",
                        "percentile",
                        "prompt_source",
                        "read_custom",
                        "read_sharegpt",
                        "result_lines",
                        "run_load",
                        "summarize",
                        "validate_base_url",
]
