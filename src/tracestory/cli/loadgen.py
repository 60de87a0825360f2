"""``tracestory load``: drive an OpenAI-compatible server with streaming requests.

Writes every request's record as JSON lines (``--output``, written also after Ctrl-C) and the
summary (``--json``); prints the summary. Exit code: 0 when at least one request succeeded,
1 when none did, 130 after Ctrl-C (records still written), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (default: %(default)s)")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions or /v1/chat/completions (default: completions)")
    p.add_argument("--model", required=True, help="model name sent in each request")
    rate = p.add_mutually_exclusive_group(required=True)
    rate.add_argument("--target-qps", type=float, help="open-loop Poisson arrivals per second")
    rate.add_argument("--concurrency", type=int, help="fixed number of requests in flight")
    p.add_argument("--duration", type=float, default=60.0, help="seconds during which requests start (default: 60)")
    p.add_argument("--num-requests", type=int, help="stop starting requests after this many")
    p.add_argument("--prompt-len-min", type=int, default=512, help="tokens (default: 512)")
    p.add_argument("--prompt-len-max", type=int, default=1024, help="tokens (default: 1024)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="max_tokens of each request (default: 512)")
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (vLLM and our server: exact lengths)")
    p.add_argument("--seed", type=int, default=0, help="arrival times and prompt lengths (default: 0)")
    p.add_argument("--slo-ttft", type=float, default=0.5, help="goodput SLO on TTFT, seconds (default: 0.5)")
    p.add_argument("--slo-itl", type=float, default=0.05,
                   help="goodput SLO on a request's mean inter-token latency, seconds (default: 0.05)")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request limit, seconds (default: 30)")
    p.add_argument("--output", default="requests.jsonl", help="every request as JSON lines (default: %(default)s)")
    p.add_argument("--json", metavar="OUT", help="write the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def register(subparsers) -> None:
    p = subparsers.add_parser("load", help="streaming load generator for OpenAI-compatible servers",
                              description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=main)


def config_from_args(args):
    from ..loadgen import LoadConfig

    return LoadConfig(url=args.url, model=args.model, endpoint=args.endpoint, target_qps=args.target_qps,
                      concurrency=args.concurrency, duration_s=args.duration, num_requests=args.num_requests,
                      prompt_len_min=args.prompt_len_min, prompt_len_max=args.prompt_len_max,
                      max_new_tokens=args.max_new_tokens, seed=args.seed, slo_ttft_s=args.slo_ttft,
                      slo_itl_s=args.slo_itl, timeout_s=args.timeout, ignore_eos=args.ignore_eos)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_records(path: str | Path, records) -> None:
    _write_atomic(Path(path), "".join(json.dumps(r.to_json()) + "\n" for r in records))


def main(args) -> int:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from ..loadgen import run_load, summarize, summary_lines

    cfg = config_from_args(args)
    cfg.validate()
    console = Console(stderr=True)
    bar = None
    if not args.no_progress:
        bar = Progress(TextColumn("load"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                       TimeElapsedColumn(), console=console, transient=True)
        task = bar.add_task("load", total=None, info="")
        bar.start()

    def progress(p) -> None:
        bar.update(task, total=p.planned, completed=p.finished,
                   info=f"sent {p.sent}  ok {p.ok}  failed {p.failed}")

    try:
        result = run_load(cfg, progress if bar is not None else None)
    finally:
        if bar is not None:
            bar.stop()
    write_records(args.output, result.records)
    summary = summarize(result)
    for line in summary_lines(summary):
        print(line)
    print(f"wrote {args.output} ({len(result.records)} requests)")
    if args.json:
        doc = {"config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}, "summary": summary.to_json()}
        _write_atomic(Path(args.json), json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    sys.stdout.flush()
    if result.interrupted:
        return 130
    return 0 if summary.ok > 0 else 1
