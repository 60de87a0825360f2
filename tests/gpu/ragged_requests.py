"""The seven ragged requests the serving GPU tests drive through an engine (not a test module).

Prompts of 5-149 random tokens and 3-39 new tokens each (``random.Random(0)``), so a small token
budget chunks the prefills and decode runs at batch 1..4: every graph bucket kind is met."""

from __future__ import annotations

import random

from tracestory.serve.scheduler import Scheduler, SchedulerConfig


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
