"""What work the trace shows: the workload kind, what the program already uses, and the evidence
for each conclusion. ``unknown`` is a first-class answer.

A recommendation is a claim about a program; it is only true where the program is of the kind the
advice was written for. This module reads the names in the trace (CPU ops, CPU-side ranges,
kernels) and the op shapes, and returns a :class:`Workload`: the kind, and the *signals* it rests
on, each with the name that shows it (``"conv": "aten::cudnn_convolution"``). Rules read the
signals as preconditions (:mod:`tracestory.analysis.claims`).

Signals (names are matched case-insensitively; each signal keeps the first name that showed it):

* layers: ``conv`` (2-D/3-D convolution ops or kernels: ``aten::conv2d``, cuDNN/MIOpen
  ``fprop``/``dgrad``/``wgrad``/``winograd``/implicit-GEMM kernels), ``conv1d``, ``batch_norm``,
  ``group_norm``, ``layer_norm``, ``pooling``, ``upsample``, ``embedding``, ``embedding_bag``
  (``aten::embedding_bag``, FBGEMM table-batched embedding kernels), ``stft`` (``aten::stft``); a
  ``conv1d`` whose recorded weights all have kernel size 1 is a per-position linear layer, not a
  convolution front end, and counts as neither;
* attention: ``attention`` (fused attention ops or kernels of the attention category),
  ``unfused_attention`` (a softmax between batched GEMMs: :mod:`tracestory.analysis.kernels`),
  ``causal`` (an attention op recorded with a causal mask, or a serving engine);
* decoder-LLM building blocks, split by whether they already run fused: ``rms_norm_fused``
  (an RMSNorm kernel or op such as ``fused_add_rms_norm``) / ``rms_norm_unfused`` (``aten::pow``,
  ``aten::mean`` and ``aten::rsqrt`` ops: the decomposed RMSNorm of eager Hugging Face models);
  ``gated_act_fused`` (``silu_and_mul``, ``act_and_mul``) / ``gated_act_unfused`` (``aten::silu``
  beside ``aten::mul``); ``rope_fused`` (a rotary-embedding kernel or op) / ``rope_unfused``
  (``aten::cos``, ``aten::sin``, ``aten::neg`` and ``aten::cat``: rotate-half in eager code);
* the KV cache: ``paged_kv`` (paged-attention or cache-write kernels of serving engines),
  ``split_kv`` (split-KV / flash-decoding attention kernels);
* shapes: ``decode_shapes`` (most GEMM ops (``aten::linear``/``mm``/``addmm``/``matmul``) have at
  most 16 rows: one token per sequence), ``prefill_shapes`` (GEMMs of >= 128 rows next to causal
  attention), and range names: ``decode_ranges`` (``decode``, ``step[DECODE``, vLLM's
  ``execute_context_0(..)_generation_N``), ``prefill_ranges`` (``prefill``, ``step[EXTEND``,
  ``execute_context_N(..)_generation_0``); ``decode_kernels``, where a trace has kernel names only
  (no CPU ops: a kernel summary, an nsys trace without PyTorch ops) and no convolution: split-KV
  attention kernels beside matrix-vector GEMM kernels (``gemv``), one-token decoding over a cache.

Kind (first that holds):

* ``llm_training`` / ``llm_serving`` / ``llm_generate`` / ``llm_decode`` / ``llm_prefill``: at least
  two decoder-LLM signals (RMSNorm, gated activation, rotary embedding, causal attention, paged KV,
  a serving engine, decode shapes or ranges), or decode kernels alone, and no CNN layers; then
  training if the producer saw a backward pass or an optimizer; a serving engine with both prefill
  and decode work, or with neither told apart, is ``llm_serving``; decode and prefill in one trace
  ``llm_generate``; else decode by shapes and ranges, or ``llm_prefill`` (a forward over whole
  sequences);
* ``recommender`` (checked first, except in a serving engine): embedding bags; ``diffusion``: group
  norm with convolutions and attention or upsampling (a UNet or VAE); ``speech``: ``aten::stft``,
  or 1-D convolutions with attention;
* ``vision``: 2-D convolutions with batch norm or pooling (a CNN), or convolutions with attention
  and layer norm (a ViT's patch embedding);
* ``transformer``: attention with layer norm and no decoder-LLM signal (encoder inference such as
  BERT);
* ``ml_other``: a PyTorch program with GEMM or convolution work and none of the above;
* ``non_ml``: a program without PyTorch whose kernels include no GEMM, convolution or attention
  library kernel;
* ``unknown``: anything else, or fewer than :data:`MIN_KERNELS` kernels with no CPU ops.

Limits: names and shapes only, no timing. A model written with custom kernels under other names is
``ml_other`` or ``unknown``, never guessed; a decoder LLM that runs only fused kernels of unknown names
shows fewer signals. Python stack frames and ``nn.Module`` names are not read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..ingest.kineto import parse_json_field
from ..trace import Trace
from ..units import fmt_pct, short_name
from .gemm_rows import gemm_rows
from .producer import Producer

WORKLOADS = (
    "llm_decode",
    "llm_prefill",
    "llm_generate",
    "llm_serving",
    "llm_training",
    "transformer",
    "vision",
    "diffusion",
    "recommender",
    "speech",
    "ml_other",
    "non_ml",
    "unknown",
)
LLM = frozenset({"llm_decode", "llm_prefill", "llm_generate", "llm_serving", "llm_training"})
DECODING = frozenset({"llm_decode", "llm_generate", "llm_serving"})
MIN_KERNELS = 10
DECODE_ROWS = 16
PREFILL_ROWS = 128

_I = re.IGNORECASE
# signal -> (pattern on CPU op and range names, pattern on kernel names); None: not read there
_NAME_SIGNALS: dict[str, tuple[re.Pattern | None, re.Pattern | None]] = {
    "conv": (
        re.compile(
            r"^aten::(conv[23]d|conv_transpose[23]d|cudnn_convolution|miopen_convolution|"
            r"mkldnn_convolution|_convolution$|convolution$)",
            _I,
        ),
        re.compile(
            r"convolv|winograd|fprop|dgrad|wgrad|implicit_?gemm|conv2d|conv_fwd|naive_conv|"
            r"igemm_fwd|ConvolutionForward",
            _I,
        ),
    ),
    "conv1d": (re.compile(r"^aten::conv1d$"), None),
    "batch_norm": (
        re.compile(
            r"^aten::(batch_norm|cudnn_batch_norm|native_batch_norm|miopen_batch_norm|"
            r"_batch_norm_impl_index)",
            _I,
        ),
        re.compile(r"bn_fw|bn_bw|batch_?norm", _I),
    ),
    "group_norm": (re.compile(r"^aten::(group_norm|native_group_norm)", _I), re.compile(r"group_?norm", _I)),
    "layer_norm": (re.compile(r"^aten::(layer_norm|native_layer_norm)", _I), re.compile(r"layer_?norm", _I)),
    "pooling": (
        re.compile(r"^aten::(max_pool[123]d|avg_pool[123]d|adaptive_(avg|max)_pool[123]d)", _I),
        re.compile(r"max_pool|avg_pool|pooling_fw|AdaptiveAvg|AdaptiveMax", _I),
    ),
    "upsample": (re.compile(r"^aten::upsample_", _I), re.compile(r"upsample", _I)),
    "embedding": (re.compile(r"^aten::embedding$"), None),
    "embedding_bag": (
        re.compile(r"^aten::_?embedding_bag|^fbgemm::.*embedding|torchrec", _I),
        re.compile(r"embedding_bag|split_embedding|batched_embedding", _I),
    ),
    "stft": (re.compile(r"^aten::stft$"), None),
    "attention": (
        re.compile(
            r"^aten::(scaled_dot_product_attention|_scaled_dot_product_\w+|_flash_attention_\w+|"
            r"_efficient_attention_\w+)|unified_attention|^vllm::.*attention|flash_attn",
            _I,
        ),
        None,
    ),
    "rms_norm_fused": (
        re.compile(r"rms_?norm", _I),
        re.compile(r"rms_?norm|^triton_\w*(pow\w*mean|mean\w*pow)\w*rsqrt", _I),
    ),
    "gated_act_fused": (
        re.compile(r"silu_and_mul|act_and_mul|gelu_and_mul|swiglu", _I),
        re.compile(r"silu_and_mul|act_and_mul|gelu_and_mul|swiglu|^triton_\w*(mul\w*silu|silu\w*mul)", _I),
    ),
    "rope_fused": (re.compile(r"rotary|_rope|rope_", _I), re.compile(r"rotary|_rope|rope_", _I)),
    "paged_kv": (
        re.compile(r"reshape_and_cache|paged_attention|store_kvcache", _I),
        re.compile(
            r"paged_attention|reshape_and_cache|store_kvcache|BatchDecodeWithPaged|"
            r"_copy_page_indices|PagedAttention",
            _I,
        ),
    ),
    "split_kv": (
        None,
        re.compile(
            r"splitkv|split_kv|flash_?decoding|ll4mi_reduce|paged_attention_v2|"
            r"flex_decoding|combine_kernel",
            _I,
        ),
    ),
    "decode_ranges": (re.compile(r"\bdecode(?!r)|step\[DECODE|execute_(\d+_)?context_0\b|_generation_[1-9]", _I), None),
    "prefill_ranges": (re.compile(r"\bprefill|step\[(EXTEND|PREFILL)|execute_(\d+_)?context_[1-9]", _I), None),
}
_CONV_2D_OP = re.compile(r"^aten::(conv[23]d|conv_transpose[23]d)$")
_GEMM_KERNEL = re.compile(r"gemm|nvjet|cutlass|xmma|Cijk_|cublas|hipblaslt", _I)
_GEMV_KERNEL = re.compile(r"gemv", _I)  # cuBLAS gemv/gemvx/gemv2T: one-row products
_ATTENTION_KERNEL = re.compile(r"flash|fmha|attention|attn", _I)
_DECODER_BLOCKS = ("rms_norm", "gated_act", "rope", "causal", "paged_kv", "engine")
_BLOCK_WORDS = {
    "rms_norm": "RMSNorm",
    "gated_act": "gated activation",
    "rope": "rotary embedding",
    "causal": "causal attention",
    "paged_kv": "paged KV cache",
    "engine": "a serving engine",
}


@dataclass(frozen=True)
class Workload:
    """The workload kind and the signals behind it (see the module docstring)."""

    kind: str  # one of WORKLOADS
    evidence: tuple[str, ...]  # why this kind, one short phrase each
    signals: tuple[tuple[str, str], ...]  # (signal, the name that showed it)
    gemm_ops: int = 0  # GEMM ops with a recorded input shape
    small_gemm_share: float | None = None  # share of them with <= DECODE_ROWS rows

    def has(self, *signals: str) -> bool:
        """Whether any of ``signals`` was seen."""
        names = {s for s, _ in self.signals}
        return any(s in names for s in signals)

    def shown_by(self, signal: str) -> str | None:
        return next((n for s, n in self.signals if s == signal), None)

    @property
    def is_llm(self) -> bool:
        return self.kind in LLM

    @property
    def decodes(self) -> bool:
        """The trace holds LLM decode work (one new token per sequence per step)."""
        return self.kind in DECODING

    def __repr__(self) -> str:
        return f"Workload({self.kind}, {len(self.signals)} signals)"


def _unique_names(trace: Trace, codes: np.ndarray) -> list[str]:
    return [trace.strings[int(c)] for c in np.unique(codes) if c >= 0]


def _pointwise_conv1d(trace: Trace) -> bool:
    """Every ``aten::conv1d`` whose weight shape was recorded has kernel size 1 (and one was)."""
    code = trace.code_of("aten::conv1d")
    if code < 0 or "input_dims" not in trace.ops:
        return False
    sizes = set()
    for cell in set(trace.ops["input_dims"][trace.ops["name"] == code].tolist()):
        dims = parse_json_field(cell) if isinstance(cell, (bytes, bytearray)) else None
        if isinstance(dims, list) and len(dims) > 1 and isinstance(dims[1], list) and len(dims[1]) == 3:
            sizes.add(dims[1][2])
    return sizes == {1}


def _signals(
    trace: Trace, producer: Producer, attention_kernels: bool, rows: np.ndarray, unfused: tuple[str, ...]
) -> dict[str, str]:
    ops = _unique_names(trace, trace.ops["name"])
    ranges = _unique_names(trace, trace.ranges["name"])
    kernels = _unique_names(trace, trace.kernels["name"])
    found: dict[str, str] = {}

    def first(names: Iterable[str], pattern: re.Pattern | None) -> str | None:
        return next((n for n in names if pattern.search(n)), None) if pattern is not None else None

    not_attention = [k for k in kernels if not _ATTENTION_KERNEL.search(k)]
    for signal, (cpu_pat, kernel_pat) in _NAME_SIGNALS.items():
        hit = first(ops if signal not in ("decode_ranges", "prefill_ranges") else ranges, cpu_pat) or first(
            not_attention if signal == "conv" else kernels, kernel_pat
        )
        if hit:
            found[signal] = hit[:80]
    opset = set(ops)
    if "conv1d" in found:
        if not any(_CONV_2D_OP.match(n) for n in ops):
            found.pop("conv", None)  # 1-D convolutions run through the generic convolution ops and 2-D kernels
        if _pointwise_conv1d(trace):
            found.pop("conv1d")  # kernel size 1 everywhere: a per-position linear layer, not an audio front end
    if "attention" not in found and attention_kernels:
        hit = first(kernels, _ATTENTION_KERNEL)
        if hit:
            found["attention"] = hit[:80]
    if unfused:
        found["unfused_attention"] = unfused[0][:80]
    if "rms_norm_fused" not in found and {"aten::pow", "aten::mean", "aten::rsqrt"} <= opset:
        found["rms_norm_unfused"] = "aten::pow + aten::mean + aten::rsqrt"
    if "gated_act_fused" not in found and "aten::silu" in opset and "aten::mul" in opset:
        found["gated_act_unfused"] = "aten::silu beside aten::mul"
    if "rope_fused" not in found and {"aten::cos", "aten::sin", "aten::neg", "aten::cat"} <= opset:
        found["rope_unfused"] = "aten::cos, aten::sin, aten::neg, aten::cat"
    causal = trace.ops["causal"] if "causal" in trace.ops else np.zeros(0)
    if len(causal) and (causal >= 1).any():
        found["causal"] = "an attention op recorded with a causal mask"
        found["causal_op"] = found["causal"]
    elif producer.engine:
        found["causal"] = f"a {producer.engine} serving engine (decoder models)"
    if producer.engine:
        found["engine"] = producer.engine
    if rows.size >= 4:
        small = float((rows <= DECODE_ROWS).mean())
        if small >= 0.5:
            found["decode_shapes"] = (
                f"one-token decode steps: {fmt_pct(small)} of {rows.size} GEMM ops have <= {DECODE_ROWS} rows"
            )
        if (rows >= PREFILL_ROWS).any() and (found.get("causal") or found.get("prefill_ranges")):
            found["prefill_shapes"] = f"GEMM ops of up to {int(rows.max())} rows"
    gemm = first(kernels, _GEMM_KERNEL)
    if gemm:
        found["gemm_kernels"] = gemm[:80]
    gemv = first(kernels, _GEMV_KERNEL)
    if gemv and "split_kv" in found and "conv" not in found and not ops:
        found["decode_kernels"] = (
            f"kernel names only: split-KV attention ({short_name(found['split_kv'])}) with matrix-vector GEMMs "
            f"({short_name(gemv)})"
        )
    return found


def _llm_kind(s: dict[str, str], producer: Producer) -> str:
    if producer.mode == "training":
        return "llm_training"
    decode = "decode_shapes" in s or "decode_ranges" in s or "split_kv" in s
    prefill = "prefill_shapes" in s or "prefill_ranges" in s
    if producer.engine and decode == prefill:
        return "llm_serving"  # an engine's batched steps: both kinds of work, or neither told apart
    if decode and prefill:
        return "llm_generate"
    if decode:
        return "llm_decode"
    return "llm_prefill"  # a forward over whole sequences, no one-token steps


def classify_workload(
    trace: Trace,
    producer: Producer,
    attention_kernels: bool = False,
    unfused_attention: tuple[str, ...] = (),
    serving_log: str | None = None,
) -> Workload:
    """The :class:`Workload` of one trace. ``attention_kernels``: kernels of the attention category
    ran (from the classification); ``unfused_attention``: the evidence of attention run as bmm +
    softmax ops (:func:`tracestory.analysis.kernels.unfused_attention`); ``serving_log``: the
    LLM serving engine's scheduler event log given with the trace (its engine and model, as a
    phrase), which names the workload when the trace's own names do not (graph replays hide the
    ops)."""
    rows = gemm_rows(trace)[1]
    s = _signals(trace, producer, attention_kernels, rows, unfused_attention)
    if serving_log:
        s["serving_log"] = serving_log
    has = s.__contains__
    blocks = {
        b: s.get(f"{b}_fused") or s.get(f"{b}_unfused") or s.get(b)
        for b in _DECODER_BLOCKS
        if s.get(f"{b}_fused") or s.get(f"{b}_unfused") or s.get(b)
    }
    decode = has("decode_shapes") or has("decode_ranges") or has("decode_kernels")
    cnn = has("conv") and (has("batch_norm") or has("group_norm") or has("pooling"))
    evidence: list[str] = []
    kind = "unknown"
    if has("embedding_bag") and not producer.engine:
        kind, evidence = "recommender", [f"embedding bags ({s['embedding_bag']})"]
    elif has("stft") or (has("conv1d") and not has("conv") and (has("attention") or has("unfused_attention"))):
        kind, evidence = (
            "speech",
            [f"audio front end ({s.get('stft') or s.get('conv1d')})" + (" with a decoder" if decode else "")],
        )
    elif has("serving_log") and not cnn:
        kind, evidence = "llm_serving", [f"a serving engine's scheduler log given with the trace ({s['serving_log']})"]
    elif producer.engine or (
        not cnn and (len(blocks) >= 2 or (blocks and decode) or has("causal_op") or has("decode_kernels"))
    ):
        kind = _llm_kind(s, producer)
        words = [_BLOCK_WORDS[b] + (" (decomposed)" if s.get(f"{b}_unfused") else "") for b in blocks]
        told = ["decoder-LLM blocks: " + ", ".join(words)] if words else []
        if decode:
            told.append(s.get("decode_shapes") or s.get("decode_kernels") or "decode ranges")
        evidence.append("; ".join(told))
    elif has("group_norm") and has("conv") and (has("attention") or has("unfused_attention") or has("upsample")):
        kind = "diffusion"
        evidence = [
            f"group norm ({s['group_norm']}) with convolutions ({s['conv']})"
            + (" and attention" if has("attention") or has("unfused_attention") else " and upsampling")
        ]
    elif has("conv") and (has("batch_norm") or has("pooling")):
        kind = "vision"
        evidence = [
            f"convolutions ({s['conv']}) with "
            + (f"batch norm ({s['batch_norm']})" if has("batch_norm") else f"pooling ({s['pooling']})")
        ]
    elif has("conv") and (has("attention") or has("unfused_attention")) and has("layer_norm"):
        kind, evidence = "vision", [f"convolutions ({s['conv']}) with attention and layer norm (a vision transformer)"]
    elif (has("attention") or has("unfused_attention")) and has("layer_norm"):
        kind, evidence = (
            "transformer",
            [f"attention ({s.get('attention') or s['unfused_attention']}) with layer norm and no decoder-LLM block"],
        )
    elif producer.is_pytorch and len(trace.kernels) >= MIN_KERNELS:
        kind, evidence = "ml_other", ["a PyTorch program whose ops name no model family"]
    elif (
        producer.framework == "none"
        and not (has("gemm_kernels") or has("conv") or has("attention"))
        and len(trace.kernels)
    ):
        kind, evidence = "non_ml", ["no PyTorch, and no GEMM, convolution or attention library kernel"]
    elif has("conv") and len(trace.kernels) >= MIN_KERNELS:
        kind, evidence = "vision", [f"convolution kernels ({s['conv']})"]
    if kind == "unknown":
        evidence = [f"{len(trace.kernels)} kernels and {len(trace.ops)} CPU ops: not enough names to tell the workload"]
    small = float((rows <= DECODE_ROWS).mean()) if rows.size else None
    return Workload(kind, tuple(evidence), tuple(sorted(s.items())), int(rows.size), small)
