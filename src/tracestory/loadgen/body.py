"""The JSON body of one request, as ``vllm bench serve`` builds it for OpenAI-compatible servers.

``model`` (the served name), ``max_tokens`` (the prompt's output length), the prompt
(completions: ``prompt``; chat: one user message), ``stream`` with
``stream_options.include_usage`` (streaming) or ``stream: false`` (``--no-stream``), the sampling
fields of :attr:`LoadConfig.sampling` (``temperature`` 0 unless given, as vLLM sends it; ``top_p``,
``top_k``, ``min_p`` when given), ``ignore_eos`` when asked, then ``--extra-body`` merged last
(vLLM's order: its keys win over the sampling fields; the keys the run sets itself are refused
by :meth:`LoadConfig.validate`).
"""

from __future__ import annotations

from .config import LoadConfig
from .datasets import Prompt


def request_body(cfg: LoadConfig, prompt: Prompt) -> dict:
    body: dict = {"model": cfg.request_model, "max_tokens": prompt.output_len}
    if cfg.stream:
        body.update(stream=True, stream_options={"include_usage": True})
    else:
        body["stream"] = False
    if cfg.chat:
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    body.update(cfg.sampling)
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    body.update(cfg.extra_body)
    return body
