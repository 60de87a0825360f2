"""``tracestory serve``: a small OpenAI-compatible server with a real continuous-batching scheduler
over the built-in Llama testbench model (random weights; tokens are ids).

Pieces (each usable alone):

* :mod:`.kv_cache`  -- paged KV-cache bookkeeping: fixed-size blocks, a free list, a block table
  per request (pure Python, no tensors);
* :mod:`.scheduler` -- the continuous-batching scheduler (pure logic, no torch): decode first,
  then chunked prefill under a token budget, FCFS admission when blocks are free, recompute
  preemption, every decision with its reason;
* :mod:`.model`     -- the Llama layers of :mod:`tracestory.bench.llama` run over the paged cache;
* :mod:`.eventlog`  -- the scheduler event log (JSONL, ``docs``: the serve event-log format);
* :mod:`.server`    -- the aiohttp HTTP front end and the engine thread.

The token rule (shared with the load generator, ``tracestory load``)
--------------------------------------------------------------------
There is no real tokenizer. A string prompt is split on whitespace; **every word is one
token**. A word ``t<k>`` (``k`` decimal digits) is token id ``k mod vocab``; any other word is
``crc32(word as UTF-8) mod vocab``. A chat request's prompt is the words of every message's
``content`` in order, with no template tokens. A prompt may also be a list of token ids
(``0 <= id < vocab``). Generated token ``i`` is returned as the text ``" t<i>"`` (a leading
space, one streamed chunk per token), so a completion's text splits back into its ids and its
word count equals ``usage.completion_tokens``.

:func:`prompt_of_tokens` builds a prompt of exactly ``n`` tokens by that rule; the load
generator uses it so that ``prompt_tokens`` in the server's usage equals the length it asked for.

Starting a server from another process
--------------------------------------
``tracestory serve --preset tiny --device cpu --port 0 --event-log sched.jsonl`` prints one
line ``tracestory serve: listening on http://HOST:PORT`` on stdout (flushed) once the model is
built and the engine thread runs; ``GET /health`` answers 200 from then on.
:func:`wait_healthy` polls it. SIGINT or SIGTERM stops the server gracefully (in-flight
requests finish as ``cancelled``, the event log is closed) with exit code 0.
"""

from __future__ import annotations

import random
import re
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ServeOptions", "build_server", "count_tokens", "prompt_of_tokens", "run_server", "start_server_thread",
           "token_text", "tokenize", "wait_healthy"]

_TOKEN_WORD = re.compile(r"t(\d+)\Z")

# prompt_of_tokens draws ids below this bound, so its prompts mean the same ids for any vocab
# of at least this size (the tiny preset's vocab is 512).
PROMPT_ID_RANGE = 512


def tokenize(text: str, vocab: int) -> list[int]:
    """Token ids of ``text`` by the word rule above (one id per whitespace-separated word)."""
    ids = []
    for word in text.split():
        m = _TOKEN_WORD.match(word)
        if m is not None:
            ids.append(int(m.group(1)) % vocab)
        else:
            ids.append(zlib.crc32(word.encode("utf-8")) % vocab)
    return ids


def count_tokens(text: str) -> int:
    """Number of tokens of ``text`` by the word rule (its whitespace-separated word count)."""
    return len(text.split())


def token_text(token_id: int) -> str:
    """The text the server returns for one generated token: ``" t<id>"``."""
    return f" t{int(token_id)}"


def prompt_of_tokens(n: int, seed: int = 0) -> str:
    """A prompt of exactly ``n`` tokens (``n`` words ``t<k>``, ``k`` drawn from ``seed``)."""
    if n < 0:
        raise ValueError(f"prompt_of_tokens: n must be >= 0, got {n}")
    rng = random.Random(seed)
    return " ".join(f"t{rng.randrange(PROMPT_ID_RANGE)}" for _ in range(n))


def wait_healthy(base_url: str, timeout_s: float = 60.0, *, interval_s: float = 0.1, proc=None) -> float:
    """Poll ``GET {base_url}/health`` until it answers 200; return the seconds waited.

    ``proc`` (a ``subprocess.Popen``) makes the wait stop early when the server process exits.
    Raises :class:`~tracestory.errors.UsageError` on timeout or early exit.
    """
    import urllib.error
    import urllib.request

    from ..errors import UsageError

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

    preset: str = "tiny"
    layers: int = 2
    device: str = "cpu"                   # cpu | cuda | cuda:N | auto
    dtype: str = "auto"                   # auto (fp32 on CPU, bf16 on CUDA) | fp32 | bf16 | fp16
    host: str = "127.0.0.1"
    port: int = 8000                      # 0: any free port (the ready line says which)
    block_size: int = 16
    num_blocks: int | None = None         # None: 512 on CPU; on CUDA what gpu_memory_fraction allows
    max_batch_tokens: int = 256
    max_num_seqs: int = 32
    event_log: str | None = None
    vocab: int | None = None              # None: 512 for tiny, 32000 llama-2-7b, 128256 llama-3-8b
    eos_id: int | None = None
    seed: int = 0
    fail_rate: float = 0.0
    model_name: str | None = None         # None: "tracestory-<preset>"
    gpu_memory_fraction: float = 0.5      # of the free device memory, for weights + KV cache


def _auto_blocks(opts: ServeOptions, cfg, vocab: int, device: str, dtype_bytes: int) -> int:
    """CPU: 512 blocks. CUDA: (fraction x free memory - weights) / bytes per block."""
    if not device.startswith("cuda"):
        return 512
    import torch

    from ..errors import UsageError
    from .model import kv_bytes_per_block, weight_bytes

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    left = free * opts.gpu_memory_fraction - weight_bytes(cfg, opts.layers, vocab, dtype_bytes)
    n = int(left // kv_bytes_per_block(cfg, opts.layers, opts.block_size, dtype_bytes))
    if n < 1:
        raise UsageError(f"{device}: expected room for the weights and a KV cache in {opts.gpu_memory_fraction:g} "
                         f"of {free / 2**30:.1f} GiB free, found none (use fewer --layers or --num-blocks)")
    return n


def build_server(opts: ServeOptions):
    """Build the model, scheduler, event log and handlers: returns ``(engine, api)`` (not started).

    The heavy part (torch, the model's weights and KV cache) happens here."""
    import torch

    from ..bench.common import resolve_device
    from ..bench.llama import LlamaConfig
    from .eventlog import EventLog
    from .model import DEFAULT_VOCAB, PagedLlama
    from .scheduler import Scheduler, SchedulerConfig
    from .server import Api, Engine

    cfg = LlamaConfig.from_name(opts.preset)
    device = resolve_device(opts.device)
    dtype_name = opts.dtype if opts.dtype != "auto" else ("bf16" if device.startswith("cuda") else "fp32")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    vocab = opts.vocab or DEFAULT_VOCAB.get(cfg.name, 32000)
    dbytes = torch.tensor([], dtype=dtype).element_size()
    num_blocks = opts.num_blocks or _auto_blocks(opts, cfg, vocab, device, dbytes)
    sc = SchedulerConfig(opts.block_size, num_blocks, opts.max_batch_tokens, opts.max_num_seqs, opts.eos_id)
    model = PagedLlama(cfg, layers=opts.layers, num_blocks=num_blocks, block_size=opts.block_size, vocab=vocab,
                       device=device, dtype=dtype, seed=opts.seed)
    meta = {"model": f"llama {cfg.name}", "device": device, "block_size": sc.block_size, "num_blocks": num_blocks,
            "max_batch_tokens": sc.max_batch_tokens, "max_num_seqs": sc.max_num_seqs, "preset": cfg.name,
            "layers": opts.layers, "vocab": vocab, "dtype": dtype_name,
            "capacity_tokens": num_blocks * sc.block_size}
    if opts.eos_id is not None:
        meta["eos_token_id"] = opts.eos_id
    engine = Engine(Scheduler(sc), model, EventLog(opts.event_log, meta))
    api = Api(engine, opts.model_name or f"tracestory-{cfg.name}", vocab, opts.fail_rate)
    return engine, api


def run_server(opts: ServeOptions, ready: Callable[[str], None] | None = None) -> None:
    """Build and serve until SIGINT/SIGTERM (main thread only); ``ready(url)`` once listening."""
    import asyncio

    from .server import serve_app

    engine, api = build_server(opts)

    async def main() -> None:
        await serve_app(engine, api, opts.host, opts.port, stop=asyncio.Event(), ready=ready)

    asyncio.run(main())


def start_server_thread(opts: ServeOptions):
    """Build and serve on a background thread (tests, notebooks): returns a
    :class:`~.server.ServerHandle` with ``url`` and ``stop()``."""
    from .server import start_in_thread

    engine, api = build_server(opts)
    return start_in_thread(engine, api, opts.host, opts.port)
