"""The tensor-parallel all-reduce of the row-parallel projections (``model.tp_reduce``).

Model: a TP=N decode step runs two all-reduces per layer of ``rows x D`` activations (rows = the
batch bucket, 1..32; D = 4,096 on llama-3-8b). At that size an all-reduce is latency: NCCL took
11.9-14.3 us per call at TP=2 inside a CUDA graph, torch's symmetric-memory kernels 7.2-10.3 us
(docs/BENCHMARKS.md, "Decode-size all-reduce"). :class:`AllReduce` is a callable ``x -> sum of x
over the ranks`` (in place, like ``dist.all_reduce``) that picks per call, by the message size:

* ``one-shot`` (``torch.ops.symm_mem.one_shot_all_reduce_copy_out``) up to the first of
  :data:`THRESHOLDS` for the world size (:data:`DEFAULT_THRESHOLDS` for others):
  one kernel copies this rank's ``x`` into its slot of a symmetric buffer, waits for the peers
  (signal pads), reads every rank's slot over NVLink and writes the sum back into ``x``; no NCCL,
  no extra copy kernel;
* ``two-shot`` (``x`` copied into the buffer, then ``two_shot_all_reduce_out``: reduce-scatter +
  all-gather over the symmetric buffers) up to the second;
* ``dist.all_reduce`` (NCCL) above that, and for any tensor the buffer cannot take (another
  dtype, not contiguous, larger than the buffer).

Every rank makes the same choice for the same tensor shape, so the collectives pair. The
symmetric buffer is allocated and exchanged once (:meth:`AllReduce.prepare`, from
:meth:`~.model.PagedLlama.prepare`, before any CUDA graph is captured): ``rows x D`` of the
model's dtype, rows = the largest iteration a graph holds (decode bucket + chunk bucket). Set-up
checks a sum on every rank and all ranks agree (an NCCL ``MIN`` of their verdicts) before
symmetric memory is used; otherwise every call goes to ``dist.all_reduce``.

Fallback to ``dist.all_reduce`` (the reason in :attr:`AllReduce.info`, logged once at start-up
as ``startup.all_reduce`` in the event log): a CPU run (gloo), a torch without
``torch.distributed._symmetric_memory`` or its ops, a dtype the kernels lack (they take bf16 and
fp32), an error at set-up, or ``TRACESTORY_ALLREDUCE=nccl``, **the default**: NCCL stays the
all-reduce unless ``TRACESTORY_ALLREDUCE=auto`` asks for symmetric memory, because it did not
make a step faster (below).

Numerics: the symmetric kernels add the ranks' values in rank order in the tensor's dtype; NCCL's
ring adds in its own order. At TP=2 both compute ``x0 + x1`` rounded once (the same bits); at
TP=4 the grouping may differ, so the last bits may.

Measured effect (docs/BENCHMARKS.md, session 10): none at the step level. The kernels save 3-9 us
per all-reduce in isolation, but a decode step with them was not faster than with NCCL in a
same-call A/B (TP=2/4, batch 1-8), and the serving rows stayed within a few percent of NCCL's;
the ranks' skew, not the all-reduce latency, sets a TP decode step there.

Limits: one node (peers' buffers over NVLink/P2P); NVLink multicast stays off
(``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, :data:`~.tensor_parallel.SAFE_NCCL_ENV`), so the multimem
kernels are not used. The thresholds are constants measured on H100s (docs/BENCHMARKS.md), not
tuned at start-up. A rank whose set-up raises inside the buffer exchange while the others wait
in it cannot be rescued here (the exchange is collective); the checks that can differ between
ranks run before it.
"""

from __future__ import annotations

import os

ENV = "TRACESTORY_ALLREDUCE"
MODES = ("auto", "nccl")
# (one-shot up to, two-shot up to) bytes per world size; above: NCCL. Measured at TP=2 (H100,
# benchmarks/gpu/allreduce_small.py, in a CUDA graph, with the copy-in the server does): one-shot
# 9.0-11.6 us at 1-32 rows of 4,096 bf16 against NCCL's 12.0-15.2, still ahead at 128 rows
# (16.7 vs 21.0 us); two-shot ahead of both from 256 rows (21.0 vs 23.1 one-shot, 35.3 NCCL) to
# 2,080 rows (75.2 vs 92.9 us NCCL). Other world sizes: decode buckets only (up to 32 rows), NCCL
# above (TP=4's sweep, measured after: two-shot would beat NCCL from 128 rows too; not run in a server).
THRESHOLDS = {2: (1 << 20, 64 << 20)}
DEFAULT_THRESHOLDS = (256 << 10, 256 << 10)


def _agreed(reason: str, device, other: str) -> str:
    """This rank's ``reason`` for not using symmetric memory, or ``other`` when this rank has
    none but another rank has one (a MIN all-reduce of "can": every rank must call it)."""
    import torch
    import torch.distributed as dist

    ok = torch.tensor([0 if reason else 1], dtype=torch.int32, device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return reason or ("" if int(ok.item()) else other)


def mode() -> str:
    """``TRACESTORY_ALLREDUCE``: ``nccl`` (default) or ``auto`` (symmetric memory where it can run);
    ValueError for another value (read like ``TRACESTORY_GLUE``)."""
    m = os.environ.get(ENV, "nccl").strip().lower() or "nccl"
    if m not in MODES:
        raise ValueError(f"{ENV}: expected one of {', '.join(MODES)}, found {m!r}")
    return m


class AllReduce:
    """``x -> x`` summed over the default process group, in place (module docstring).

    Until :meth:`prepare` succeeded (and on the CPU) every call is ``dist.all_reduce``."""

    def __init__(self, one_shot_max_bytes: int | None = None, two_shot_max_bytes: int | None = None):
        self._limits = (one_shot_max_bytes, two_shot_max_bytes)   # None: by world size at prepare()
        self.one_max, self.two_max = DEFAULT_THRESHOLDS
        self._buf = None                 # flat symmetric buffer (elements), or None: NCCL only
        self._group = ""
        self._two_out = False            # torch has two_shot_all_reduce_out (else in place + copy)
        self.info: dict = {"chosen": "dist.all_reduce", "reason": "not prepared"}
        self.calls = {"one_shot": 0, "two_shot": 0, "dist": 0}   # per kind, counted in Python (graph captures once)

    def __call__(self, x):
        buf = self._buf
        if buf is not None and x.dtype == buf.dtype and x.is_contiguous() and _aligned(x):
            nbytes = x.numel() * x.element_size()
            if nbytes <= self.one_max and x.numel() <= buf.numel():
                import torch

                self.calls["one_shot"] += 1
                flat = x.view(-1)
                torch.ops.symm_mem.one_shot_all_reduce_copy_out(buf[:flat.numel()], flat, "sum", self._group, flat)
                return x
            if nbytes <= self.two_max and x.numel() <= buf.numel():
                import torch

                self.calls["two_shot"] += 1
                flat = x.view(-1)
                b = buf[:flat.numel()]
                b.copy_(flat)
                if self._two_out:
                    torch.ops.symm_mem.two_shot_all_reduce_out(b, "sum", self._group, flat)
                else:
                    torch.ops.symm_mem.two_shot_all_reduce_(b, "sum", self._group)
                    flat.copy_(b)
                return x
        import torch.distributed as dist

        self.calls["dist"] += 1
        dist.all_reduce(x)
        return x

    def prepare(self, rows: int, dim: int, dtype, device, say=None) -> dict:
        """Allocate and exchange the symmetric buffer for up to ``rows x dim`` elements of
        ``dtype`` on ``device`` (collective: every rank calls it with the same arguments);
        returns :attr:`info` (what was chosen and why), ``say(line)`` told it once."""
        import torch.distributed as dist

        self._buf = None
        backend, world = dist.get_backend(), dist.get_world_size()
        one, two = THRESHOLDS.get(world, DEFAULT_THRESHOLDS)
        self.one_max = int(self._limits[0] if self._limits[0] is not None else one)
        self.two_max = int(self._limits[1] if self._limits[1] is not None else two)
        info: dict = {"chosen": "dist.all_reduce", "backend": backend, "world_size": world}
        reason = self._local_reason(backend, dtype, device)
        if backend == "nccl":             # every rank must agree before the collective exchange
            reason = _agreed(reason, device, "another rank cannot use symmetric memory")
        if not reason:
            try:
                reason = self._set_up(rows * dim, dtype, device)
            except Exception as e:  # noqa: BLE001 -- any set-up error: NCCL serves
                reason = "set-up failed: " + (" ".join(str(e).split())[:200] or type(e).__name__)
            reason = _agreed(reason, device, "set-up failed on another rank")
            if reason:
                self._buf = None
        if reason:
            info["reason"] = reason
            line = f"all-reduce: dist.all_reduce ({backend}): {reason}"
        else:
            info.update(chosen="symm_mem", one_shot_max_bytes=self.one_max, two_shot_max_bytes=self.two_max,
                        buffer_bytes=self._buf.numel() * self._buf.element_size(), group=self._group,
                        two_shot_out=self._two_out)
            line = (f"all-reduce: symmetric memory (one-shot up to {self.one_max // 1024} KiB, "
                    + (f"two-shot up to {self.two_max // 1024} KiB, " if self.two_max > self.one_max else "")
                    + f"{backend} above; buffer {info['buffer_bytes'] / 2**20:.1f} MiB)")
        self.info = info
        if say is not None:
            say(line)
        return info

    def _local_reason(self, backend: str, dtype, device) -> str:
        """Why this rank cannot use symmetric memory ('' when it can try)."""
        import torch

        if mode() == "nccl":
            return f"{ENV}=nccl" if os.environ.get(ENV) else f"NCCL is the default ({ENV}=auto tries symmetric memory)"
        if backend != "nccl" or not str(device).startswith("cuda"):
            return f"no symmetric memory on {backend} / {device}"
        if dtype not in (torch.bfloat16, torch.float32):
            return f"the symmetric-memory kernels take bf16 and fp32, not {dtype}"
        try:
            import torch.distributed._symmetric_memory  # noqa: F401
        except ImportError as e:
            return f"no torch.distributed._symmetric_memory ({e})"
        ops = getattr(torch.ops, "symm_mem", None)
        for name in ("one_shot_all_reduce_copy_out", "two_shot_all_reduce_"):
            if ops is None or not hasattr(ops, name):
                return f"torch {torch.__version__} has no torch.ops.symm_mem.{name}"
        return ""

    def _set_up(self, numel: int, dtype, device) -> str:
        """Allocate, exchange and check the buffer; '' when the kernels summed correctly."""
        import warnings

        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm

        group = dist.group.WORLD.group_name
        with warnings.catch_warnings():          # enable_symm_mem_for_group is deprecated (a no-op) in new torch
            warnings.simplefilter("ignore")
            if hasattr(symm, "enable_symm_mem_for_group"):
                symm.enable_symm_mem_for_group(group)
        buf = symm.empty(numel, dtype=dtype, device=device)
        symm.rendezvous(buf, group)
        self._buf, self._group = buf, group
        self._two_out = hasattr(torch.ops.symm_mem, "two_shot_all_reduce_out")
        rank, n = dist.get_rank(), dist.get_world_size()
        want = float(n * (n + 1) // 2)
        # one check per kernel kind on a decode-size tensor; the dispatch above picks them by size
        es = buf.element_size()
        for kind, limit in (("one_shot", self.one_max), ("two_shot", self.two_max)):
            nbytes = min(limit, numel * es)
            if kind == "two_shot" and nbytes <= self.one_max:
                continue                         # no two-shot size fits this buffer
            size = max(8, nbytes // es - (nbytes // es) % 8)
            x = torch.full((size,), float(rank + 1), dtype=dtype, device=device)
            before = dict(self.calls)
            self(x)
            torch.cuda.synchronize(device)
            if self.calls[kind] == before[kind]:
                return f"the {kind} path was not taken for {x.numel()} elements (thresholds?)"
            if not bool((x == want).all().item()):
                return f"the {kind} kernel's sum was wrong on rank {rank}"
        self.calls = {k: 0 for k in self.calls}
        return ""


def _aligned(x) -> bool:
    """Start and size on 16 bytes, as the buffer's slices are (the one-shot kernel wants the
    same alignment for both)."""
    es = x.element_size()
    return (x.storage_offset() * es) % 16 == 0 and (x.numel() * es) % 16 == 0
