"""Perplexity of a causal LM (``tracestory eval ppl``).

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
(load dtype); ``fp8-weight`` (bf16 model whose Linear weights are rounded through row-wise
e4m3 and back: the accuracy cost of FP8 weight storage, not FP8 speed); ``fp8-rowwise`` and
``fp8-tensorwise`` (bf16 model whose ``nn.Linear`` layers, all but the output head ``lm_head``,
run through :mod:`tracestory.models.fp8`: weights quantised once, activations per row or per
tensor at every call, a real ``torch._scaled_mm`` FP8 matmul, the same path as ``bench llama
--fp8``). FP8 precisions are scored beside ``bf16`` of the same checkpoint (added when not
asked for), and :func:`deltas` gives ``ppl(fp8) - ppl(bf16)`` and its ratio.

Checkpoints: every ``--model`` must be a local folder with a ``config.json`` (checked before
any text is read); a folder transformers cannot load is reported as one error naming it.

Limits: no sliding window (each chunk starts without context), and
geometric-mean-of-chunk-ppl differs slightly from exp of the token-weighted mean NLL when
chunks differ in length (they do not here).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ToolNotFound, UsageError
from ..models.runtime import dtype_name
from .fp8 import dequantize, ref_quantize_per_row
from .support import require, sm_version

PRECISIONS = ("bf16", "fp16", "fp32", "fp8-weight", "fp8-rowwise", "fp8-tensorwise")
FP8_MATMUL = {"fp8-rowwise": "rowwise", "fp8-tensorwise": "tensorwise"}   # precision -> models.fp8 mode


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
    """Per-chunk perplexity (module docstring) from ``logits [L, V]`` and ``ids [L]``."""
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


def precision_name(text: str) -> str:
    """``fp8-weight`` or a dtype in either spelling (``bf16`` or ``bfloat16``, ...), as its short name."""
    t = text.strip().lower()
    if t == "fp8-weight" or t in FP8_MATMUL:
        return t
    try:
        return dtype_name(t)
    except ValueError:
        raise UsageError(f"unknown precision {text!r}: expected one of {', '.join(PRECISIONS)} "
                         "(or bfloat16, float16, float32)") from None


def check_checkpoint(path: str) -> None:
    """A local Hugging Face checkpoint folder: a directory holding ``config.json``."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{path}: expected a local Hugging Face checkpoint folder, found nothing there")
    if not p.is_dir():
        raise UsageError(f"{path}: expected a local Hugging Face checkpoint folder, found a file")
    if not (p / "config.json").is_file():
        raise UsageError(f"{path}: expected a Hugging Face checkpoint folder with config.json, found none in it")


def _loading(path: str, what: str, load):
    """Run ``load()``; a checkpoint transformers cannot read becomes one error naming it."""
    try:
        return load()
    except (OSError, ValueError, KeyError, TypeError) as e:
        first = str(e).strip().splitlines()[0].rstrip(" :") if str(e).strip() else type(e).__name__
        raise UsageError(f"{path}: expected a loadable Hugging Face {what}, found {type(e).__name__}: {first}") from None


def load_model(path: str, precision: str, device: str):
    import torch

    tf = _transformers()
    precision = precision_name(precision)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}.get(precision, torch.bfloat16)
    check_checkpoint(path)
    if precision in FP8_MATMUL and str(device).startswith("cuda"):
        require("fp8", sm_version(tuple(torch.cuda.get_device_capability(torch.device(device)))))
    model = _loading(path, "causal LM", lambda: tf.AutoModelForCausalLM.from_pretrained(path, dtype=dtype))
    model = model.to(device).eval()
    if precision == "fp8-weight":
        fake_quant_fp8_weights(model)
    elif precision in FP8_MATMUL:
        from ..models import llama  # torch modules; models.fp8 is reached through it

        llama.fp8.quantize_linears(model, FP8_MATMUL[precision])
    return model


def with_baseline(precisions: Sequence[str]) -> list[str]:
    """The precisions to score: ``bf16`` first when an FP8 matmul precision is asked without it."""
    names = [precision_name(p) for p in precisions]
    if any(p in FP8_MATMUL for p in names) and "bf16" not in names:
        names.insert(0, "bf16")
    return names


def deltas(results: Sequence[PplResult]) -> list[dict]:
    """For every FP8 result: its perplexity beside ``bf16`` of the same checkpoint,
    ``delta = ppl - ppl_bf16`` and ``ratio = ppl / ppl_bf16``."""
    base = {r.model: r.ppl for r in results if r.precision == "bf16"}
    return [{"model": r.model, "precision": r.precision, "ppl": r.ppl, "bf16_ppl": base[r.model],
             "delta": r.ppl - base[r.model], "ratio": r.ppl / base[r.model]}
            for r in results if r.precision.startswith("fp8") and r.model in base]


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
    check_checkpoint(path)
    tok = _loading(path, "tokenizer", lambda: tf.AutoTokenizer.from_pretrained(path))
    return list(tok(text, add_special_tokens=False)["input_ids"])


def prepare_chunks(tokenizer_path: str, *, text_file: str | None, dataset: str = "wikitext",
                   input_len: int = 512, num_chunks: int | None = 100) -> tuple[int, list[list[int]]]:
    """``(tokens in the text, chunks)``: the text tokenized once with ``tokenizer_path``'s
    tokenizer, so every model and precision is scored on the same chunks."""
    check_checkpoint(tokenizer_path)
    ids = tokenize(tokenizer_path, load_text(text_file, dataset))
    return len(ids), make_chunks(ids, input_len, num_chunks)


def run_ppl(models: Sequence[str], precisions: Sequence[str], chunks: list[list[int]], *, device: str = "auto",
            on_result: Callable[[PplResult], None] | None = None) -> list[PplResult]:
    """Perplexity of every (model, precision) on ``chunks``; each model is loaded and freed in turn."""
    import torch

    for path in models:                  # every path checked before the first (slow) load
        check_checkpoint(path)
    precisions = [precision_name(p) for p in precisions]
    device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    results = []
    for path in models:
        for prec in precisions:
            model = load_model(path, prec, device)
            r = evaluate(model, chunks, name=path, precision=prec)
            results.append(r)
            if on_result is not None:
                on_result(r)
            del model
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return results
