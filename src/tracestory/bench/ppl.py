"""Perplexity of a causal LM (``tracestory eval ppl``), with seed 002's formula.

Formula, per chunk of ``L`` token ids ``t_0 .. t_{L-1}`` and the model's logits ``z [L, V]``
(position ``i`` predicts token ``i + 1``)::

    nll_i  = -log_softmax(z_i)[t_{i+1}]          for i = 0 .. L-2   (in fp32)
    ppl    = exp(mean_i nll_i)
    overall = exp(mean_c log ppl_c)               (geometric mean over chunks)

Chunks are non-overlapping windows of ``--input-len`` tokens taken from the start of the
tokenized text; a remainder shorter than ``input_len`` is dropped and at most
``--num-chunks`` are used, so every precision is scored on the same tokens.

Text: WikiText-2 raw test split through ``datasets`` (non-empty lines joined by newlines) when
that package and the network are reachable, else ``--text-file``. Model: a local Hugging Face
checkpoint (``transformers``, imported lazily). Precision variants: ``bf16``, ``fp16``, ``fp32``
(load dtype) and ``fp8-weight`` (bf16 model whose Linear weights are rounded through row-wise
e4m3 and back: the accuracy cost of FP8 weight storage, not FP8 speed).

Limits: no sliding window (each chunk starts without context, as in seed 002), and
geometric-mean-of-chunk-ppl differs slightly from exp of the token-weighted mean NLL when
chunks differ in length (they do not here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ToolNotFound, UsageError

PRECISIONS = ("bf16", "fp16", "fp32", "fp8-weight")


@dataclass(frozen=True)
class PplResult:
    model: str
    precision: str
    input_len: int
    num_chunks: int
    tokens_scored: int                 # num_chunks * (input_len - 1)
    per_chunk_ppl: tuple[float, ...]
    ppl: float                         # geometric mean of per_chunk_ppl


def make_chunks(ids: Sequence[int], input_len: int, num_chunks: int | None) -> list[list[int]]:
    """Non-overlapping windows of ``input_len`` ids from the start; remainder dropped."""
    if input_len < 2:
        raise UsageError(f"--input-len must be >= 2 (one predicted token), got {input_len}")
    n = len(ids) // input_len
    if num_chunks is not None:
        n = min(n, num_chunks)
    return [list(ids[i * input_len:(i + 1) * input_len]) for i in range(n)]


def chunk_ppl(logits, ids) -> float:
    """Seed 002's per-chunk perplexity from ``logits [L, V]`` and ``ids [L]``."""
    import torch

    ids = torch.as_tensor(ids, device=logits.device).long()
    nlls = -torch.log_softmax(logits[:-1].float(), dim=-1)
    return float(nlls.gather(-1, ids[1:].unsqueeze(-1)).mean().exp())


def geometric_mean(values: Sequence[float]) -> float:
    if not values:
        raise UsageError("no chunk to score: the text is shorter than --input-len tokens")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def evaluate(model, chunks: list[list[int]], *, name: str = "model", precision: str = "-") -> PplResult:
    """Score each chunk with ``model(input_ids=[1, L]).logits`` and combine (module docstring)."""
    import torch

    if not chunks:
        raise UsageError("no chunk to score: the text is shorter than --input-len tokens")
    device = next(model.parameters()).device
    ppls = []
    with torch.no_grad():
        for c in chunks:
            logits = model(input_ids=torch.tensor([c], device=device)).logits[0]
            ppls.append(chunk_ppl(logits, c))
    L = len(chunks[0])
    return PplResult(name, precision, L, len(chunks), len(chunks) * (L - 1), tuple(ppls), geometric_mean(ppls))


def fake_quant_fp8_weights(model) -> int:
    """Round every ``nn.Linear`` weight through row-wise e4m3 and back (in place); returns the
    number of layers changed."""
    import torch

    from .fp8 import dequantize, ref_quantize_per_row

    n = 0
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear):
                q, s = ref_quantize_per_row(mod.weight)
                mod.weight.copy_(dequantize(q, s).to(mod.weight.dtype))
                n += 1
    return n


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ToolNotFound("transformers", "pip install transformers (needed to load a Hugging Face checkpoint)") from None
    return transformers


def load_model(path: str, precision: str, device: str):
    import torch

    tf = _transformers()
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
             "fp8-weight": torch.bfloat16}[precision]
    if not Path(path).exists():
        raise UsageError(f"{path}: expected a local Hugging Face checkpoint folder, found nothing there")
    model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    if precision == "fp8-weight":
        fake_quant_fp8_weights(model)
    return model


def load_text(text_file: str | None, dataset: str) -> str:
    if text_file:
        p = Path(text_file)
        if not p.is_file():
            raise UsageError(f"{text_file}: expected a text file, found none")
        return p.read_text(encoding="utf-8")
    if dataset != "wikitext":
        raise UsageError(f"--dataset {dataset!r}: only 'wikitext' is built in; use --text-file")
    try:
        import datasets

        ds = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split="test")
    except Exception as e:  # not installed, or no network
        raise UsageError(f"WikiText-2 is not reachable ({type(e).__name__}: {e}); pass --text-file") from None
    return "\n".join(line for line in ds["text"] if line.strip())


def tokenize(path: str, text: str) -> list[int]:
    tf = _transformers()
    tok = tf.AutoTokenizer.from_pretrained(path)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def run(args) -> int:
    """``tracestory eval ppl``: prints one line per (model, precision) and a table."""
    import torch

    from .common import print_table, write_json

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    text = load_text(args.text_file, args.dataset)
    ids = tokenize(args.model[0], text)   # one tokenizer for all: same chunks for every variant
    chunks = make_chunks(ids, args.input_len, args.num_chunks)
    print(f"{len(ids):,} tokens -> {len(chunks)} chunks of {args.input_len}")
    results = []
    for path in args.model:
        for prec in args.precision:
            model = load_model(path, prec, device)
            r = evaluate(model, chunks, name=path, precision=prec)
            results.append(r)
            print(f"{path} [{prec}]: ppl {r.ppl:.4f} over {r.num_chunks} chunks", flush=True)
            del model
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    print_table(["model", "precision", "chunks", "tokens scored", "ppl"],
                [[r.model, r.precision, r.num_chunks, r.tokens_scored, f"{r.ppl:.4f}"] for r in results])
    write_json(args.json, {"eval": "ppl", "results": results})
    return 0
