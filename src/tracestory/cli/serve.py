"""``tracestory serve``: the OpenAI-compatible continuous-batching reference server.

Once the model is built and the engine runs, one line goes to stdout (flushed)::

    tracestory serve: listening on http://127.0.0.1:8000

and ``GET /health`` answers 200; ``GET /metrics`` has the Prometheus metrics. SIGINT/SIGTERM
shut it down (in-flight requests cancelled, event log closed), exit code 0. Without torch or
aiohttp the command stops with one line (exit code 2) naming the ``serve`` extra.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..capture.under_load import EVENT_LOG_ENV
from ..errors import UsageError
from ..models.llama_config import PRESETS
from ..models.runtime import dtype_name, require_package
from ..serve import ServeOptions, run_server


def _dtype(text: str) -> str:
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return dtype_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="OpenAI-compatible continuous-batching server over the Llama testbench",
                              description="OpenAI-compatible continuous-batching reference server (random-weight "
                                          "Llama layers, paged KV cache, scheduler event log, Prometheus /metrics).")
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model shape (default: tiny)")
    p.add_argument("--served-model-name", "--model", dest="served_model_names", nargs="+", metavar="NAME",
                   help="model name(s) requests may ask for; any other name gets HTTP 404, as vLLM answers "
                        "(default: the preset name)")
    p.add_argument("--model-name", dest="served_model_names", nargs="+", help=argparse.SUPPRESS)  # older spelling
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default: 2)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--dtype", default="auto", type=_dtype, metavar="{auto,bf16,fp16,fp32}",
                   help="weights and KV cache; bfloat16/float16/float32 also accepted "
                        "(default: auto = fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000,
                   help="port to listen on; 0 picks a free port, printed in the ready line (default: 8000)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default: 16)")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="KV blocks (default: 512 on CPU; on CUDA from --gpu-memory-fraction)")
    p.add_argument("--gpu-memory-fraction", type=float, default=0.5,
                   help="CUDA: share of free memory for weights + KV cache when --num-blocks is not given "
                        "(default: 0.5)")
    p.add_argument("--max-batch-tokens", type=int, default=256, help="token budget per iteration (default: 256)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="most running requests (default: 32)")
    p.add_argument("--event-log", metavar="JSONL",
                   help="write the scheduler event log here (default: $TRACESTORY_EVENT_LOG, which "
                        "'tracestory capture --load' sets to the capture folder)")
    p.add_argument("--vocab", type=int, help="vocabulary size (default: 512 tiny, 32000 / 128256 real presets)")
    p.add_argument("--eos-id", type=int, help="token id that ends a request (default: none)")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    p.add_argument("--fail-rate", type=float, default=0.0,
                   help="fraction of requests answered with HTTP 500 (deterministic: request k fails iff "
                        "floor(k*F) > floor((k-1)*F); default: 0)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    require_package("torch", "tracestory serve", "serve")
    require_package("aiohttp", "tracestory serve", "serve")
    for name in ("layers", "block_size", "max_batch_tokens", "max_num_seqs"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}: expected an integer >= 1, found {getattr(args, name)}")
    if args.num_blocks is not None and args.num_blocks < 1:
        raise UsageError(f"--num-blocks: expected an integer >= 1, found {args.num_blocks}")
    if not 0.0 <= args.fail_rate <= 1.0:
        raise UsageError(f"--fail-rate: expected a fraction in [0, 1], found {args.fail_rate}")
    opts = ServeOptions(preset=args.preset, layers=args.layers, device=args.device, dtype=args.dtype, host=args.host,
                        port=args.port, block_size=args.block_size, num_blocks=args.num_blocks,
                        max_batch_tokens=args.max_batch_tokens, max_num_seqs=args.max_num_seqs,
                        event_log=args.event_log or os.environ.get(EVENT_LOG_ENV) or None, vocab=args.vocab,
                        eos_id=args.eos_id, seed=args.seed, fail_rate=args.fail_rate,
                        served_model_names=tuple(args.served_model_names or ()),
                        gpu_memory_fraction=args.gpu_memory_fraction)

    def ready(url: str) -> None:
        print(f"tracestory serve: listening on {url}", flush=True)

    try:
        run_server(opts, ready=ready)
    except OSError as e:                  # the port is taken, the host cannot be bound
        raise UsageError(f"{args.host}:{args.port}: expected to listen, found {e.strerror or e}") from None
    print("tracestory serve: stopped", file=sys.stderr, flush=True)
    return 0
