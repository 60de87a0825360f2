"""``tracestory load``: drive an OpenAI-compatible server with streaming requests, as ``vllm bench
serve`` does (its flags, its printed block and its result keys; docs/LOADGEN.md maps them).

Settings may also come from the environment, as the capture runbook sets them (``TRACE_DURATION``,
``TARGET_QPS``, ``PROMPT_LEN_MIN``/``MAX``, ``MAX_NEW_TOKENS``, ``WARMUP_RUN`` and their
``TRACESTORY_LOAD_*`` names; :mod:`tracestory.loadgen.env`): flag > environment > default, and
the result files say where each came from. ``--warmup-run`` sends a warm-up load first
(:mod:`tracestory.loadgen.warmup`), whose result JSON is written apart and never counted.

Files, each only when asked: ``--save-result`` writes the flat result JSON (vLLM's keys, ms)
into ``--result-dir`` as ``--result-filename``; ``--output FILE`` streams every request's record
as a JSON line the moment it is known (``--save-detailed`` with ``--save-result`` streams them
next to the result as ``<result>.requests.jsonl``); ``--json FILE`` writes our nested summary
in ns, the file ``tracestory report`` reads with a scheduler log. Nothing is written into the
current folder unless named. Exit code: 0 when at least one request succeeded, 1 when none
did, 130 after Ctrl-C (records and results still written), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from .. import outputs, telemetry
from ..errors import UsageError
from ..loadgen import (
                        LoadConfig,
                        benchmark_result,
                        load_tokenizer,
                        parse_goodput,
                        parse_metadata,
                        parse_metric_percentiles,
                        parse_percentile_metrics,
                        prompt_source,
                        result_lines,
                        run_load,
                        summarize,
                        validate_base_url,
)
from ..loadgen.config import DATASETS, DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_REQUESTS, RAMP_UP, parse_extra_body, range_of
from ..loadgen.env import env_lines, resolve_env
from ..loadgen.metrics import default_result_filename, result_header
from ..loadgen.profile import start_profile, stop_profile
from ..loadgen.warmup import DEFAULT_WARMUP_REQUESTS, warmup_config, warmup_note, warmup_result_path


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


def config_from_args(args) -> LoadConfig:
    url = args.base_url if args.base_url is not None else f"http://{args.host}:{args.port}"
    rate = args.request_rate if args.request_rate is not None else math.inf
    url = validate_base_url(url, "--base-url" if args.base_url is not None else "--host/--port")
    endpoint = args.endpoint or ("/v1/chat/completions" if args.backend == "openai-chat" else "/v1/completions")
    lo_in, hi_in = range_of(args.random_input_len if args.random_input_len is not None else 1024,
                            args.random_range_ratio, "--random-input-len")
    lo_out, hi_out = range_of(args.random_output_len if args.random_output_len is not None else 128,
                              args.random_range_ratio, "--random-output-len")
    if args.prompt_len_min is not None or args.prompt_len_max is not None:
        lo_in = args.prompt_len_min if args.prompt_len_min is not None else args.prompt_len_max
        hi_in = args.prompt_len_max if args.prompt_len_max is not None else args.prompt_len_min
    if args.max_new_tokens is not None:
        lo_out = hi_out = args.max_new_tokens
    goodput = parse_goodput(args.goodput)
    for flag, name, seconds in (("--slo-ttft", "ttft", args.slo_ttft), ("--slo-itl", "tpot", args.slo_itl)):
        if seconds is not None:
            goodput.update(parse_goodput([f"{name}:{seconds * 1e3}"]))
    return LoadConfig(url=url, model=args.model, endpoint=endpoint, request_rate=rate,
                      burstiness=args.burstiness, max_concurrency=args.max_concurrency, num_requests=args.num_prompts,
                      duration_s=args.duration, prompt_len_min=lo_in, prompt_len_max=hi_in, max_new_tokens=hi_out,
                      min_new_tokens=lo_out, dataset=args.dataset_name, dataset_path=args.dataset_path,
                      sharegpt_output_len=args.sharegpt_output_len, tokenizer=args.tokenizer,
                      served_model_name=args.served_model_name, seed=args.seed, timeout_s=args.timeout,
                      ignore_eos=args.ignore_eos, goodput_ms=goodput, max_requests=args.max_requests,
                      max_in_flight=args.max_in_flight, custom_output_len=args.custom_output_len,
                      disable_shuffle=args.disable_shuffle, prefix_len=args.prefix_repetition_prefix_len,
                      suffix_len=args.prefix_repetition_suffix_len, num_prefixes=args.prefix_repetition_num_prefixes,
                      prefix_output_len=args.prefix_repetition_output_len, sonnet_input_len=args.sonnet_input_len,
                      sonnet_output_len=args.sonnet_output_len, sonnet_prefix_len=args.sonnet_prefix_len,
                      ramp_up_strategy=args.ramp_up_strategy, ramp_up_start_rps=args.ramp_up_start_rps, ramp_up_end_rps=args.ramp_up_end_rps,
                      temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                      extra_body=parse_extra_body(args.extra_body), stream=args.stream)


# ------------------------------------------------------------------ files


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))
    except OSError:
        return False


def _prepare(path: Path, inputs: list[Path]) -> Path:
    """Refuse an output that is an input or a folder; create its folder; check it is writable."""
    if outputs.is_stdout(path):
        return path
    for i in inputs:
        if _same_file(path, i):
            raise UsageError(f"{path}: is the input {i}; refusing to overwrite it with output")
    if path.is_dir():
        raise UsageError(f"{path}: expected a file to write, found a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{path}: cannot create its folder ({e.strerror or e})") from None
    if not os.access(path.parent, os.W_OK):
        raise UsageError(f"{path}: cannot write into {path.parent} (permission denied)")
    return path


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` through the output boundary (atomic; ``-`` is stdout)."""
    outputs.write_text(path, text)


class RecordStream:
    """Every record as one JSON line, written and flushed as soon as it is known."""

    def __init__(self, path: Path):
        self.path = path
        self.count = 0
        self.error: str | None = None
        self._fh = outputs.open_stream(path)
        self._own = not outputs.is_stdout(path)

    def __call__(self, record) -> None:
        if self.error is not None:
            return
        try:
            self._fh.write(json.dumps(record.to_json()) + "\n")
            self._fh.flush()
            self.count += 1
        except OSError as e:  # a full disk must not end the run: the summary still comes
            self.error = e.strerror or str(e)

    def close(self) -> None:
        try:
            self._fh.close() if self._own else self._fh.flush()
        except OSError as e:
            self.error = self.error or e.strerror or str(e)


def _jsonable(v):
    return "inf" if isinstance(v, float) and math.isinf(v) else v


def _telemetry_path(result: Path | None) -> Path | None:
    """``<result stem>.telemetry.jsonl`` beside the result (or summary) JSON."""
    return None if result is None else result.with_name(result.name.removesuffix(".json") + ".telemetry.jsonl")


def _run(cfg: LoadConfig, prompts, stream, label: str, show_progress: bool, console):
    """One load run with its progress bar (on stderr, gone when it ends)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = None
    if show_progress:
        bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                       TimeElapsedColumn(), console=console, transient=True)
        task = bar.add_task(label, total=None, info="")
        bar.start()

    def progress(p) -> None:
        bar.update(task, total=p.planned, completed=p.finished, info=f"sent {p.sent}  ok {p.ok}  failed {p.failed}")

    try:
        return run_load(cfg, progress if bar is not None else None, stream, prompts=prompts)
    finally:
        if bar is not None:
            bar.stop()
        if stream is not None:
            stream.close()


def main(args) -> int:
    """With ``--json -`` or ``--output -`` stdout carries that data only: the result block and
    the status lines go to stderr."""
    to_stdout = (args.json, args.output, args.result_filename if args.save_result and not args.result_dir else None)
    with outputs.prints_to_stderr(any(o and outputs.is_stdout(o) for o in to_stdout)):
        return _main(args)


def _main(args) -> int:
    from rich.console import Console

    # an explicit vLLM-style length flag wins over the runbook's length variables
    settings = resolve_env(vars(args), os.environ, blocked={
        "prompt_len_min": "--random-input-len" if args.random_input_len is not None else None,
        "prompt_len_max": "--random-input-len" if args.random_input_len is not None else None,
        "max_new_tokens": "--random-output-len" if args.random_output_len is not None else None})
    for line in env_lines(settings):
        print(line, file=sys.stderr)
    implied = next((f for f, v in (("--warmup-duration", args.warmup_duration),
                                   ("--warmup-requests", args.warmup_requests)) if v is not None), None)
    if not args.warmup_run and implied is not None:
        args.warmup_run = True
        settings["warmup_run"] = {"value": True, "source": f"implied by {implied}"}
    cfg = config_from_args(args)
    cfg.validate()
    wcfg = warmup_config(cfg, args.warmup_requests, args.warmup_duration) if args.warmup_run else None
    metrics = parse_percentile_metrics(args.percentile_metrics)
    percentiles = parse_metric_percentiles(args.metric_percentiles)
    metadata = parse_metadata(args.metadata)
    profile_body = parse_extra_body(args.profile_body, "--profile-body") if args.profile_body is not None else None
    if profile_body is not None and not args.profile:
        raise UsageError("--profile-body: expected with --profile, found no --profile")
    console = Console(stderr=True)
    date = time.strftime("%Y%m%d-%H%M%S")

    inputs = [Path(cfg.dataset_path)] if cfg.dataset_path else []
    result_path = stream_path = warm_path = None
    if args.save_result:
        name = args.result_filename or default_result_filename(cfg, args.label, date)
        result_path = _prepare(Path(args.result_dir or ".") / name, inputs)
    if args.output:
        stream_path = _prepare(Path(args.output), inputs)
    elif args.save_detailed and result_path is not None and not outputs.is_stdout(result_path):
        stream_path = _prepare(result_path.with_name(result_path.name.removesuffix(".json") + ".requests.jsonl"),
                               inputs)
    summary_path = _prepare(Path(args.json), inputs) if args.json else None
    # files named after the result (or the summary): never after "-"
    base = next((p for p in (result_path, summary_path) if p is not None and not outputs.is_stdout(p)), None)
    if wcfg is not None and base is not None:
        warm_path = _prepare(warmup_result_path(base), inputs)
    plan = outputs.OutputPlan(inputs)   # two flags naming one file, or two -, refused
    for flag, p in (("--save-result", result_path), ("--output", stream_path), ("--json", summary_path),
                    ("the warm-up result", warm_path)):
        if p is not None:
            plan.check(p, flag)

    choice = load_tokenizer(cfg.tokenizer)
    prompts = prompt_source(cfg, choice)
    prompts[0]  # a dataset with nothing usable is refused before any file is opened
    print(f"load: {choice.statement}", file=sys.stderr)
    expected = cfg.expected_arrivals
    asked = cfg.num_requests if cfg.num_requests is not None else expected
    if asked is not None and asked > cfg.max_requests:
        print(f"load: {asked:,.0f} requests would be planned; capped at {cfg.max_requests:,} (--max-requests)",
              file=sys.stderr)

    warm_res = None
    if wcfg is not None:
        rule = " and ".join(x for x in (f"{wcfg.num_requests} requests" if wcfg.num_requests else "",
                                        f"{wcfg.duration_s:g} s" if wcfg.duration_s else "") if x)
        print(f"load: warm-up run first ({rule}, same server and prompt settings, other prompts); "
              "not counted in the result", file=sys.stderr)
        wresult = _run(wcfg, prompt_source(wcfg, choice), None, "warm-up", not args.no_progress, console)
        warm_res = benchmark_result(wresult, metrics, percentiles, detailed=args.save_detailed)
        print(f"load: warm-up: {warm_res['completed']} completed, {warm_res['failed']} failed, "
              f"{warm_res['duration']:.2f} s", file=sys.stderr)
        if warm_path is not None:
            doc = {**result_header(wcfg, date=date, label=args.label, metadata=metadata), "run_kind": "warmup",
                   "settings": settings, "warmup": None, "profile": None, **warm_res}
            write_atomic(warm_path, json.dumps(doc, indent=1) + "\n")
            print(f"wrote {warm_path} (warm-up, not counted)")
        else:
            print("load: the warm-up result is not saved (add --save-result or --json)", file=sys.stderr)
        if wresult.interrupted:
            sys.stdout.flush()
            return 130
    warm = warmup_note(warm_res, warm_path) if warm_res is not None else None

    profile = None
    if args.profile:
        call = start_profile(cfg.url, profile_body)
        print(f"load: profiler started (POST {call.url}: HTTP {call.status}, {call.elapsed_s:.2f} s)", file=sys.stderr)
        profile = {"start": call.to_json(), "stop": None}
    stream = RecordStream(stream_path) if stream_path is not None else None
    try:
        with telemetry.maybe_sampler(_telemetry_path(base), label="load",
                                     enabled=not args.skip_power_monitor and base is not None):
            result = _run(cfg, prompts, stream, "load", not args.no_progress, console)
    finally:
        if profile is not None:
            stop = stop_profile(cfg.url, max(cfg.timeout_s, 60.0))
            profile["stop"] = stop.to_json()
            said = f"HTTP {stop.status}" if stop.status is not None else "no answer"
            answer = " ".join(stop.answer.split())[:200]
            print(f"load: profiler {'stopped' if stop.ok else 'stop FAILED'} (POST {stop.url}: {said}, "
                  f"{stop.elapsed_s:.2f} s){f': {answer}' if answer else ''}", file=sys.stderr)
    res = benchmark_result(result, metrics, percentiles, detailed=args.save_detailed)
    for line in result_lines(res, cfg, metrics, percentiles):
        print(line)
    if stream is not None:
        if stream.error is not None:
            raise UsageError(f"{stream.path}: cannot write ({stream.error}); {stream.count} of "
                             f"{len(result.records)} records written")
        if not outputs.is_stdout(stream.path):
            print(f"wrote {stream.path} ({stream.count} requests)")
    with outputs.all_or_nothing():     # the result and the summary: both or neither
        if result_path is not None:
            doc = {**result_header(cfg, date=date, label=args.label, metadata=metadata), "run_kind": "measured",
                   "settings": settings, "warmup": warm, "profile": profile, **res}
            write_atomic(result_path, json.dumps(doc, indent=1) + "\n")
        if summary_path is not None:
            config = {k: _jsonable(getattr(cfg, k)) for k in cfg.__dataclass_fields__}
            config.update(settings=settings, warmup=warm, profile=profile)
            write_atomic(summary_path, json.dumps({"config": config, "summary": summarize(result).to_json()},
                                                  indent=1) + "\n")
    for p in (result_path, summary_path):
        if p is not None and not outputs.is_stdout(p):
            print(f"wrote {p}")
    sys.stdout.flush()
    if result.interrupted:
        return 130
    return 0 if res["completed"] > 0 else 1
