"""Attention of fresh prompts: chunks whose keys are their own tokens, through a flash kernel.

A prefill chunk that starts at position 0 (a fresh prompt: no earlier cached blocks) attends
only to the K/V its own iteration just computed. For an iteration whose every chunk is fresh,
the chunk rows ``[R, H, d]`` (``R`` = the chunk bucket, the last ``R - tc`` rows padding) are one
variable-length batch of causal sequences described by cumulative row offsets::

    cu = [0, n_1, n_1 + n_2, ..., tc, R, R, ..., R]      (int32, length max_members + 2)

one sequence per chunk member, then the padding rows as one sequence of their own (their output
is discarded), then empty sequences up to a fixed count, so the tensor's shape, and with it a
CUDA graph of the call, does not depend on the iteration. K/V are read back from the cache at
the rows' slots (the RoPE kernel wrote them there; a gather of ``2 R Hkv d`` values, about 8 MB
at R = 2,048), and the batch runs one call of FlashAttention-2's variable-length kernel
(``torch.ops.aten._flash_attention_forward`` with ``cum_seq_q = cum_seq_k = cu``, causal,
``max_q = max_k = R``, grouped-query heads as they are). The paged FlexAttention kernel stays
for chunks that attend to cached blocks (:mod:`.paged_attention`).

Why: on one H100 the compiled FlexAttention chunk kernel over the paged cache ran a 2,048-token
prompt in 0.268 ms where cuDNN's SDPA took 0.115 ms and flash 0.207 ms on contiguous K/V
(docs/BENCHMARKS.md, "The chunk attention kernel alone").

Off CUDA (the CPU tests) the same call runs :func:`reference`: SDPA with the block-diagonal
causal mask that ``cu`` describes (math, no host sync), the semantics the flash call must match.
``TRACESTORY_FRESH_ATTN=0`` turns the path off (every chunk through FlexAttention: A/B).

Limits: causal prompts from position 0 only; softmax scale ``1/sqrt(d)``; bf16/fp16 on CUDA
(flash's dtypes); a zero-length sequence in ``cu`` relies on the kernel skipping it (checked
against :func:`reference` in float32 by ``benchmarks/gpu/fresh_attn.py`` on an H100, eagerly and
from a CUDA graph: every layout there has empty sequences).
"""

from __future__ import annotations

import os

from .switches import OFF, env_on

ENV = "TRACESTORY_FRESH_ATTN"
MODES = ("auto", "cudnn", "flash")
ON = ("1", "true", "yes", "on")
# the probe's layout: two prompts, padding rows, empty sequences (as the server's buckets have)
PROBE_LENGTHS, PROBE_ROWS, PROBE_COUNT = (100, 60), 256, 5

# what was chosen, once per process (:func:`choose`): kernel, reason, probe error (if any)
info: dict = {}


def enabled() -> bool:
    """The fresh-prompt path is on unless ``TRACESTORY_FRESH_ATTN=0`` (or false/no/off)."""
    return env_on(ENV)


def mode() -> str:
    """``TRACESTORY_FRESH_ATTN`` read as a kernel choice: ``auto`` (unset, 1/true/yes/on: cuDNN where
    its probe passes, else flash), ``cudnn`` (cuDNN or an error), ``flash``, or ``off``; ValueError
    for another value."""
    m = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if m in OFF:
        return "off"
    if m in ON:
        return "auto"
    if m not in MODES:
        raise ValueError(f"{ENV}: expected one of 0, {', '.join(MODES)}, found {m!r}")
    return m


def decide(m: str, problem: str) -> tuple[str, str]:
    """(kernel, reason) for mode ``m`` (:func:`mode`) given the cuDNN probe's ``problem``
    ('' when cuDNN's call matched the reference eagerly and from a CUDA graph). RuntimeError when
    ``cudnn`` was asked for and cannot run."""
    if m == "flash":
        return "flash", f"{ENV}=flash"
    if not problem:
        why = "its variable-length call matched the reference eagerly and replayed from a CUDA graph"
        return "cudnn", (f"{ENV}=cudnn; " if m == "cudnn" else "") + why
    if m == "cudnn":
        raise RuntimeError(f"{ENV}=cudnn, but cuDNN cannot serve fresh prompts: {problem}")
    return "flash", f"cuDNN not used: {problem}"


def choose(heads: int, kv_heads: int, head_dim: int, dtype, device, say=None) -> dict:
    """Pick the fresh path's kernel once per process (later calls return the first choice):
    probe cuDNN on this shape of heads (:func:`probe`) unless ``flash`` was asked for; ``say(line)``
    is told the choice and why. Returns :data:`info`."""
    if info:
        return info
    m = mode()
    if m == "off":
        info.update(kernel="off", reason=f"{ENV}=0: every chunk through FlexAttention")
        return info
    problem = probe(heads, kv_heads, head_dim, dtype, device) if m in ("auto", "cudnn") else ""
    kernel, reason = decide(m, problem)
    info.update(kernel=kernel, reason=reason)
    if say is not None:
        say(f"fresh-prompt attention: {kernel} ({reason})")
    return info


def offsets(lengths, rows: int, count: int):
    """``cu`` (numpy int32, ``count + 1`` entries, module docstring) for chunk members of
    ``lengths`` tokens in a bucket of ``rows`` rows: ``count`` sequences in all (the members, the
    padding rows when there are any, then empty ones). ValueError when they do not fit."""
    import numpy as np

    lengths = [int(n) for n in lengths]
    tc = sum(lengths)
    if tc > rows or any(n < 1 for n in lengths):
        raise ValueError(f"chunk lengths {lengths} do not fit a bucket of {rows} rows")
    need = len(lengths) + (1 if tc < rows else 0)
    if need > count:
        raise ValueError(f"{need} sequences exceed the {count} prepared for")
    cu = np.full(count + 1, rows, dtype=np.int32)
    cu[0] = 0
    cu[1:len(lengths) + 1] = np.cumsum(lengths)
    return cu


def is_fresh(chunks) -> bool:
    """Whether every chunk ``(start, tokens)`` starts at position 0."""
    chunks = list(chunks)
    return bool(chunks) and all(int(start) == 0 for start, _n in chunks)


def attend(q, kc, vc, slots, cu, rows: int):
    """``q`` ``[H, R, d]`` (the chunk rows, padded to ``R = rows``), the layer's caches ``[S, Hkv, d]``
    holding these rows' K/V at ``slots`` ``[R]``, ``cu`` (device int32) -> ``[R, H*d]``; on CUDA
    through the chosen kernel (:func:`run_chosen`), elsewhere :func:`reference`."""
    H, R, d = q.shape
    k, v = kc[slots], vc[slots]                           # [R, Hkv, d]
    qt = q.transpose(0, 1).contiguous()                   # [R, H, d]
    if q.device.type != "cuda":
        return reference(qt, k, v, cu).reshape(R, H * d)
    capturing = _torch().cuda.is_current_stream_capturing()
    return run_chosen(qt, k, v, cu, rows, capturing).reshape(R, H * d)


def run_chosen(q, k, v, cu, rows: int, capturing: bool):
    """``q`` ``[R, H, d]``, ``k, v`` ``[R, Hkv, d]`` through the kernel :func:`choose` picked, chosen
    here on this shape when start-up did not (flash, unprobed, when this first call is inside a
    CUDA graph capture: the probe syncs the host). A cuDNN call that raises outside a capture (a
    shape the probe did not cover) moves the process to flash for good, the reason in :data:`info`;
    inside a capture, or when ``cudnn`` was asked for, the error propagates."""
    if not info:
        if capturing:
            info.update(kernel="flash", reason="first call inside a CUDA graph capture, where the probe cannot run")
        else:
            choose(q.shape[1], k.shape[1], q.shape[2], q.dtype, q.device)
    if info.get("kernel") == "cudnn":
        try:
            return cudnn_call(q, k, v, cu, rows)
        except RuntimeError as e:
            if capturing or mode() == "cudnn":
                raise
            info.update(kernel="flash", reason=f"cuDNN failed at {rows} rows, flash since: {_short(e)}")
    return flash_call(q, k, v, cu, rows)


def flash_call(q, k, v, cu, rows: int):
    """FlashAttention-2's variable-length forward: ``q`` ``[R, H, d]``, ``k, v`` ``[R, Hkv, d]``,
    causal sequences ``cu`` -> ``[R, H, d]``."""
    torch = _torch()
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, rows, rows, 0.0, True, False)[0]


def cudnn_call(q, k, v, cu, rows: int):
    """cuDNN's variable-length (ragged) SDPA through ``aten._cudnn_attention_forward`` with
    ``cum_seq_q = cum_seq_k = cu``: same arguments and result as :func:`flash_call` (grouped-query
    heads as they are, no log-sum-exp)."""
    torch = _torch()
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, rows, rows, False, 0.0, True, False)[0]


def probe(heads: int, kv_heads: int, head_dim: int, dtype, device) -> str:
    """Why cuDNN's call cannot serve this shape of heads ('' when it can): it must exist, run on
    :data:`PROBE_LENGTHS` prompts in :data:`PROBE_ROWS` rows with empty sequences after them, match
    :func:`reference` (float32) within the tolerance of the dtype, and give the same from a CUDA
    graph captured on another layout of those rows. Costs a few ms and one host sync."""
    torch = _torch()
    if str(device).split(":")[0] != "cuda":
        return f"no CUDA device ({device})"
    if not hasattr(torch.ops.aten, "_cudnn_attention_forward"):
        return f"torch {torch.__version__} has no aten._cudnn_attention_forward"
    if not torch.backends.cudnn.is_available():
        return "cuDNN is not available to torch"
    R, count = PROBE_ROWS, PROBE_COUNT
    gen = torch.Generator(device=device).manual_seed(7)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    q, k, v = rnd(R, heads, head_dim), rnd(R, kv_heads, head_dim), rnd(R, kv_heads, head_dim)
    tol = 8 * torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    cu = torch.tensor(offsets(PROBE_LENGTHS, R, count), device=device)
    other = torch.tensor(offsets([R], R, count), device=device)
    try:
        err = _max_err(cudnn_call(q, k, v, cu, R), q, k, v, cu)
        if not err <= tol:
            return f"its result differs from the reference by {err:.3g} (tolerance {tol:.3g})"
        sq, sk, sv, scu = q.clone(), k.clone(), v.clone(), other.clone()
        s = torch.cuda.Stream(device)
        s.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(s):
            cudnn_call(sq, sk, sv, scu, R)
        torch.cuda.current_stream(device).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            so = cudnn_call(sq, sk, sv, scu, R)
        scu.copy_(cu)
        g.replay()
        err = _max_err(so, q, k, v, cu)
        if not err <= tol:
            return f"its CUDA graph replay differs from the reference by {err:.3g} (tolerance {tol:.3g})"
    except Exception as e:  # noqa: BLE001 -- any failure: flash serves, the reason said
        return f"its call failed: {_short(e)}"
    return ""


def _max_err(o, q, k, v, cu) -> float:
    """Largest absolute difference of ``o`` from :func:`reference` in float32 over all rows (the
    padding rows form a causal sequence of their own); NaN when ``o`` holds one."""
    ref = reference(q.float(), k.float(), v.float(), cu)
    return float((o.float() - ref).abs().max().item())


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def reference(q, k, v, cu):
    """SDPA over ``q`` ``[R, H, d]``, ``k, v`` ``[R, Hkv, d]`` with the causal block-diagonal mask of
    ``cu`` (row ``i`` sees row ``j`` when both lie in one sequence and ``j <= i``) -> ``[R, H, d]``."""
    torch = _torch()
    import torch.nn.functional as F

    R, H, d = q.shape
    g = H // k.shape[1]
    idx = torch.arange(R, device=q.device)
    seq = torch.searchsorted(cu.to(torch.int64), idx, right=True)      # sequence of each row
    mask = (seq[:, None] == seq[None, :]) & (idx[None, :] <= idx[:, None])
    kk = k.repeat_interleave(g, dim=1).transpose(0, 1)                  # [H, R, d]
    vv = v.repeat_interleave(g, dim=1).transpose(0, 1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), kk, vv, attn_mask=mask)   # [H, R, d]
    return o.transpose(0, 1)


def _torch():
    import torch

    return torch
