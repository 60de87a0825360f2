"""Tensor-parallel serving: ``tracestory serve --tensor-parallel N`` under ``torchrun``.

Model (Megatron-style, over the projections of :class:`~.model.PagedLlama`)::

    column-parallel (split by output rows):  wq, wk, wv by heads;  wg, wu by rows of the MLP
    row-parallel    (split by input columns): wo, wd, their outputs summed by all-reduce
    vocab-parallel: LM head rows r·V/N .. (r+1)·V/N - 1 (when V divides by N and the ranks can
                    all-gather), greedy ids by :func:`vocab_parallel_argmax`
    replicated: token embedding, norms (and the LM head when V does not divide by N)

Rank ``r`` of ``N`` keeps query heads ``r·H/N .. (r+1)·H/N - 1``, KV heads ``r·Hkv/N ..`` (the
query heads of a KV-head group stay on the rank of their KV head), MLP rows ``r·I/N ..``, and a
local K/V cache of ``Hkv/N`` heads. ``model.cfg`` becomes the local config (``H/N``, ``Hkv/N``,
``I/N``, head dim unchanged), and ``model.tp_reduce`` an all-reduce (sum) over the group, so the
model's own forward runs unchanged on a shard (under ``serve``: :class:`.allreduce.AllReduce`,
torch's symmetric-memory kernels on GPUs where they set up, else ``dist.all_reduce``). Every rank builds the full weights from the
same ``--seed`` and keeps its slice, so TP=N computes the TP=1 model: on the CPU in float32 the
greedy tokens are the same (the sums are regrouped, so logits may differ in the last bits).
H, Hkv and I must be divisible by N (one-line error otherwise). The full weights exist on
each device for a moment while it builds (the slices are then copied and the rest freed).

Serving: rank 0 owns HTTP, the scheduler, the event log and the metrics. Each iteration it
sends the plan (members' token ids, starts, block tables, which sample; the iteration number)
to the other ranks over a gloo control group, then runs the forward; the others receive the
plan and run the same forward, so their all-reduces pair with rank 0's. Every rank computes the
greedy ids from identical all-reduced hidden states, so the ids that stay on each device for
the next iteration (``-(r+1)`` inputs of the overlapped engine) agree; only rank 0's reach the
scheduler. Plans travel as two int64 broadcasts (a 6-number header, then one payload tensor):
:func:`encode_plan` / :func:`decode_plan`, no pickle. Measured against
``broadcast_object_list`` on two CPU processes with gloo (``benchmarks/tp_plan_broadcast.py``,
docs/CAPTURE.md): the same within that machine's noise, the pickled tuples a little cheaper at
128 members x 64 blocks (packing and unpacking in Python costs more there).

Liveness and stop: while idle, rank 0 sends a heartbeat every :data:`HEARTBEAT_S` seconds; a
rank that hears nothing for :data:`CONTROL_TIMEOUT_S` seconds stops with one line (exit 1). A
failed send on rank 0 (a rank died) prints one line naming it and stops the server (exit 1).
At shutdown (SIGINT/SIGTERM to rank 0, as ``tracestory capture --load`` sends) rank 0 finishes
serving, then broadcasts *stop*; the others leave their loop and every rank exits 0. The other
ranks ignore SIGINT/SIGTERM from the moment they follow to their exit (``torchrun`` and a
process-group Ctrl-C deliver them too, and such a signal may land after rank 0's *stop*); they
stop when rank 0 says so, or at the timeout. Each rank then leaves its process
groups (:meth:`Group.close`: destroyed on the CPU; on CUDA left to the process exit, because
closing the NCCL communicators did not return within 20 s on two H100s) and says in one line how
long its stop took. How the processes start and end (``tracestory serve --tensor-parallel N``
without torchrun, the hard exit of a CUDA rank) is :mod:`.tp_process`.

Devices: ``cuda:LOCAL_RANK`` with NCCL for the all-reduce when ``--device`` is cuda (or auto
with a GPU), else the CPU with gloo. On multi-GPU H200 hosts NVLink multicast (NVLS) must stay
off: set ``NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1``
(:data:`SAFE_NCCL_ENV`; ``tracestory capture --torchrun`` sets them when unset).

Limits: one node (``LOCAL_RANK`` picks the GPU); the control channel is CPU (gloo) even on
GPUs; the decode CUDA graphs of the engine capture the all-reduce (symmetric memory or NCCL)
only where it allows graph capture (checked on GPUs by the GPU tests, not here).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..capture.region import timed
from ..capture.under_load import TORCHRUN_SAFE_ENV
from ..errors import UsageError
from ..models.llama_config import LlamaConfig
from .allreduce import AllReduce
from .gcwatch import GcClock
from .scheduler import Member
from .stackwatch import StackWatch

HEARTBEAT_S = 1.0            # rank 0 sends a heartbeat when it sent nothing for this long
CONTROL_TIMEOUT_S = 300.0    # a rank that hears nothing for this long gives up
CLOSE_TIMEOUT_S = 20.0       # leaving the process groups at the end takes at most this long
STOP_LOCK_S = 5.0            # rank 0 waits this long for the plan channel to send *stop*
SAFE_NCCL_ENV = TORCHRUN_SAFE_ENV    # NVLink multicast off (set where unset)

# control commands (header[0])
CMD_PLAN, CMD_HEARTBEAT, CMD_STOP = 1, 2, 3
HEADER = 6                   # cmd, iteration + 1 (0: none), members, ids, table entries, spare


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int


def launch_hint(n: int) -> str:
    return (f"torchrun --nproc_per_node={n} -m tracestory.cli serve --tensor-parallel {n} ... "
            f"(or python -m torch.distributed.run --nproc_per_node={n} -m tracestory.cli serve ...)")


def rank_from_env(n: int, environ: Mapping[str, str] | None = None) -> RankInfo:
    """This process's rank under torchrun; one-line :class:`UsageError` when not launched by
    torchrun or when ``WORLD_SIZE`` is not ``n``."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env or "RANK" not in env:
        raise UsageError(f"--tensor-parallel {n}: expected to run under torchrun, found no WORLD_SIZE/RANK in "
                         f"the environment; launch it as {launch_hint(n)}")
    try:
        world, rank, local = int(env["WORLD_SIZE"]), int(env["RANK"]), int(env.get("LOCAL_RANK", env["RANK"]))
    except ValueError:
        raise UsageError(f"--tensor-parallel {n}: expected integer WORLD_SIZE/RANK/LOCAL_RANK, found "
                         f"{env.get('WORLD_SIZE')!r}/{env.get('RANK')!r}/{env.get('LOCAL_RANK')!r}") from None
    if world != n:
        raise UsageError(f"--tensor-parallel {n}: expected torchrun with {n} processes (WORLD_SIZE={n}), "
                         f"found WORLD_SIZE={world}; launch it as {launch_hint(n)}")
    return RankInfo(rank, world, local)


# ---------------------------------------------------------------------------- sharding
def check_divisible(cfg: LlamaConfig, n: int) -> None:
    """One-line :class:`UsageError` unless heads, KV heads and the MLP width divide by ``n``."""
    for what, value in (("query heads", cfg.n_heads), ("KV heads", cfg.n_kv_heads), ("MLP width", cfg.ffn_dim)):
        if value % n:
            raise UsageError(f"--tensor-parallel {n}: expected the {what} of {cfg.name} to divide by {n}, "
                             f"found {value}")


def local_config(cfg: LlamaConfig, n: int) -> LlamaConfig:
    """The config one rank of ``n`` computes: ``H/n`` heads, ``Hkv/n`` KV heads, ``I/n`` MLP
    rows, the full model's head dim."""
    check_divisible(cfg, n)
    return dataclasses.replace(cfg, n_heads=cfg.n_heads // n, n_kv_heads=cfg.n_kv_heads // n,
                               ffn_dim=cfg.ffn_dim // n, explicit_head_dim=cfg.head_dim)


def _keep(old, new):
    """``new`` as the same kind of holder as ``old`` (an ``nn.Parameter`` stays one)."""
    import torch

    new = new.contiguous().clone()
    if isinstance(old, torch.nn.Parameter):
        return torch.nn.Parameter(new, requires_grad=False)
    return new


def vocab_parallel_argmax(logits, *, rank: int, vocab_shard: int, gather: Callable,
                          row_max: Callable | None = None):
    """Greedy ids ``[rows]`` (int64) over the whole vocabulary from this rank's logits
    ``[rows, V/N]`` (vocabulary ids ``rank·V/N ..``): each rank's best value and its global id
    (as float32: exact below 2**24) are all-gathered (``gather(t [2, rows]) -> [N, 2, rows]``,
    one collective) and every rank picks the same: the largest value, the lowest rank among
    equal ones, so ties go to the lowest id as ``argmax`` over the whole head does.
    ``row_max(logits) -> (values fp32, ids)``: this rank's pick (default: ``argmax`` in float32)."""
    import torch

    if row_max is not None:
        val, idx = row_max(logits)
    else:
        lf = logits.float()
        idx = lf.argmax(-1)
        val = lf.gather(-1, idx[:, None])[:, 0]
    every = gather(torch.stack((val, (idx + rank * vocab_shard).to(torch.float32))))     # [N, 2, rows]
    best = every[:, 0].argmax(0)
    return every[:, 1].gather(0, best[None])[0].to(torch.int64)


def shard_model(model, rank: int, n: int, reduce: Callable | None = None, gather: Callable | None = None) -> None:
    """Turn a built :class:`~.model.PagedLlama` (full weights) into rank ``rank``'s shard, in
    place (see the module docstring). ``reduce`` (default: identity) becomes ``model.tp_reduce``;
    it must sum its argument over the ``n`` ranks. ``gather`` (``t -> [n, *t.shape]``, the
    ranks' ``t`` in rank order), when given and the vocabulary divides by ``n``, makes the LM
    head vocab-parallel (``model.tp_argmax``); else each rank keeps the whole head."""
    import functools

    import torch

    cfg = model.cfg
    loc = local_config(cfg, n)
    d, hq, hk, ff = cfg.head_dim, loc.n_heads * cfg.head_dim, loc.n_kv_heads * cfg.head_dim, loc.ffn_dim
    rows = {"wq": hq, "wk": hk, "wv": hk, "wg": ff, "wu": ff}       # column-parallel: output rows
    cols = {"wo": hq, "wd": ff}                                      # row-parallel: input columns
    for layer in model.stack.layers:
        for name, w in rows.items():
            old = getattr(layer, name)
            setattr(layer, name, _keep(old, old[rank * w:(rank + 1) * w]))
        for name, w in cols.items():
            old = getattr(layer, name)
            setattr(layer, name, _keep(old, old[:, rank * w:(rank + 1) * w]))
    shape = (model.k_cache[0].shape[0], loc.n_kv_heads, d)
    model.k_cache = [torch.zeros(shape, device=c.device, dtype=c.dtype) for c in model.k_cache]
    model.v_cache = [torch.zeros(shape, device=c.device, dtype=c.dtype) for c in model.v_cache]
    model.cfg = loc
    if reduce is not None:
        model.tp_reduce = reduce
    if gather is not None and model.vocab % n == 0 and model.vocab < 2 ** 24:
        v = model.vocab // n
        model.lm_head = _keep(model.lm_head, model.lm_head[rank * v:(rank + 1) * v])
        model.tp_argmax = functools.partial(vocab_parallel_argmax, rank=rank, vocab_shard=v, gather=gather)
    model.tp = {"rank": rank, "size": n}


def all_gather_fn(n: int) -> Callable:
    """``t -> [n, *t.shape]``: every rank's ``t`` in rank order, over the default group (one
    ``all_gather_into_tensor`` with NCCL, which a CUDA graph can capture; a list all-gather
    with gloo)."""
    import torch
    import torch.distributed as dist

    def gather(t):
        t = t.contiguous()
        out = torch.empty((n, *t.shape), dtype=t.dtype, device=t.device)
        if dist.get_backend() == "nccl":
            dist.all_gather_into_tensor(out, t)
        else:
            dist.all_gather(list(out.unbind(0)), t)
        return out

    return gather


# ---------------------------------------------------------------------------- plans on the wire
def encode_plan(members: Sequence, iteration: int | None, ids: Sequence[int]):
    """``(header [6] int64, payload int64)`` of one iteration: per member ``start, tokens,
    samples, len(block_table)``, then the input ids, then the block tables concatenated."""
    import numpy as np
    import torch

    m = len(members)
    meta = np.array([(mb.start, mb.tokens, 1 if mb.samples else 0, len(mb.block_table)) for mb in members],
                    dtype=np.int64).reshape(-1)
    ids_a = np.fromiter(ids, dtype=np.int64)
    tables = np.fromiter(itertools.chain.from_iterable(mb.block_table for mb in members), dtype=np.int64)
    payload = torch.from_numpy(np.concatenate([meta, ids_a, tables]))
    header = torch.tensor([CMD_PLAN, 0 if iteration is None else iteration + 1, m, len(ids_a), len(tables), 0],
                          dtype=torch.int64)
    return header, payload


def decode_plan(header, payload) -> tuple[int | None, tuple[Member, ...], list[int]]:
    """``(iteration, members, ids)`` from :func:`encode_plan`'s tensors; members are
    :class:`~.scheduler.Member` with request ids ``"0"``, ``"1"``, ... and their slice of ids."""
    h = [int(x) for x in header.tolist()]
    it = h[1] - 1 if h[1] else None
    m, n_ids = h[2], h[3]
    p = payload.tolist()
    meta, ids, tables = p[:4 * m], p[4 * m:4 * m + n_ids], p[4 * m + n_ids:]
    members, off, toff = [], 0, 0
    for i in range(m):
        start, n, samples, nt = meta[4 * i:4 * i + 4]
        members.append(Member(str(i), "decode" if n == 1 else "prefill", start, tuple(ids[off:off + n]),
                              tuple(tables[toff:toff + nt]), False, bool(samples)))
        off += n
        toff += nt
    return it, tuple(members), ids


class Control:
    """The plan channel: a gloo group over all ranks; rank 0 sends, the others receive."""

    def __init__(self, group, rank: int):
        self.group, self.rank = group, rank
        self.lock = threading.Lock()       # rank 0: one message (and its forward) at a time
        self.last_sent = time.monotonic()

    def _bcast(self, t) -> None:
        import torch.distributed as dist

        dist.broadcast(t, src=0, group=self.group)

    def send(self, cmd: int, members: Sequence = (), iteration: int | None = None, ids: Sequence[int] = ()) -> None:
        """Rank 0: one command (the caller holds :attr:`lock`)."""
        import torch

        if cmd == CMD_PLAN:
            header, payload = encode_plan(members, iteration, ids)
        else:
            header, payload = torch.tensor([cmd, 0, 0, 0, 0, 0], dtype=torch.int64), None
        self._bcast(header)
        if payload is not None and payload.numel():
            self._bcast(payload)
        self.last_sent = time.monotonic()

    def receive(self):
        """Other ranks: ``(cmd, iteration, members, ids)`` of the next command."""
        import torch

        header = torch.zeros(HEADER, dtype=torch.int64)
        self._bcast(header)
        cmd = int(header[0])
        if cmd != CMD_PLAN:
            return cmd, None, (), []
        size = 4 * int(header[2]) + int(header[3]) + int(header[4])
        payload = torch.empty(size, dtype=torch.int64)
        if size:
            self._bcast(payload)
        return (cmd, *decode_plan(header, payload))


class WorkerLost(RuntimeError):
    """Rank 0 could not send a plan: another rank died or stopped answering."""


class TensorParallelFront:
    """Rank 0's model: sends each iteration's plan to the other ranks, then runs it here.

    Stands in for the model the engine calls (``launch``/``step``/``memory``/``prepare``; any
    other attribute is the model's). A heartbeat thread keeps idle ranks listening."""

    def __init__(self, model, control: Control, on_lost: Callable[[str], None]):
        self.model, self.control, self._on_lost = model, control, on_lost
        self.lost: str | None = None
        self.stopping = False            # set by stop(): a failure now ends nothing more
        self._done = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="tracestory-tp-heartbeat", daemon=True)
        self._beat.start()

    def __getattr__(self, name):
        return getattr(self.model, name)

    def _send(self, *args) -> None:
        if self.lost is not None:
            raise WorkerLost(self.lost)
        try:
            self.control.send(*args)
        except Exception as e:  # noqa: BLE001 -- gloo raises RuntimeError subclasses for a lost peer
            self.lost = f"tensor-parallel rank lost: rank 0 could not send to the other ranks ({_short(e)})"
            self._on_lost(self.lost)
            raise WorkerLost(self.lost) from None

    def launch(self, members, iteration=None, token_ids=None):
        ids = list(token_ids) if token_ids is not None else [t for m in members for t in m.token_ids]
        with self.control.lock:
            with timed("plan_send_ns"):           # the iteration's event-log line (engine)
                self._send(CMD_PLAN, members, iteration, ids)
            return self._run(self.model.launch, members, iteration, ids)

    def step(self, members, iteration=None):
        if hasattr(self.model, "launch"):
            return self.launch(members, iteration).result()
        with self.control.lock:
            self._send(CMD_PLAN, members, iteration, [t for m in members for t in m.token_ids])
            return self._run(self.model.step, members, iteration)

    def _run(self, fn, *args):
        """The forward here; an error of the all-reduce (a rank died mid-iteration) is a lost rank."""
        try:
            return fn(*args)
        except Exception as e:
            if self.lost is None and _is_distributed(e):
                self.lost = f"tensor-parallel rank lost: an all-reduce failed on rank 0 ({_short(e)})"
                self._on_lost(self.lost)
                raise WorkerLost(self.lost) from None
            raise

    def _heartbeat(self) -> None:
        while not self._done.wait(HEARTBEAT_S / 4):
            if time.monotonic() - self.control.last_sent < HEARTBEAT_S or self.lost is not None:
                continue
            with self.control.lock:
                if self._done.is_set():
                    return
                try:
                    self._send(CMD_HEARTBEAT)
                except WorkerLost:
                    return

    def stop(self, lock_timeout_s: float = STOP_LOCK_S) -> None:
        """Stop the heartbeat and tell the other ranks to exit (when they can still hear). When
        the channel stays held for ``lock_timeout_s`` (the engine thread's forward still waits in
        a collective: a stopped or hung rank, see :mod:`.progress`), *stop* is not sent: the
        rank is marked lost with one line, so rank 0 exits 1 and torchrun ends the others,
        instead of waiting for ever behind that forward."""
        self.stopping = True
        self._done.set()
        self._beat.join(HEARTBEAT_S)          # it wakes every HEARTBEAT_S / 4; held only behind a stalled forward
        if self.lost is not None:
            return
        if not self.control.lock.acquire(timeout=lock_timeout_s):
            self.lost = (f"tensor-parallel rank stalled: rank 0's forward still waits in a collective after "
                         f"{lock_timeout_s:g} s; stop not sent to the other ranks, exiting with code 1")
            self._on_lost(self.lost)
            return
        try:
            self._send(CMD_STOP)
        except WorkerLost:
            pass
        finally:
            self.control.lock.release()


class _SlowLaunches:
    """A follower's launches over :attr:`LIMIT_NS` (its host time from a plan received to its
    forward queued): rank 0 waits for a late follower in its next plan send and in the
    all-reduces, so these are the followers' share of rank 0's stalls."""

    LIMIT_NS = 5_000_000

    def __init__(self):
        self.count, self.longest, self.longest_it = 0, 0, None

    def add(self, iteration, ns: int) -> None:
        if ns > self.LIMIT_NS:
            self.count += 1
            if ns > self.longest:
                self.longest, self.longest_it = ns, iteration

    def summary(self) -> str:
        if not self.count:
            return f"no launch over {self.LIMIT_NS / 1e6:g} ms"
        return (f"{self.count} launches over {self.LIMIT_NS / 1e6:g} ms (longest {self.longest / 1e6:.1f} ms, "
                f"iteration {self.longest_it})")


def follow(model, control: Control) -> int:
    """The loop of ranks > 0: run every plan rank 0 sends until *stop*; returns the number of
    iterations run. SIGINT/SIGTERM are noted, not obeyed (see the module docstring). At the end one
    stderr line says this rank's Python GC collections while following (:meth:`.gcwatch.GcClock.summary`)
    and its launches over 5 ms (:class:`_SlowLaunches`)."""
    import torch

    heard: list[int] = []
    slow = _SlowLaunches()
    stacks = StackWatch.from_env(f"rank{control.rank}")   # TRACESTORY_STALL_STACKS_MS: off by default
    saved = {s: signal.signal(s, lambda signum, _f: heard.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    ran = 0
    gc_clock = GcClock(time.monotonic_ns)     # this rank writes no event log: its GC pauses said at the end
    gc_clock.install()
    try:
        while True:
            cmd, it, members, ids = control.receive()
            if cmd == CMD_STOP:
                return ran
            if cmd != CMD_PLAN:
                continue
            with torch.inference_mode():
                try:
                    t = time.perf_counter_ns()
                    stacks.arm()
                    try:
                        if hasattr(model, "launch"):
                            model.launch(members, it, ids)
                        else:
                            model.step(members, it)
                    finally:
                        stacks.done(f"launch of iteration {it}")
                    slow.add(it, time.perf_counter_ns() - t)
                except Exception as e:  # noqa: BLE001 -- rank 0 fails the same batch; a lost peer is fatal
                    if _is_distributed(e):
                        raise
                    _say(f"rank {control.rank}: iteration {it} failed as on rank 0 ({_short(e)})")
            ran += 1
    finally:
        gc_clock.remove()
        stacks.close()
        _say(f"rank {control.rank}: {gc_clock.summary()} while following ({ran} iterations); {slow.summary()}"
             + (f"; {stacks.dumps} stalled launches' stacks in {stacks.path}" if stacks.dumps else ""))
        for s, h in saved.items():
            signal.signal(s, h)


# ---------------------------------------------------------------------------- running
class Group:
    """This rank's tensor-parallel setup: process groups, device, sharding, and the end."""

    def __init__(self, opts, info: RankInfo):
        self.opts, self.info = opts, info
        self.control: Control | None = None
        self.front: TensorParallelFront | None = None

    @property
    def options(self):
        """The options this rank builds with: its own GPU; the event log on rank 0 only."""
        o = self.opts
        dev = self.device
        return dataclasses.replace(o, device=dev, event_log=o.event_log if self.info.rank == 0 else None)

    @property
    def device(self) -> str:
        import torch

        want = self.opts.device
        if want.startswith("cuda") or (want == "auto" and torch.cuda.is_available()):
            return f"cuda:{self.info.local_rank}"
        return "cpu"

    def init(self) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        for k, v in SAFE_NCCL_ENV.items():
            os.environ.setdefault(k, v)
        dev = self.device
        timeout = datetime.timedelta(seconds=CONTROL_TIMEOUT_S)
        if dev.startswith("cuda"):
            torch.cuda.set_device(torch.device(dev))
            dist.init_process_group("nccl", timeout=timeout, device_id=torch.device(dev))
        else:
            dist.init_process_group("gloo", timeout=timeout)
        self.control = Control(dist.new_group(backend="gloo", timeout=timeout), self.info.rank)

    def shard(self, model) -> None:
        """The build hook: shard before anything shape-dependent is built."""
        # dist.all_reduce until the model's prepare() sets up symmetric memory (.allreduce)
        shard_model(model, self.info.rank, self.info.world_size, AllReduce(), all_gather_fn(self.info.world_size))

    def make_front(self, model) -> TensorParallelFront:
        def lost(line: str) -> None:
            if self.front is not None and self.front.stopping:
                _say(line)
                return
            _say(line + "; stopping the server")
            os.kill(os.getpid(), signal.SIGTERM)     # serve_app's handler: a graceful stop

        self.front = TensorParallelFront(model, self.control, lost)
        return self.front

    def close(self) -> float | None:
        """Leave the process groups once every collective has completed (rank 0 sent *stop*
        after its last iteration resolved, so every rank's all-reduces are done). On CUDA the
        groups are left to the process's exit (see the comment below; returns None). On the CPU
        they are destroyed in a helper thread for at most :data:`CLOSE_TIMEOUT_S`; returns the
        seconds it took, or None when it did not finish (one line says so)."""
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            return 0.0
        t0 = time.monotonic()
        on_cuda = self.device.startswith("cuda")
        if on_cuda:
            # Neither abort nor destroy of the NCCL communicators returned within 20 s on two
            # H100s (torch 2.11) after the decode and mixed CUDA graphs had captured all-reduces;
            # every collective is complete here, so the rank leaves them to its exit (os._exit:
            # capture runner, finish_process), and only the CPU (gloo) groups are closed.
            torch.cuda.synchronize()
            return None
        err: list[BaseException] = []

        def close() -> None:
            try:
                dist.destroy_process_group()
            except Exception as e:  # noqa: BLE001 -- reported below; the rank still exits
                err.append(e)

        t = threading.Thread(target=close, name="tracestory-tp-close", daemon=True)
        t.start()
        t.join(CLOSE_TIMEOUT_S)
        if t.is_alive():
            _say(f"rank {self.info.rank}: the process groups did not close within {CLOSE_TIMEOUT_S:g} s; "
                 "exiting without waiting for them")
            return None
        if err:
            _say(f"rank {self.info.rank}: closing the process groups failed ({_short(err[0])})")
        return time.monotonic() - t0


def run(opts, build_server: Callable, serve: Callable) -> None:
    """``tracestory serve --tensor-parallel N`` on this rank: build the shard; rank 0 serves
    (``serve(engine, api)``), the others follow; raises ``SystemExit(1)`` after one line when a
    rank was lost. The stop is timed, one line per rank on stderr (``rank r: stopped: ...``:
    serving or following ended, process groups closed), so a slow stop says where it waited."""
    info = rank_from_env(opts.tensor_parallel)
    if opts.preset != "auto":            # before any process group: every rank says it at once
        check_divisible(LlamaConfig.from_name(opts.preset), info.world_size)
    g = Group(opts, info)
    g.init()
    failed: str | None = None
    t_end: float | None = None
    try:
        engine, api = build_server(g.options, prepare_hook=g.shard)
        if info.rank != 0:
            # SIGINT/SIGTERM ignored from here to the exit, not only inside follow(): the launcher
            # signals every rank, and rank 0 may stop and broadcast *stop* before this rank's
            # signal lands; back under Python's handler it became KeyboardInterrupt (exit 130)
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
            try:
                follow(engine.model, g.control)
            except Exception as e:  # noqa: BLE001 -- the other side is gone or silent
                failed = f"rank {info.rank}: lost rank 0 ({_short(e)})"
                _say(failed)
            t_end = time.monotonic()
        else:
            engine.model = g.make_front(engine.model)
            try:
                serve(engine, api)
            finally:
                t_end = time.monotonic()
                g.front.stop()
                failed = g.front.lost
    finally:
        if failed is None:
            t_sent = time.monotonic()
            closed = g.close()
            if t_end is not None:
                what = "stop sent to the other ranks" if info.rank == 0 else "stop received"
                took = (("left to the process exit (NCCL)" if g.device.startswith("cuda") else "did not close")
                        if closed is None else f"closed in {closed:.2f} s")
                _say(f"rank {info.rank}: stopped: {what} in {t_sent - t_end:.2f} s, process groups {took}")
    if failed is not None:                # said once, where it was found
        raise SystemExit(1)


def _is_distributed(e: BaseException) -> bool:
    import torch.distributed as dist

    kinds = tuple(k for k in (getattr(dist, "DistError", None),) if k is not None)
    return isinstance(e, kinds) or "gloo" in str(e).lower() or "nccl" in str(e).lower()


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _say(line: str) -> None:
    print(f"tracestory serve: {line}", file=sys.stderr, flush=True)
