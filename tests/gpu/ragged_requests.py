"""The requests the serving GPU tests send (not a test module).

:func:`drive`: seven ragged requests through an engine. Prompts of 5-149 random tokens and 3-39
new tokens each (``random.Random(0)``), so a small token budget chunks the prefills and decode
runs at batch 1..4: every graph bucket kind is met. :func:`complete`: completions over HTTP."""

from __future__ import annotations

import json
import random
import urllib.request

from tracestory.serve import prompt_of_tokens
from tracestory.serve.scheduler import Scheduler, SchedulerConfig


def complete(url: str, prompt_tokens=(40, 300), max_tokens: int = 24) -> list[dict]:
    """One ``/v1/completions`` answer per prompt length (``prompt_of_tokens(n, seed=n)``, the
    served model ``llama-3-8b``, ``max_tokens`` new tokens with ``ignore_eos``), in order."""
    outs = []
    for n in prompt_tokens:
        body = {"model": "llama-3-8b", "prompt": prompt_of_tokens(n, seed=n), "max_tokens": max_tokens,
                "ignore_eos": True}
        req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            outs.append(json.loads(r.read()))
    return outs


def drive(model, *, block_size: int, num_blocks: int, max_batch_tokens: int, max_num_seqs: int):
    """(greedy token ids per request id, the path of each iteration) of one continuous-batching run."""
    s = Scheduler(SchedulerConfig(block_size=block_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens,
                                  max_num_seqs=max_num_seqs))
    rng = random.Random(0)
    for i in range(7):
        s.add_request(f"r{i}", [rng.randrange(1024) for _ in range(rng.randrange(5, 150))], rng.randrange(3, 40))
    out: dict[str, list[int]] = {}
    paths = []
    while s.has_work:
        p = s.schedule()
        launch = model.launch(p.members, p.iteration)
        paths.append(launch.path)
        for rid, tok in s.complete(p, launch.result()).new_tokens:
            out.setdefault(rid, []).append(tok)
    return out, paths
