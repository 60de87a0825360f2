"""``tracestory eval <metric>``: model-quality measurements next to the benchmarks.

``eval ppl``: perplexity of local Hugging Face causal-LM checkpoints in several precisions
on WikiText-2 or a text file (formula and limits: :mod:`tracestory.bench.ppl`); FP8 matmul
precisions (``fp8-rowwise``, ``fp8-tensorwise``) are printed and written with their difference
to ``bf16`` on the same checkpoint (``deltas`` in the JSON). A ``--model``
that is not a checkpoint folder, or that transformers cannot load, ends in one line naming it
(exit code 2).
"""

from __future__ import annotations

import argparse

from ..bench import ppl
from ..bench.common import print_table, require_package, write_json
from .. import outputs
from ..errors import UsageError
from .common import refuse_overwrite


def _precisions(text: str) -> list[str]:
    vals = [t.strip() for t in text.split(",") if t.strip()]
    if not vals:
        raise argparse.ArgumentTypeError(f"precisions are {', '.join(ppl.PRECISIONS)}; got {text!r}")
    try:
        return [ppl.precision_name(v) for v in vals]
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_ppl_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", required=True, metavar="PATH",
                   help="local Hugging Face checkpoint folder (repeatable; the first one's tokenizer is used)")
    p.add_argument("--precision", type=_precisions, default=["bf16"], metavar="P[,P...]",
                   help="bf16, fp16, fp32 (or bfloat16, float16, float32); fp8-weight (weights rounded "
                        "through e4m3); fp8-rowwise, fp8-tensorwise (FP8 matmuls, scored beside bf16, which "
                        "is added when missing) (default: bf16)")
    p.add_argument("--input-len", type=int, default=512, help="tokens per chunk (default: 512)")
    p.add_argument("--num-chunks", type=int, default=100, help="at most this many chunks (default: 100)")
    p.add_argument("--dataset", default="wikitext", help="built-in dataset (default: wikitext = WikiText-2 test)")
    p.add_argument("--text-file", metavar="FILE", help="score this text instead of the dataset")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:N (default: auto)")
    p.add_argument("--json", metavar="OUT", help="write results as JSON")


def _run_ppl(args) -> int:
    """With ``--json -`` the JSON is stdout's only content: every printed line goes to stderr."""
    refuse_overwrite([*args.model, *([args.text_file] if args.text_file else [])], ("--json", args.json))
    with outputs.prints_to_stderr(bool(args.json) and outputs.is_stdout(args.json)):
        return _ppl(args)


def _ppl(args) -> int:
    require_package("torch", "tracestory eval ppl", "bench")
    for path in args.model:              # a bad --model ends here, before any text is read
        ppl.check_checkpoint(path)
    total, chunks = ppl.prepare_chunks(args.model[0], text_file=args.text_file, dataset=args.dataset,
                                       input_len=args.input_len, num_chunks=args.num_chunks)
    print(f"{total:,} tokens -> {len(chunks)} chunks of {args.input_len}")

    def show(r: ppl.PplResult) -> None:
        print(f"{r.model} [{r.precision}]: ppl {r.ppl:.4f} over {r.num_chunks} chunks", flush=True)

    precisions = ppl.with_baseline(args.precision)
    results = ppl.run_ppl(args.model, precisions, chunks, device=args.device, on_result=show)
    diff = {(d["model"], d["precision"]): d for d in ppl.deltas(results)}

    def delta(r) -> str:
        d = diff.get((r.model, r.precision))
        return f"{d['delta']:+.4f} ({100 * (d['ratio'] - 1):+.2f}%)" if d else "-"

    print_table(["model", "precision", "chunks", "tokens scored", "ppl", "vs bf16"],
                [[r.model, r.precision, r.num_chunks, r.tokens_scored, f"{r.ppl:.4f}", delta(r)] for r in results])
    write_json(args.json, {"eval": "ppl", "results": results, "deltas": list(diff.values())})
    return 0


def register(subparsers) -> None:
    ev = subparsers.add_parser("eval", help="model quality: perplexity per precision",
                               description="Model-quality measurements next to the benchmarks.")
    sub = ev.add_subparsers(dest="eval", required=True, metavar="METRIC")
    p = sub.add_parser("ppl", help="perplexity of Hugging Face checkpoints per precision",
                       description="Perplexity: log-softmax NLL at the next token, mean and exp per "
                                   "chunk, geometric mean over non-overlapping chunks.")
    add_ppl_arguments(p)
    p.set_defaults(func=_run_ppl)
