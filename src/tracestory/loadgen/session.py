"""One ``tracestory load`` session, as one library call: :func:`run_session`.

The command line parses its flags and hands them here; the session does the rest, in order:
settings from the environment (:mod:`.env`: flag > environment > default, each setting's source
kept), the :class:`~.config.LoadConfig` (:func:`config_from_args`) and its checks, every output
file checked before anything is sent (an output that is an input, a folder, two flags naming
one file: refused), the prompts, the warm-up run (:mod:`.warmup`; its result written apart and
never counted), ``/start_profile`` (:mod:`.profile`), the measured run with its records
streamed as they complete and GPU telemetry sampled around it (:mod:`tracestory.telemetry`; a
failing sampler is stated, never a failed run), ``/stop_profile``, the result block, and the
result files.

Files, each only when asked: ``--save-result`` writes the flat result JSON (vLLM's keys, ms)
into ``--result-dir`` as ``--result-filename``; ``--output FILE`` streams every request's record
as a JSON line the moment it is known (``--save-detailed`` with ``--save-result`` streams them
next to the result as ``<result>.requests.jsonl``); ``--json FILE`` writes our nested summary
in ns, the file ``tracestory report`` reads with a scheduler log; the telemetry goes beside the
result (or summary) as ``<stem>.telemetry.jsonl``. Nothing is written into the current folder
unless named. The result and the summary are written together or not at all
(:func:`tracestory.outputs.all_or_nothing`); every file goes through :mod:`tracestory.outputs`.

Printing: the result block and the ``wrote FILE`` lines on stdout (the caller redirects them to
stderr when a data output is ``-``), status lines and the progress bar on stderr. The exit code
(:attr:`SessionOutcome.exit_code`): 0 when at least one request succeeded, 1 when none did, 130
after Ctrl-C (records and results still written); bad settings raise
:class:`~tracestory.errors.UsageError` before anything is sent.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import outputs, telemetry
from ..errors import UsageError
from .config import (
    LoadConfig,
    parse_extra_body,
    parse_goodput,
    parse_metadata,
    parse_metric_percentiles,
    parse_percentile_metrics,
    range_of,
    validate_base_url,
)
from .datasets import load_tokenizer
from .env import env_lines, resolve_env
from .generator import LoadResult, run_load
from .metrics import benchmark_result, default_result_filename, result_header, result_lines
from .profile import start_profile, stop_profile
from .prompts import prompt_source
from .stats import summarize
from .warmup import warmup_config, warmup_note, warmup_result_path


@dataclass(frozen=True)
class SessionOutcome:
    exit_code: int                      # 0 some request OK, 1 none, 130 interrupted
    result: dict                        # the flat result (vLLM's keys, ms) of the measured run
    written: tuple[str, ...]            # files written (not "-")
    telemetry_incomplete: str | None    # "telemetry incomplete: <reason>", or None


def config_from_args(args: Any) -> LoadConfig:
    """The run's settings from the flag values (an ``argparse.Namespace`` of ``tracestory load``,
    after :func:`~.env.resolve_env` filled what the environment sets)."""
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
    for name, seconds in (("ttft", args.slo_ttft), ("tpot", args.slo_itl)):
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
                      ramp_up_strategy=args.ramp_up_strategy, ramp_up_start_rps=args.ramp_up_start_rps,
                      ramp_up_end_rps=args.ramp_up_end_rps, temperature=args.temperature, top_p=args.top_p,
                      top_k=args.top_k, min_p=args.min_p, extra_body=parse_extra_body(args.extra_body),
                      stream=args.stream)


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


def telemetry_path(result: Path | None) -> Path | None:
    """``<result stem>.telemetry.jsonl`` beside the result (or summary) JSON."""
    return None if result is None else result.with_name(result.name.removesuffix(".json") + ".telemetry.jsonl")


def _run(cfg: LoadConfig, prompts, stream, label: str, show_progress: bool) -> LoadResult:
    """One load run with its progress bar (on stderr, gone when it ends)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = None
    if show_progress:
        bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                       TimeElapsedColumn(), console=Console(stderr=True), transient=True)
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


def _say(line: str) -> None:
    print(line, file=sys.stderr)


# ------------------------------------------------------------------ the session


def run_session(args: Any, environ: Mapping[str, str]) -> SessionOutcome:
    """Run one ``tracestory load`` session from its flag values (``args``, an
    ``argparse.Namespace`` of the ``load`` command; filled in place from ``environ``, the
    process environment) and return its outcome (see the module docstring)."""
    # an explicit vLLM-style length flag wins over the runbook's length variables
    settings = resolve_env(vars(args), environ, blocked={
        "prompt_len_min": "--random-input-len" if args.random_input_len is not None else None,
        "prompt_len_max": "--random-input-len" if args.random_input_len is not None else None,
        "max_new_tokens": "--random-output-len" if args.random_output_len is not None else None})
    for line in env_lines(settings):
        _say(line)
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
    show_progress = not args.no_progress
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
    _say(f"load: {choice.statement}")
    expected = cfg.expected_arrivals
    asked = cfg.num_requests if cfg.num_requests is not None else expected
    if asked is not None and asked > cfg.max_requests:
        _say(f"load: {asked:,.0f} requests would be planned; capped at {cfg.max_requests:,} (--max-requests)")
    written: list[str] = []

    warm_res = None
    if wcfg is not None:
        rule = " and ".join(x for x in (f"{wcfg.num_requests} requests" if wcfg.num_requests else "",
                                        f"{wcfg.duration_s:g} s" if wcfg.duration_s else "") if x)
        _say(f"load: warm-up run first ({rule}, same server and prompt settings, other prompts); "
             "not counted in the result")
        wresult = _run(wcfg, prompt_source(wcfg, choice), None, "warm-up", show_progress)
        warm_res = benchmark_result(wresult, metrics, percentiles, detailed=args.save_detailed)
        _say(f"load: warm-up: {warm_res['completed']} completed, {warm_res['failed']} failed, "
             f"{warm_res['duration']:.2f} s")
        if warm_path is not None:
            doc = {**result_header(wcfg, date=date, label=args.label, metadata=metadata), "run_kind": "warmup",
                   "settings": settings, "warmup": None, "profile": None, "telemetry_incomplete": None, **warm_res}
            outputs.write_text(warm_path, json.dumps(doc, indent=1) + "\n")
            written.append(str(warm_path))
            print(f"wrote {warm_path} (warm-up, not counted)")
        else:
            _say("load: the warm-up result is not saved (add --save-result or --json)")
        if wresult.interrupted:
            sys.stdout.flush()
            return SessionOutcome(130, warm_res, tuple(written), None)
    warm = warmup_note(warm_res, warm_path) if warm_res is not None else None

    profile = None
    if args.profile:
        call = start_profile(cfg.url, profile_body)
        _say(f"load: profiler started (POST {call.url}: HTTP {call.status}, {call.elapsed_s:.2f} s)")
        profile = {"start": call.to_json(), "stop": None}
    stream = RecordStream(stream_path) if stream_path is not None else None
    sampler = None
    try:
        with telemetry.maybe_sampler(telemetry_path(base), label="load",
                                     enabled=not args.skip_power_monitor and base is not None) as sampler:
            result = _run(cfg, prompts, stream, "load", show_progress)
    finally:
        if profile is not None:
            stop = stop_profile(cfg.url, max(cfg.timeout_s, 60.0))
            profile["stop"] = stop.to_json()
            said = f"HTTP {stop.status}" if stop.status is not None else "no answer"
            answer = " ".join(stop.answer.split())[:200]
            _say(f"load: profiler {'stopped' if stop.ok else 'stop FAILED'} (POST {stop.url}: {said}, "
                 f"{stop.elapsed_s:.2f} s){f': {answer}' if answer else ''}")
    incomplete = sampler.incomplete_reason if sampler is not None else None
    if incomplete is not None:
        _say(f"load: GPU {incomplete}")
    res = benchmark_result(result, metrics, percentiles, detailed=args.save_detailed)
    for line in result_lines(res, cfg, metrics, percentiles):
        print(line)
    if stream is not None:
        if stream.error is not None:
            raise UsageError(f"{stream.path}: cannot write ({stream.error}); {stream.count} of "
                             f"{len(result.records)} records written")
        if not outputs.is_stdout(stream.path):
            written.append(str(stream.path))
            print(f"wrote {stream.path} ({stream.count} requests)")
    with outputs.all_or_nothing():     # the result and the summary: both or neither
        if result_path is not None:
            doc = {**result_header(cfg, date=date, label=args.label, metadata=metadata), "run_kind": "measured",
                   "settings": settings, "warmup": warm, "profile": profile, "telemetry_incomplete": incomplete,
                   **res}
            outputs.write_text(result_path, json.dumps(doc, indent=1) + "\n")
        if summary_path is not None:
            config = {k: _jsonable(getattr(cfg, k)) for k in cfg.__dataclass_fields__}
            config.update(settings=settings, warmup=warm, profile=profile, telemetry_incomplete=incomplete)
            outputs.write_text(summary_path, json.dumps({"config": config, "summary": summarize(result).to_json()},
                                                        indent=1) + "\n")
    for p in (result_path, summary_path):
        if p is not None and not outputs.is_stdout(p):
            written.append(str(p))
            print(f"wrote {p}")
    sys.stdout.flush()
    code = 130 if result.interrupted else 0 if res["completed"] > 0 else 1
    return SessionOutcome(code, res, tuple(written), incomplete)
