"""``tracestory load``: drive an OpenAI-compatible server with streaming requests, as ``vllm bench
serve`` does (its flags, its printed block and its result keys; docs/LOADGEN.md maps them).

This module parses the flags; the session (environment settings, warm-up, profiler calls, the
record stream, telemetry, the result files) is one library call,
:func:`tracestory.loadgen.session.run_session`, whose docstring says what is written where and
the exit codes. Settings may also come from the environment, as the capture runbook sets them
(``TRACE_DURATION``, ``TARGET_QPS``, ``PROMPT_LEN_MIN``/``MAX``, ``MAX_NEW_TOKENS``,
``WARMUP_RUN`` and their ``TRACESTORY_LOAD_*`` names; :mod:`tracestory.loadgen.env`).
"""

from __future__ import annotations

import argparse
import math
import os

from .. import outputs
from ..loadgen.config import DATASETS, DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_REQUESTS, RAMP_UP
from ..loadgen.session import run_session
from ..loadgen.warmup import DEFAULT_WARMUP_REQUESTS


def _rate(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of requests/s or inf, found {text!r}") from None
    if math.isnan(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a rate > 0 or inf, found {text!r}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    hide = argparse.SUPPRESS
    srv = p.add_argument_group("server")
    srv.add_argument("--base-url", "--url", dest="base_url",
                     help="server base URL, e.g. http://127.0.0.1:8000 (default: http://HOST:PORT)")
    srv.add_argument("--host", default="127.0.0.1", help="server host when no --base-url (default: %(default)s)")
    srv.add_argument("--port", type=int, default=8000, help="server port when no --base-url (default: %(default)s)")
    srv.add_argument("--endpoint", default=None,
                     help="request path: /v1/completions (default) or /v1/chat/completions; "
                          "'completions' and 'chat' are accepted")
    srv.add_argument("--backend", choices=("openai", "openai-chat", "vllm"), default=None,
                     help="openai-chat sends chat requests to /v1/chat/completions; openai and vllm: completions")
    srv.add_argument("--model", required=True, help="model name (sent in each request unless --served-model-name)")
    srv.add_argument("--served-model-name", help="the name sent in requests, when it differs from --model")
    srv.add_argument("--timeout", type=float, default=300.0, help="per-request limit, seconds (default: 300)")

    load = p.add_argument_group("arrivals")
    load.add_argument("--request-rate", "--target-qps", dest="request_rate", type=_rate, default=None,
                      help="requests per second, or inf to send all at once (default: $TARGET_QPS, else inf)")
    load.add_argument("--burstiness", type=float, default=1.0,
                      help="gamma shape of the gaps between requests: 1 Poisson, <1 burstier, >1 steadier "
                           "(default: 1)")
    load.add_argument("--max-concurrency", "--concurrency", dest="max_concurrency", type=int,
                      help="at most this many requests in flight (with rate inf: a closed loop)")
    load.add_argument("--num-prompts", "--num-requests", dest="num_prompts", type=int,
                      help="requests to send (default: 1000, or as many as --duration allows)")
    load.add_argument("--duration", type=float,
                      help="seconds during which requests are sent; those not sent by then are 'not sent' "
                           "(default: $TRACE_DURATION, else none)")
    load.add_argument("--ramp-up-strategy", choices=RAMP_UP, default=None,
                      help="raise the request rate over the planned requests, from --ramp-up-start-rps to "
                           "--ramp-up-end-rps (replaces --request-rate; needs --num-prompts)")
    load.add_argument("--ramp-up-start-rps", type=float, default=None, help="rate of the first request")
    load.add_argument("--ramp-up-end-rps", type=float, default=None, help="rate of the last request")
    load.add_argument("--seed", type=int, default=0, help="arrival times, prompt lengths, prompts (default: 0)")
    load.add_argument("--max-requests", type=int, default=DEFAULT_MAX_REQUESTS,
                      help="safety cap on planned requests (default: %(default)s)")
    load.add_argument("--max-in-flight", type=int, default=DEFAULT_MAX_IN_FLIGHT,
                      help="safety cap on requests in flight without --max-concurrency (default: %(default)s)")

    smp = p.add_argument_group("sampling and request body")
    smp.add_argument("--temperature", type=float, default=None,
                     help="sent in every request (default: 0.0, greedy, as vllm bench serve sends)")
    smp.add_argument("--top-p", type=float, default=None, help="sent when given")
    smp.add_argument("--top-k", type=int, default=None, help="sent when given")
    smp.add_argument("--min-p", type=float, default=None, help="sent when given")
    smp.add_argument("--extra-body", "--extra-request-body", dest="extra_body", metavar="JSON",
                     help="a JSON object merged last into every request body, e.g. '{\"priority\": 1}'")
    smp.add_argument("--no-stream", dest="stream", action="store_false",
                     help="non-streaming requests: one JSON response each (E2E only; no TTFT/ITL/TPOT)")
    prof = p.add_argument_group("server profiler")
    prof.add_argument("--profile", action="store_true",
                      help="POST /start_profile before the measured run and /stop_profile after (vLLM with "
                           "VLLM_TORCH_PROFILER_DIR, SGLang, tracestory serve --profiler-dir)")
    prof.add_argument("--profile-body", metavar="JSON",
                      help="JSON body of /start_profile (SGLang reads output_dir, num_steps, activities, ...)")

    warm = p.add_argument_group("warm-up")
    warm.add_argument("--warmup-run", action="store_true", default=None,
                      help="send a warm-up load first (same server and prompt settings, other prompts); its "
                           "result JSON is written apart (<result>.warmup.json) and not counted "
                           "(default: $WARMUP_RUN, else off)")
    warm.add_argument("--warmup-duration", type=float, default=None,
                      help="send window of the warm-up, seconds (implies --warmup-run)")
    warm.add_argument("--warmup-requests", type=int, default=None,
                      help=f"requests of the warm-up (implies --warmup-run; default {DEFAULT_WARMUP_REQUESTS} "
                           "when no --warmup-duration)")

    data = p.add_argument_group("prompts")
    data.add_argument("--dataset-name", choices=DATASETS, default="random",
                      help="random token lengths, a local ShareGPT file, a local JSONL of prompts (custom), "
                           "shared prefixes with random suffixes (prefix_repetition), or lines of a local poem "
                           "file (sonnet) (default: random)")
    data.add_argument("--dataset-path", help="ShareGPT-format JSON file, the custom dataset's JSONL, or the sonnet "
                                             "text file (local path)")
    data.add_argument("--custom-output-len", type=int, default=None,
                      help="custom: max_tokens of every request; -1: each line's output_tokens (default: the "
                           "line's output_tokens when it has one, else 256)")
    data.add_argument("--disable-shuffle", action="store_true",
                      help="sharegpt / custom: use the file's order (default: shuffled by --seed)")
    data.add_argument("--prefix-repetition-prefix-len", type=int, default=256, help="tokens of each shared prefix")
    data.add_argument("--prefix-repetition-suffix-len", type=int, default=256, help="tokens of each random suffix")
    data.add_argument("--prefix-repetition-num-prefixes", type=int, default=10, help="number of shared prefixes")
    data.add_argument("--prefix-repetition-output-len", type=int, default=128, help="max_tokens of every request")
    data.add_argument("--sonnet-input-len", type=int, default=550, help="sonnet: tokens of each prompt at most")
    data.add_argument("--sonnet-output-len", type=int, default=150, help="sonnet: max_tokens of every request")
    data.add_argument("--sonnet-prefix-len", type=int, default=200, help="sonnet: tokens of the shared first lines")
    data.add_argument("--tokenizer", help="transformers tokenizer (name or folder, loaded offline) for exact "
                                          "token lengths; without it lengths are word counts")
    data.add_argument("--random-input-len", type=int, default=None,
                      help="prompt tokens (default: $PROMPT_LEN_MIN..$PROMPT_LEN_MAX, else 1024)")
    data.add_argument("--random-output-len", type=int, default=None,
                      help="max_tokens asked (default: $MAX_NEW_TOKENS, else 128)")
    data.add_argument("--random-range-ratio", type=float, default=0.0,
                      help="lengths uniform in [L (1 - r), L (1 + r)] (default: 0)")
    data.add_argument("--sharegpt-output-len", type=int, help="max_tokens for every ShareGPT request "
                                                              "(default: the length of the reply in the file)")
    data.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (vLLM and our server: exact lengths)")
    data.add_argument("--prompt-len-min", type=int, help=hide)
    data.add_argument("--prompt-len-max", type=int, help=hide)
    data.add_argument("--max-new-tokens", type=int, help=hide)

    res = p.add_argument_group("results")
    res.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                     help="metrics with percentiles, from ttft,tpot,itl,e2el (default: %(default)s)")
    res.add_argument("--metric-percentiles", default="99", help="percentiles, e.g. 50,90,99 (default: %(default)s)")
    res.add_argument("--goodput", nargs="+", metavar="METRIC:MS",
                     help="SLOs in ms for request goodput, e.g. ttft:500 tpot:50 (metrics ttft, tpot, e2el)")
    res.add_argument("--slo-ttft", type=float, help=hide)
    res.add_argument("--slo-itl", type=float, help=hide)
    res.add_argument("--save-result", action="store_true", help="write the result JSON (vLLM's keys, ms)")
    res.add_argument("--save-detailed", action="store_true",
                     help="per-request lists in the result JSON, and every record streamed to "
                          "<result>.requests.jsonl as it completes")
    res.add_argument("--result-dir", help="folder of the result JSON (default: the current folder)")
    res.add_argument("--result-filename", help="name of the result JSON (default: vLLM's "
                                               "<label>-<rate>qps[-concurrency<N>]-<model>-<date>.json)")
    res.add_argument("--label", help="label of the run (first word of the default file name)")
    res.add_argument("--metadata", nargs="+", metavar="KEY=VALUE", help="extra keys of the result JSON")
    res.add_argument("--output", metavar="FILE", help="stream every request's record as JSON lines to FILE")
    res.add_argument("--json", metavar="FILE", help="our summary (ns, nested) for `tracestory report`")
    res.add_argument("--no-progress", "--disable-tqdm", dest="no_progress", action="store_true",
                     help="no progress bar")
    res.add_argument("--skip-power-monitor", action="store_true",
                     help="no GPU telemetry of this machine's GPUs (by default sampled while the load runs and "
                          "written beside the result or --json file as <stem>.telemetry.jsonl)")


def register(subparsers) -> None:
    p = subparsers.add_parser("load", help="load generator for OpenAI-compatible servers (vllm bench serve's flags)",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=main)


def main(args) -> int:
    """Parse -> :func:`~tracestory.loadgen.session.run_session` -> its exit code. With ``--json -``
    or ``--output -`` stdout carries that data only: the result block and the status lines go to
    stderr."""
    to_stdout = (args.json, args.output, args.result_filename if args.save_result and not args.result_dir else None)
    with outputs.prints_to_stderr(any(o and outputs.is_stdout(o) for o in to_stdout)):
        return run_session(args, os.environ).exit_code
