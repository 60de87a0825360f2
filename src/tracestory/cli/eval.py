"""``tracestory eval <metric>``: model-quality measurements next to the benchmarks.

``eval ppl``: perplexity of local Hugging Face causal-LM checkpoints in several precisions
on WikiText-2 or a text file (formula and limits: :mod:`tracestory.bench.ppl`).
"""

from __future__ import annotations

import argparse


def _precisions(text: str) -> list[str]:
    from ..bench.ppl import PRECISIONS

    vals = [t.strip() for t in text.split(",") if t.strip()]
    bad = [v for v in vals if v not in PRECISIONS]
    if bad or not vals:
        raise argparse.ArgumentTypeError(f"precisions are {', '.join(PRECISIONS)}; got {text!r}")
    return vals


def add_ppl_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", required=True, metavar="PATH",
                   help="local Hugging Face checkpoint folder (repeatable; the first one's tokenizer is used)")
    p.add_argument("--precision", type=_precisions, default=["bf16"], metavar="P[,P...]",
                   help="bf16, fp16, fp32, fp8-weight (default: bf16)")
    p.add_argument("--input-len", type=int, default=512, help="tokens per chunk (default: 512)")
    p.add_argument("--num-chunks", type=int, default=100, help="at most this many chunks (default: 100)")
    p.add_argument("--dataset", default="wikitext", help="built-in dataset (default: wikitext = WikiText-2 test)")
    p.add_argument("--text-file", metavar="FILE", help="score this text instead of the dataset")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:N")
    p.add_argument("--json", metavar="OUT", help="write results as JSON")


def _run_ppl(args) -> int:
    from ..bench.ppl import run

    return run(args)


def register(subparsers) -> None:
    ev = subparsers.add_parser("eval", help="model quality: perplexity per precision",
                               description=__doc__.split("\n\n")[0])
    sub = ev.add_subparsers(dest="eval", required=True, metavar="METRIC")
    p = sub.add_parser("ppl", help="perplexity (seed 002's formula) of HF checkpoints per precision",
                       description="Perplexity: log-softmax NLL at the next token, mean and exp per "
                                   "chunk, geometric mean over non-overlapping chunks.")
    add_ppl_arguments(p)
    p.set_defaults(func=_run_ppl)
