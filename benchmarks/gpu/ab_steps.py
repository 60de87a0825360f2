"""Decode steps of several models alternated on one GPU (A, B, C, A, B, C, ...), each step
synchronised, so that clock and neighbour drift fall on every variant alike: the method of
benchmarks/gpu/pdl_ab.py and decode_attn_ab.py. Imported from this folder."""

from __future__ import annotations

import time


def alternate(models: dict, members, steps: int, warm: int = 5):
    """``{name: model}`` (:class:`tracestory.serve.model.PagedLlama`, prepared) launched on the same
    ``members`` ``steps`` times each, in turn, after ``warm`` launches each. Returns per name the
    device times (``Launch.gpu_ns``, ns), the wall times (s, launch to sampled ids) and the paths."""
    gpu = {n: [] for n in models}
    wall = {n: [] for n in models}
    paths = {n: set() for n in models}
    for m in models.values():
        for _ in range(warm):
            m.launch(members, 0).result()
    for _ in range(steps):
        for n, m in models.items():
            t = time.perf_counter()
            launch = m.launch(members, 0)
            launch.result()
            wall[n].append(time.perf_counter() - t)
            gpu[n].append(launch.gpu_ns or 0)
            paths[n].add(launch.path)
    return gpu, wall, paths
