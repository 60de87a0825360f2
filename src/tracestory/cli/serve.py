"""``tracestory serve``: the OpenAI-compatible continuous-batching reference server.

Once the model is built and the engine runs, one line goes to stdout (flushed)::

    tracestory serve: listening on http://127.0.0.1:8000

and ``GET /health`` answers 200; ``GET /metrics`` has the Prometheus metrics. SIGINT/SIGTERM
shut it down (in-flight requests cancelled, event log closed), exit code 0. Without torch or
aiohttp the command stops with one line (exit code 2) naming the ``serve`` extra.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path

from .. import telemetry
from ..capture.under_load import EVENT_LOG_ENV
from ..errors import UsageError
from ..models.llama_config import FP8_MODES, PRESETS
from ..models.runtime import dtype_name, require_package
from ..serve import ServeOptions, ServerLimits, check_footprint_on_cpu, run_server, tensor_parallel, tp_process
from ..serve.model import ATTENTION_BACKENDS


def _dtype(text: str) -> str:
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return dtype_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# the CUDA engine's paths that the environment switches, for A/B runs (each is said at start-up and
# recorded in the event log's meta.startup); docs/BENCHMARKS.md has what each measured
ENGINE_SWITCHES = """engine switches (environment variables, CUDA; for A/B runs):
  TRACESTORY_GLUE=torch         torch ops instead of the fused Triton glue kernels
  TRACESTORY_SMALL_M=0          cuBLAS _scaled_mm at decode instead of the small-M FP8 GEMM
  TRACESTORY_PDL=0              no programmatic dependent launch of the Triton kernels (Hopper)
  TRACESTORY_DECODE_ATTN=0      FlexAttention's decoding kernel in the decode graphs instead of the
                                paged split-KV Triton kernels
  TRACESTORY_FRESH_ATTN=0|flash|cudnn
                                fresh prompts: FlexAttention's chunk kernel (0), flash, or cuDNN graphs
                                per chunk bucket (needs nvidia-cudnn-frontend; default auto: cuDNN
                                where its start-up probe passes, else flash)
  TRACESTORY_ALLREDUCE=auto     tensor parallel: symmetric-memory all-reduce where it sets up (default nccl)
  TRACESTORY_STALL_STACKS_MS=N  diagnostic: every Python thread's stack when a host step of the engine
                                (launch, hand-out; a follower's launch) outlasts N ms, written to
                                stall_stacks.rankR.txt in $TRACESTORY_STALL_STACKS_DIR (default: here)"""


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="OpenAI-compatible continuous-batching server over the Llama testbench",
                              description="OpenAI-compatible continuous-batching reference server (random-weight "
                                          "Llama layers, paged KV cache, scheduler event log, Prometheus /metrics).",
                              epilog=ENGINE_SWITCHES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="auto", choices=["auto", *sorted(PRESETS)],
                   help="model shape (default: auto = tiny on the CPU, llama-3-8b on CUDA)")
    p.add_argument("--served-model-name", "--model", dest="served_model_names", nargs="+", metavar="NAME",
                   help="model name(s) requests may ask for; any other name gets HTTP 404, as vLLM answers "
                        "(default: the preset name)")
    p.add_argument("--model-name", dest="served_model_names", nargs="+", help=argparse.SUPPRESS)  # older spelling
    p.add_argument("--layers", type=int, default=None,
                   help="decoder layers (default: 2; all 32 for the llama-3-8b default on CUDA)")
    p.add_argument("--attention-backend", default="auto", choices=["auto", *ATTENTION_BACKENDS],
                   help="sdpa: contexts gathered per iteration; flex: FlexAttention over the paged cache "
                        "through the block tables, compiled per shape bucket at startup (default: auto = flex "
                        "on CUDA, sdpa on the CPU)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="CUDA: no CUDA graphs for decode-only iterations (default: graphs per batch-size "
                        "bucket, with --attention-backend flex)")
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   help="wait for each iteration's tokens before scheduling the next (default: schedule "
                        "iteration N+1 while N runs, tokens handed out one iteration later)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest context the decode CUDA graphs serve; longer ones run eagerly (default: 8192)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--fp8", default="off", choices=FP8_MODES,
                   help="FP8 projections: weights quantised once to e4m3 (one scale per output row, or one per "
                        "tensor), activations per row or per tensor at each call, torch._scaled_mm "
                        "(default: off)")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="shard the model over N processes started by torchrun --nproc_per_node=N (rank 0 "
                        "serves HTTP; cuda:LOCAL_RANK with NCCL when --device is cuda, the CPU with gloo "
                        "otherwise; default: 1)")
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
    p.add_argument("--max-num-batched-tokens", "--max-batch-tokens", dest="max_batch_tokens", type=int, default=None,
                   metavar="N", help="token budget per iteration: decode tokens plus prefill chunks (vLLM's name; "
                   "default: 2048 on CUDA, where prefill and mixed iterations replay CUDA graphs per chunk "
                   "bucket up to it, 256 on the CPU)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="most running requests (default: 32)")
    p.add_argument("--event-log", metavar="JSONL",
                   help="write the scheduler event log here (default: $TRACESTORY_EVENT_LOG, which "
                        "'tracestory capture --load' sets to the capture folder)")
    p.add_argument("--skip-power-monitor", action="store_true",
                   help="no GPU telemetry (by default NVML is sampled at 20 Hz in the server process into "
                        f"${telemetry.PATH_ENV} or telemetry.jsonl beside the event log)")
    p.add_argument("--vocab", type=int, help="vocabulary size (default: 512 tiny, 32000 / 128256 real presets)")
    p.add_argument("--eos-id", type=int, help="token id that ends a request (default: none)")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    p.add_argument("--fail-rate", type=float, default=0.0,
                   help="fraction of requests answered with HTTP 500 (deterministic: request k fails iff "
                        "floor(k*F) > floor((k-1)*F); default: 0)")
    p.add_argument("--fair-wait-iterations", type=int, default=64, metavar="N",
                   help="when the first waiting request has waited N iterations for KV blocks or a seat, "
                        "requests that ran N iterations are preempted and requeued at the back (round-robin "
                        "under pressure); 0: plain first-come-first-served (default: 64)")
    p.add_argument("--max-waiting", type=int, default=64,
                   help="requests admitted beyond --max-num-seqs; one more gets HTTP 429 with Retry-After "
                        "(default: 64)")
    p.add_argument("--max-connections", type=int, default=None,
                   help="open connections; above it the oldest one without a complete request head is closed, "
                        "or the new one gets 503 (default: the open-file limit minus 64, at most 1024)")
    p.add_argument("--idle-timeout", type=float, default=15.0, metavar="S",
                   help="close a connection with no complete request head for S seconds: slow headers, idle "
                        "keep-alive (default: 15)")
    p.add_argument("--request-timeout", type=float, default=600.0, metavar="S",
                   help="cancel a request S seconds after admission, freeing its KV blocks (default: 600)")
    p.add_argument("--stall-timeout", type=float, default=60.0, metavar="S",
                   help="an engine step (a forward, a collective with the other tensor-parallel ranks) that "
                        "has not returned after S seconds makes GET /health answer 503 with the reason, and "
                        "requests fail with it instead of hanging; must exceed the longest iteration "
                        "(default: 60)")
    p.add_argument("--max-request-mb", type=float, default=8.0, metavar="MB",
                   help="largest request body, MiB; larger gets HTTP 413 (default: 8)")
    p.add_argument("--max-inflight-mb", type=float, default=64.0, metavar="MB",
                   help="request bodies being read at once, MiB; over it HTTP 503 with Retry-After (default: 64)")
    p.add_argument("--profiler-dir", metavar="DIR", default=None,
                   help="enable POST /start_profile and /stop_profile (vLLM's and SGLang's endpoints; "
                        "tracestory load --profile): torch.profiler traces are written into DIR")
    p.set_defaults(func=_run)


_DEVICE = re.compile(r"(cpu|cuda|cuda:\d+|auto)")


def _check_args(args: argparse.Namespace) -> None:
    """One :class:`UsageError` line for the first flag that cannot work (before anything is built)."""
    def bad(flag: str, expected: str, found) -> UsageError:
        return UsageError(f"{flag}: expected {expected}, found {found}")

    for name in ("block_size", "max_num_seqs", "max_waiting", "tensor_parallel"):
        if getattr(args, name) < 1:
            raise bad(f"--{name.replace('_', '-')}", "an integer >= 1", getattr(args, name))
    if args.max_batch_tokens is not None and args.max_batch_tokens < 1:
        raise bad("--max-num-batched-tokens", "an integer >= 1", args.max_batch_tokens)
    if args.fair_wait_iterations < 0:
        raise bad("--fair-wait-iterations", "an integer >= 0", args.fair_wait_iterations)
    for name in ("layers", "num_blocks", "vocab", "max_connections", "max_model_len"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise bad(f"--{name.replace('_', '-')}", "an integer >= 1", getattr(args, name))
    if not 0 <= args.port <= 65535:
        raise bad("--port", "a TCP port in 0..65535", args.port)
    if not _DEVICE.fullmatch(args.device):
        raise bad("--device", "cpu, cuda, cuda:N or auto", repr(args.device))
    if args.eos_id is not None and not 0 <= args.eos_id < (args.vocab or 2**31):
        raise bad("--eos-id", f"a token id in [0, {args.vocab})" if args.vocab else "a token id >= 0", args.eos_id)
    if not 0.0 <= args.fail_rate <= 1.0:
        raise bad("--fail-rate", "a fraction in [0, 1]", args.fail_rate)
    if not 0.0 < args.gpu_memory_fraction <= 1.0:
        raise bad("--gpu-memory-fraction", "a fraction in (0, 1]", args.gpu_memory_fraction)
    for name in ("idle_timeout", "request_timeout", "stall_timeout", "max_request_mb", "max_inflight_mb"):
        v = getattr(args, name)
        if not (math.isfinite(v) and v > 0):
            raise bad(f"--{name.replace('_', '-')}", "a finite number > 0", v)
    if args.tensor_parallel > 1 and _serve_words() is None:   # launched by torchrun with as many processes
        tensor_parallel.rank_from_env(args.tensor_parallel)
    if args.event_log == "-":            # stdout carries the server's status lines ("listening on ...")
        raise bad("--event-log", "a file path (stdout carries the server's status lines)", "'-'")
    if args.profiler_dir is not None:
        _check_profiler_dir(args.profiler_dir)
    if args.max_inflight_mb < args.max_request_mb:
        raise bad("--max-inflight-mb", f"at least --max-request-mb ({args.max_request_mb:g})", args.max_inflight_mb)


def _serve_words() -> list[str] | None:
    """The words after ``serve`` of a ``tracestory serve --tensor-parallel N`` typed without
    torchrun (it then launches its ranks itself), else None. Never inside a capture's runner:
    its profiler would see the launcher, not the ranks (``capture --torchrun N`` is the way)."""
    if ("WORLD_SIZE" in os.environ or os.environ.get("TRACESTORY_CAPTURE_RUNNER")
            or "serve" not in sys.argv[1:3]):
        return None
    return sys.argv[sys.argv.index("serve") + 1:]


def _check_profiler_dir(folder: str) -> None:
    """Create ``--profiler-dir`` now, so a folder that cannot hold traces is said at start."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--profiler-dir: expected a folder, found a file {path}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--profiler-dir: expected a folder it can create, found {e.strerror or e} ({path})") from None
    if not os.access(path, os.W_OK):
        raise UsageError(f"--profiler-dir: expected a writable folder, found {path} not writable")


def _run(args: argparse.Namespace) -> int:
    _check_args(args)
    limits = ServerLimits(max_waiting=args.max_waiting, max_connections=args.max_connections,
                          idle_timeout_s=args.idle_timeout, request_timeout_s=args.request_timeout,
                          stall_timeout_s=args.stall_timeout,
                          max_request_bytes=max(1, int(args.max_request_mb * 2**20)),
                          max_inflight_bytes=max(1, int(args.max_inflight_mb * 2**20)))
    opts = ServeOptions(preset=args.preset, layers=args.layers, device=args.device, dtype=args.dtype, host=args.host,
                        port=args.port, block_size=args.block_size, num_blocks=args.num_blocks,
                        max_batch_tokens=args.max_batch_tokens, max_num_seqs=args.max_num_seqs,
                        event_log=args.event_log or os.environ.get(EVENT_LOG_ENV) or None, vocab=args.vocab,
                        eos_id=args.eos_id, seed=args.seed, fail_rate=args.fail_rate,
                        served_model_names=tuple(args.served_model_names or ()),
                        gpu_memory_fraction=args.gpu_memory_fraction, limits=limits,
                        fair_wait_iterations=args.fair_wait_iterations or None,
                        attention_backend=args.attention_backend, enforce_eager=args.enforce_eager,
                        overlap=args.overlap, max_model_len=args.max_model_len,
                        power_monitor=not args.skip_power_monitor,
                        telemetry_path=os.environ.get(telemetry.PATH_ENV) or None,
                        tensor_parallel=args.tensor_parallel, fp8=args.fp8, profiler_dir=args.profiler_dir)
    if args.tensor_parallel > 1 and (words := _serve_words()) is not None:
        check_footprint_on_cpu(opts)      # before N ranks start (each checks again as it builds)
        return tp_process.launch(args.tensor_parallel, words)
    require_package("torch", "tracestory serve", "serve")
    require_package("aiohttp", "tracestory serve", "serve")

    def ready(url: str) -> None:
        print(f"tracestory serve: listening on {url}", flush=True)

    try:
        run_server(opts, ready=ready)
    except OSError as e:                  # the port is taken, the host cannot be bound
        raise UsageError(f"{args.host}:{args.port}: expected to listen, found {e.strerror or e}") from None
    print("tracestory serve: stopped", file=sys.stderr, flush=True)
    if args.tensor_parallel > 1:
        tp_process.finish_process(0)
    return 0
