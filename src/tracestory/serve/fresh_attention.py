"""Attention of fresh prompts: chunks whose keys are their own tokens, through one
variable-length kernel call (cuDNN's where prepared, else flash's).

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
against :func:`reference` in float32 on an H100, eagerly and from a CUDA graph, by
``benchmarks/gpu/fresh_attn.py`` for flash and ``benchmarks/gpu/cudnn_fe_attn.py`` for cuDNN:
every layout there has empty sequences); the cuDNN graphs are process-wide, by shape.

The kernel: cuDNN where it was prepared, else flash. :func:`prepare` (called by the model's
``prepare()`` for the CUDA-graph buckets) builds one cuDNN graph per chunk bucket through cuDNN's
frontend (:mod:`.fresh_cudnn`: ``nvidia-cudnn-frontend``, imported lazily) for the bucket's
sequence count, after a probe (a 256-row graph against :func:`reference`, eagerly and replayed from
a CUDA graph captured on another layout); :func:`attend` runs a prepared graph when one has the
call's shape (rows, sequences, heads, dtype, device) and flash otherwise (the eager iterations,
whose ``cu`` has no padding or empty sequences). ``TRACESTORY_FRESH_ATTN``: ``auto`` (unset, 1:
cuDNN where its probe passes, else flash, the reason said once at start-up), ``cudnn`` (an error
if it cannot), ``flash``, ``0`` (the path off). On an H100 (cuDNN 9.19, frontend 1.32) the graphs
replayed from a CUDA graph took 0.105 ms where flash took 0.154 ms on two 1,024-token prompts in a
2,048-row bucket, 0.139 against 0.230 ms on one 2,048-token prompt (docs/BENCHMARKS.md, "Faster
kernels for fresh prompts, tried"); eagerly (host-bound launches) cuDNN is the slower one.

Not torch's cuDNN call: ``aten._cudnn_attention_forward`` over ``cu`` rebuilds its cuDNN graph at
every call in torch 2.11 (46-62 ms of host time) and cannot be captured; FlexAttention with a
document mask was 1.5-3.3x slower than flash (same section).
"""

from __future__ import annotations

import os

from ..models.switches import OFF, env_on
from . import fresh_cudnn

ENV = "TRACESTORY_FRESH_ATTN"
MODES = ("auto", "cudnn", "flash")
ON = ("1", "true", "yes", "on")
# the probe's layout: two prompts, padding rows, empty sequences (as the server's buckets have)
PROBE_LENGTHS, PROBE_ROWS = (100, 60), 256

# the choice of the last :func:`prepare`: kernel ("cudnn", "flash" or "off"), reason, buckets
info: dict = {}
# the cuDNN graphs prepared, by shape (:func:`_key`) -> fresh_cudnn.BucketGraph
_graphs: dict = {}


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
    """(kernel, reason) for mode ``m`` (:func:`mode`, not off) given what kept cuDNN from serving
    (``problem``, '' when its probe passed and its graphs were built). RuntimeError when ``cudnn``
    was asked for and cannot serve."""
    if m == "flash":
        return "flash", f"{ENV}=flash"
    if not problem:
        why = "its graphs matched the reference eagerly and replayed from a CUDA graph"
        return "cudnn", (f"{ENV}=cudnn; " if m == "cudnn" else "") + why
    if m == "cudnn":
        raise RuntimeError(f"{ENV}=cudnn, but cuDNN cannot serve fresh prompts: {problem}")
    return "flash", f"cuDNN not used: {problem}"


def prepare(rows, count: int, heads: int, kv_heads: int, head_dim: int, dtype, device, say=None) -> dict:
    """Choose the fresh path's kernel for chunk buckets of ``rows`` (a list) with ``count``
    sequences each (a static bucket's ``cu`` holds ``count + 1`` offsets): in mode ``auto`` or
    ``cudnn`` probe cuDNN (:func:`probe`), then build one graph per bucket; any failure leaves
    flash (``auto``) or raises (``cudnn``). Mode ``flash`` or ``off`` drops every prepared graph.
    ``say(line)`` is told the choice and why. Returns a copy of :data:`info`."""
    m = mode()
    info.clear()
    if m in ("off", "flash"):
        _graphs.clear()
        if m == "off":
            info.update(kernel="off", reason=f"{ENV}=0: every chunk through FlexAttention", buckets=[])
            return dict(info)
    built, problem = {}, ""
    if m != "flash":
        problem = probe(heads, kv_heads, head_dim, dtype, device, count)
        for R in ([] if problem else rows):
            try:
                built[_key(device, R, count, heads, kv_heads, head_dim, dtype)] = build(
                    R, count, heads, kv_heads, head_dim, dtype, device)
            except Exception as e:  # noqa: BLE001 -- any failure: flash serves, the reason said
                problem = f"its graph of {R} rows could not be built: {_short(e)}"
                break
    kernel, reason = decide(m, problem)
    if kernel == "cudnn":
        _graphs.update(built)
    info.update(kernel=kernel, reason=reason, buckets=sorted(rows) if kernel == "cudnn" else [])
    if say is not None:
        say(f"fresh-prompt attention: {kernel} ({reason})")
    return dict(info)


def build(rows: int, count: int, heads: int, kv_heads: int, head_dim: int, dtype, device):
    """The cuDNN graph of one bucket (:class:`.fresh_cudnn.BucketGraph`)."""
    return fresh_cudnn.BucketGraph(rows, count, heads, kv_heads, head_dim, dtype, device)


def _key(device, rows: int, count: int, heads: int, kv_heads: int, head_dim: int, dtype) -> tuple:
    """A prepared graph's shape; ``cuda`` and ``cuda:<current>`` name one device."""
    torch = _torch()
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return (str(d), int(rows), int(count), int(heads), int(kv_heads), int(head_dim), str(dtype))


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
    through :func:`run`, elsewhere :func:`reference`."""
    H, R, d = q.shape
    k, v = kc[slots], vc[slots]                           # [R, Hkv, d]
    qt = q.transpose(0, 1).contiguous()                   # [R, H, d]
    if q.device.type != "cuda":
        return reference(qt, k, v, cu).reshape(R, H * d)
    return run(qt, k, v, cu, rows).reshape(R, H * d)


def run(q, k, v, cu, rows: int):
    """``q`` ``[R, H, d]``, ``k, v`` ``[R, Hkv, d]``, causal sequences ``cu`` -> ``[R, H, d]``: the
    prepared cuDNN graph of this shape (:func:`prepare`), else :func:`flash_call`."""
    g = None
    if _graphs:
        g = _graphs.get(_key(q.device, rows, cu.shape[0] - 1, q.shape[1], k.shape[1], q.shape[2], q.dtype))
    if g is not None:
        return g(q, k, v, cu)
    return flash_call(q, k, v, cu, rows)


def flash_call(q, k, v, cu, rows: int):
    """FlashAttention-2's variable-length forward: ``q`` ``[R, H, d]``, ``k, v`` ``[R, Hkv, d]``,
    causal sequences ``cu`` -> ``[R, H, d]``."""
    torch = _torch()
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, rows, rows, 0.0, True, False)[0]


def probe(heads: int, kv_heads: int, head_dim: int, dtype, device, count: int = 4) -> str:
    """Why cuDNN's graphs cannot serve this shape of heads ('' when they can): the frontend must
    import, a graph of :data:`PROBE_ROWS` rows and ``max(count, 4)`` sequences must build, run
    :data:`PROBE_LENGTHS` prompts with the padding rows and empty sequences after them within the
    dtype's tolerance of :func:`reference` (float32), and give the same replayed from a CUDA graph
    captured on another layout. Costs a graph build (about 50 ms after the first) and host syncs."""
    if str(device).split(":")[0] != "cuda":
        return f"no CUDA device ({device})"
    why = fresh_cudnn.import_reason()
    if why:
        return why
    torch = _torch()
    R, count = PROBE_ROWS, max(int(count), 4)
    gen = torch.Generator(device=device).manual_seed(7)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    q, k, v = rnd(R, heads, head_dim), rnd(R, kv_heads, head_dim), rnd(R, kv_heads, head_dim)
    tol = 8 * torch.finfo(dtype).eps
    cu = torch.tensor(offsets(PROBE_LENGTHS, R, count), device=device)
    try:
        g = build(R, count, heads, kv_heads, head_dim, dtype, device)
        err = _max_err(g(q, k, v, cu), q, k, v, cu)
        if not err <= tol:
            return f"its result differs from the reference by {err:.3g} (tolerance {tol:.3g})"
        sq, sk, sv = q.clone(), k.clone(), v.clone()
        scu = torch.tensor(offsets([R], R, count), device=device)
        s = torch.cuda.Stream(device)
        s.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(s):
            g(sq, sk, sv, scu)
        torch.cuda.current_stream(device).wait_stream(s)
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg):
            so = g(sq, sk, sv, scu)
        scu.copy_(cu)
        cg.replay()
        err = _max_err(so, q, k, v, cu)
        if not err <= tol:
            return f"its CUDA graph replay differs from the reference by {err:.3g} (tolerance {tol:.3g})"
    except Exception as e:  # noqa: BLE001 -- any failure: flash serves, the reason said
        return f"its probe failed: {_short(e)}"
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
