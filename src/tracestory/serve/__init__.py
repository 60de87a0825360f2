"""``tracestory serve``: a small OpenAI-compatible server with a real continuous-batching scheduler
over the built-in Llama testbench model (random weights; tokens are ids).

Pieces (each usable alone):

* :mod:`.kv_cache`  -- paged KV-cache bookkeeping: fixed-size blocks, a free list, a block table
  per request (pure Python, no tensors);
* :mod:`.scheduler` -- the continuous-batching scheduler (pure logic, no torch): decode first,
  then chunked prefill under a token budget, FCFS admission when blocks are free, recompute
  preemption, every decision with its reason;
* :mod:`.model`     -- the Llama layers of :mod:`tracestory.models.llama` run over the paged cache;
* :mod:`.paged_attention` -- FlexAttention over the paged cache (block tables in the mask);
* :mod:`.graphs`    -- decode-only iterations replayed from CUDA graphs per batch-size bucket;
* :mod:`.mixed`     -- prefill and mixed iterations replayed from CUDA graphs per (decode rows,
  chunk rows) bucket, up to the token budget (``--max-num-batched-tokens``, 2048 on CUDA);
* :mod:`.tensor_parallel`, :mod:`.tp_process` -- ``--tensor-parallel N``: the shards and the plan
  channel; the ranks' processes (started by torchrun or by ``serve`` itself, their end);
* :mod:`.eventlog`  -- the scheduler event log (JSONL, ``docs``: the serve event-log format);
* :mod:`.metrics`   -- the Prometheus metrics of ``GET /metrics``;
* :mod:`.engine`    -- the engine thread: scheduler + model + event log + metrics;
* :mod:`.progress`  -- the stall watch of the engine thread behind ``/health``;
* :mod:`.gcwatch`   -- Python GC time per iteration (the event log's ``gc_ns``) and the heap frozen
  after start-up;
* :mod:`.stackwatch` -- a diagnostic switch: the Python stacks of a host step that stalls;
* :mod:`.footprint` -- the start-up check that weights + KV cache fit in the memory at hand;
* :mod:`.server`    -- the aiohttp HTTP front end;
* :mod:`.request_body` -- strict parsing of a request body (400 for every client mistake);
* :mod:`.admission` -- load shedding: admitted requests (429), body bytes (413/503), refusal counts;
* :mod:`.guard`     -- the connection limit and the slow-header/idle defence;
* :mod:`.tokens`    -- the token rule.

The token rule (one token per word; shared with the load generator, ``tracestory load``) is in
:mod:`.tokens`; its functions are re-exported here.

Starting a server from another process
--------------------------------------
``tracestory serve --preset tiny --device cpu --port 0 --event-log sched.jsonl`` prints one
line ``tracestory serve: listening on http://HOST:PORT`` on stdout (flushed) once the model is
built and the engine thread runs; ``GET /health`` answers 200 from then on.
:func:`wait_healthy` polls it. SIGINT or SIGTERM stops the server gracefully (in-flight
requests finish as ``cancelled``, the event log is closed) with exit code 0.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import telemetry
from ..errors import UsageError
from ..models.llama_config import LlamaConfig
from ..models.runtime import dtype_name, resolve_device, torch_dtype
from .engine import Engine
from .eventlog import EventLog
from .metrics import make_metrics
from .model import ATTENTION_BACKENDS, DEFAULT_VOCAB, PagedLlama, kv_bytes_per_block, weight_bytes
from . import footprint, gcwatch, tensor_parallel
from .scheduler import Scheduler, SchedulerConfig
from .server import Api, ServerLimits, serve_app, start_in_thread
from .tokens import PROMPT_ID_RANGE, count_tokens, prompt_of_tokens, token_text, tokenize

__all__ = ["PROMPT_ID_RANGE", "ServeOptions", "ServerLimits", "build_server", "check_footprint_on_cpu", "count_tokens", "prompt_of_tokens", "run_server",
           "start_server_thread", "token_text", "tokenize", "wait_healthy"]


def wait_healthy(base_url: str, timeout_s: float = 60.0, *, interval_s: float = 0.1, proc=None) -> float:
    """Poll ``GET {base_url}/health`` until it answers 200; return the seconds waited.

    ``proc`` (a ``subprocess.Popen``) makes the wait stop early when the server process exits.
    Raises :class:`~tracestory.errors.UsageError` on timeout or early exit.
    """
    import urllib.error
    import urllib.request

    t0 = time.monotonic()
    url = base_url.rstrip("/") + "/health"
    last = "no answer"
    while True:
        if proc is not None and proc.poll() is not None:
            raise UsageError(f"{url}: expected a healthy server, found the server process exited "
                             f"with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=max(interval_s, 1.0)) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
        if time.monotonic() - t0 > timeout_s:
            raise UsageError(f"{url}: expected HTTP 200 within {timeout_s:g} s, found {last}")
        time.sleep(interval_s)


# ---------------------------------------------------------------------------- building a server
@dataclass(frozen=True)
class ServeOptions:
    """Everything ``tracestory serve`` takes (the CLI flags of the same names)."""

    preset: str = "auto"                  # auto: tiny on the CPU, llama-3-8b on CUDA
    layers: int | None = None             # None: 2 for tiny, all 32 of llama-3-8b on CUDA
    device: str = "cpu"                   # cpu | cuda | cuda:N | auto
    attention_backend: str = "auto"       # auto (flex on CUDA, sdpa on the CPU) | sdpa | flex
    enforce_eager: bool = False           # no decode CUDA graphs
    overlap: bool = True                  # schedule iteration N+1 while N runs (engine)
    max_model_len: int | None = None      # longest context the decode graphs serve (None: 8192)
    dtype: str = "auto"                   # auto (fp32 on CPU, bf16 on CUDA) | fp32 | bf16 | fp16
    host: str = "127.0.0.1"
    port: int = 8000                      # 0: any free port (the ready line says which)
    block_size: int = 16
    num_blocks: int | None = None         # None: 512 on CPU; on CUDA what gpu_memory_fraction allows
    max_batch_tokens: int | None = None   # token budget per iteration; None: 2048 on CUDA, 256 on the CPU
    max_num_seqs: int = 32
    event_log: str | None = None
    vocab: int | None = None              # None: 512 for tiny, 32000 llama-2-7b, 128256 llama-3-8b
    eos_id: int | None = None
    seed: int = 0
    fail_rate: float = 0.0
    served_model_names: tuple[str, ...] = ()   # the names requests may ask for; () -> (preset,)
    gpu_memory_fraction: float = 0.5      # of the free device memory, for weights + KV cache
    fair_wait_iterations: int | None = 64  # a blocked waiting head preempts long runners after this; None: FCFS
    limits: ServerLimits = ServerLimits()  # load shedding, timeouts, connection and body caps
    power_monitor: bool = True            # GPU telemetry while serving (--skip-power-monitor: False)
    telemetry_path: str | None = None     # None: telemetry.jsonl beside the event log
    tensor_parallel: int = 1              # ranks of torchrun sharing the model (.tensor_parallel)
    fp8: str = "off"                      # off | rowwise | tensorwise: FP8 projections (models.fp8)
    profiler_dir: str | None = None       # POST /start_profile, /stop_profile write traces here (.profiling)


GPU_PRESET = "llama-3-8b"     # the default shape on CUDA (all its layers); tiny on the CPU
# Token budget per iteration (--max-num-batched-tokens). On CUDA 2048, the low end of the range
# vLLM uses (2048-8192): prefill chunks that large keep the GEMMs compute-bound while a mixed
# iteration's decode members wait at most one chunk; prefill and mixed iterations replay CUDA
# graphs per chunk bucket up to it (serve.mixed). 256 on the CPU (the tiny model, tests).
GPU_TOKEN_BUDGET = 2048
CPU_TOKEN_BUDGET = 256
GPU_PRESET_LAYERS = 32


def resolve_shape(opts: ServeOptions, device: str) -> tuple[str, int, str]:
    """``(preset, layers, attention backend)`` after the ``auto`` defaults: a real model shape
    with FlexAttention on CUDA, the tiny one with SDPA on the CPU."""
    cuda = device.startswith("cuda")
    preset = opts.preset if opts.preset != "auto" else (GPU_PRESET if cuda else "tiny")
    layers = opts.layers if opts.layers is not None else (GPU_PRESET_LAYERS if preset == GPU_PRESET and cuda else 2)
    attention = opts.attention_backend if opts.attention_backend != "auto" else ("flex" if cuda else "sdpa")
    if attention not in ATTENTION_BACKENDS:
        raise UsageError(f"--attention-backend: expected one of auto, {', '.join(ATTENTION_BACKENDS)}, "
                         f"found {attention!r}")
    return preset, layers, attention


def _auto_blocks(opts: ServeOptions, cfg, layers: int, vocab: int, device: str, dtype_bytes: int) -> int:
    """CPU: 512 blocks. CUDA: (fraction x free memory - weights) / bytes per block."""
    if not device.startswith("cuda"):
        return 512
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    left = free * opts.gpu_memory_fraction - weight_bytes(cfg, layers, vocab, dtype_bytes)
    n = int(left // kv_bytes_per_block(cfg, layers, opts.block_size, dtype_bytes))
    if n < 1:
        raise UsageError(f"{device}: expected room for the weights and a KV cache in {opts.gpu_memory_fraction:g} "
                         f"of {free / 2**30:.1f} GiB free, found none (use fewer --layers or --num-blocks)")
    return n


def check_footprint(opts: ServeOptions, device: str, cfg, layers: int, vocab: int, dtype_label: str,
                    dtype_bytes: int, num_blocks: int) -> None:
    """One-line :class:`UsageError` (exit 2) before anything is allocated when the weights and
    KV cache of this build do not fit in the memory at hand (:mod:`.footprint`)."""
    cpu = not device.startswith("cuda")
    fp = footprint.estimate(cfg, layers, vocab, dtype_bytes, num_blocks, opts.block_size,
                            opts.tensor_parallel if cpu else 1)
    asked = (f"serve --preset {cfg.name} --layers {layers} --vocab {vocab} --dtype {dtype_label} "
             f"--num-blocks {num_blocks} --block-size {opts.block_size}"
             + (f" --tensor-parallel {opts.tensor_parallel}" if opts.tensor_parallel > 1 else ""))
    footprint.check_fits(asked, fp, *footprint.device_available(device))


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def check_footprint_on_cpu(opts: ServeOptions) -> None:
    """:func:`check_footprint` for a CPU server without torch (the launcher of ``serve
    --tensor-parallel N`` checks before it starts N ranks): the CPU defaults of :func:`build_server`."""
    if opts.device != "cpu":
        return
    preset, layers, _ = resolve_shape(opts, "cpu")
    cfg = LlamaConfig.from_name(preset)
    label = "fp32" if opts.dtype == "auto" else dtype_name(opts.dtype)
    vocab = opts.vocab if opts.vocab is not None else DEFAULT_VOCAB.get(cfg.name, 32000)
    check_footprint(opts, "cpu", cfg, layers, vocab, label, DTYPE_BYTES[label], opts.num_blocks or 512)


SWITCH_INTERVAL_S = 0.001       # sys.setswitchinterval in the serving process (CPython's default: 0.005)


def _say(line: str) -> None:
    print(f"tracestory serve: {line}", file=sys.stderr, flush=True)


def build_server(opts: ServeOptions, prepare_hook: Callable | None = None):
    """Build the model, scheduler, event log and handlers: returns ``(engine, api)`` (not started).

    The heavy part (torch, the model's weights and KV cache, then :meth:`PagedLlama.prepare`:
    FlexAttention compiled per shape bucket and the decode CUDA graphs captured) happens here;
    the compile and capture times go to stderr (one line each) and to the event log's
    ``meta.startup``. ``prepare_hook(model)`` runs between building and preparing the model
    (e.g. to shard its weights and caches: nothing shape-dependent exists yet). Once prepared,
    the process's heap is frozen (:func:`.gcwatch.freeze_heap`: later full collections skip it;
    ``meta.startup.gc_frozen_objects``); every tensor-parallel rank builds through here."""
    import torch

    device = resolve_device(opts.device)
    preset, layers, attention = resolve_shape(opts, device)
    if attention == "flex" and device.startswith("cuda") and opts.block_size % 16:
        raise UsageError(f"--block-size: expected a multiple of 16 with --attention-backend flex on CUDA (the "
                         f"compiled kernel's KV tile), found {opts.block_size}")
    cfg = LlamaConfig.from_name(preset)
    if opts.dtype == "auto":
        dtype_label = "bf16" if device.startswith("cuda") else "fp32"
    else:
        try:
            dtype_label = dtype_name(opts.dtype)
        except ValueError as e:
            raise UsageError(f"--dtype: {e}") from None
    dtype = torch_dtype(dtype_label)
    vocab = opts.vocab if opts.vocab is not None else DEFAULT_VOCAB.get(cfg.name, 32000)
    if vocab < 1:
        raise UsageError(f"--vocab: expected an integer >= 1, found {vocab}")
    dbytes = torch.tensor([], dtype=dtype).element_size()
    num_blocks = opts.num_blocks or _auto_blocks(opts, cfg, layers, vocab, device, dbytes)
    check_footprint(opts, device, cfg, layers, vocab, dtype_label, dbytes, num_blocks)
    budget = opts.max_batch_tokens if opts.max_batch_tokens is not None else (
        GPU_TOKEN_BUDGET if device.startswith("cuda") else CPU_TOKEN_BUDGET)
    if budget < 1:
        raise UsageError(f"--max-num-batched-tokens: expected an integer >= 1, found {budget}")
    sc = SchedulerConfig(opts.block_size, num_blocks, budget, opts.max_num_seqs, opts.eos_id,
                         opts.fair_wait_iterations)
    model = PagedLlama(cfg, layers=layers, num_blocks=num_blocks, block_size=opts.block_size, vocab=vocab,
                       device=device, dtype=dtype, seed=opts.seed, attention=attention)
    if prepare_hook is not None:          # e.g. shard the model before anything shape-dependent is built
        prepare_hook(model)
    # after sharding (each rank quantises its own slice), before graphs capture the weights
    from ..models.fp8 import quantize_stack   # torch at its top, like the model

    quantize_stack(model.stack.layers, opts.fp8)
    startup = model.prepare(max_num_seqs=sc.max_num_seqs, max_batch_tokens=sc.max_batch_tokens,
                            cuda_graphs=not opts.enforce_eager, max_model_len=opts.max_model_len, log=_say)
    if "compile_s" in startup:
        _say(f"startup: flex attention compiled in {startup['compile_s']:.1f} s, decode CUDA graphs "
             + (f"captured for batch sizes {startup['decode_buckets']} in {startup['graph_capture_s']:.1f} s, "
                f"{startup.get('mixed_graphs', 0)} prefill/mixed graphs (chunk rows {startup['chunk_rows']})"
                if startup["cuda_graphs"] else "off (--enforce-eager; prefill and mixed iterations eager too)"))
    # start-up is done (built, sharded, compiled, graphs captured): its objects leave the
    # collector's walks (every rank does this: followers build through here too)
    startup.update(gcwatch.freeze_heap())
    startup["switch_interval_ms"] = round(sys.getswitchinterval() * 1e3, 3)
    meta = {"model": f"llama {cfg.name}", "device": device, "block_size": sc.block_size, "num_blocks": num_blocks,
            "max_batch_tokens": sc.max_batch_tokens, "max_num_seqs": sc.max_num_seqs, "preset": cfg.name,
            "layers": layers, "vocab": vocab, "dtype": dtype_label,
            "capacity_tokens": num_blocks * sc.block_size, "attention_backend": attention,
            "overlap": opts.overlap, "fp8": opts.fp8, "startup": startup}
    if opts.eos_id is not None:
        meta["eos_token_id"] = opts.eos_id
    if opts.tensor_parallel > 1:
        meta["tensor_parallel"] = opts.tensor_parallel
    names = tuple(opts.served_model_names) or (cfg.name,)
    engine = Engine(Scheduler(sc), model, EventLog(opts.event_log, meta), make_metrics(names[0]),
                    overlap=opts.overlap)
    api = Api(engine, names, vocab, opts.fail_rate, opts.limits, profiler_dir=opts.profiler_dir)
    return engine, api


def run_server(opts: ServeOptions, ready: Callable[[str], None] | None = None) -> None:
    """Build and serve until SIGINT/SIGTERM (main thread only); ``ready(url)`` once listening."""
    import asyncio

    def serve(engine, api) -> None:
        async def main() -> None:
            await serve_app(engine, api, opts.host, opts.port, stop=asyncio.Event(), ready=ready)

        with _telemetry(opts):       # the serving process only (rank 0 under tensor parallelism)
            asyncio.run(main())

    # the engine thread gets the GIL back from a busy HTTP thread within 1 ms instead of CPython's
    # 5 ms (benchmarks/gil_handoff.py, docs/PERFORMANCE.md "GIL hand-off and GC pauses"); this
    # process only: the server thread of tests and notebooks keeps the default
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    if opts.tensor_parallel > 1:          # under torchrun: rank 0 serves, the other ranks follow its plans
        return tensor_parallel.run(opts, build_server, serve)
    serve(*build_server(opts))


def _telemetry(opts: ServeOptions):
    """The server process's GPU telemetry sampler (:func:`tracestory.telemetry.maybe_sampler`),
    writing ``opts.telemetry_path`` or ``telemetry.jsonl`` beside the event log; with neither
    there is nowhere to write, which one line says."""
    path = opts.telemetry_path or (telemetry.beside(opts.event_log) if opts.event_log else None)
    if opts.device == "cpu":          # no GPU to sample, nothing to say
        return telemetry.maybe_sampler(None, enabled=False, label="serve")
    if opts.power_monitor and path is None and not telemetry.skipped_by_env():
        print(f"GPU telemetry off: no --event-log or ${telemetry.PATH_ENV} to write {telemetry.FILE_NAME} to",
              file=sys.stderr, flush=True)
    return telemetry.maybe_sampler(path, enabled=opts.power_monitor and path is not None, label="serve")


def start_server_thread(opts: ServeOptions):
    """Build and serve on a background thread (tests, notebooks): returns a
    :class:`~.server.ServerHandle` with ``url`` and ``stop()``."""
    if opts.tensor_parallel > 1:
        raise UsageError(f"tensor_parallel={opts.tensor_parallel}: expected 1 in a server thread (tensor "
                         f"parallelism runs under torchrun: {tensor_parallel.launch_hint(opts.tensor_parallel)})")
    engine, api = build_server(opts)
    return start_in_thread(engine, api, opts.host, opts.port)
