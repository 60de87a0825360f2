"""FP8 (e4m3) projections for the Llama layer and for Hugging Face checkpoints: weights quantised
once, activations at every call, the product through ``torch._scaled_mm``.

Quantisation of a tensor ``v`` with amax ``a`` over its scaling group (a row, or the whole
tensor)::

    scale = a / 448          (1 when a == 0)
    q     = e4m3(clamp(v * (448 / a), -448, 448))     round to nearest even
    v    ~= q * scale

Modes (``--fp8``):

* ``rowwise``: one fp32 scale per weight output row (``[1, N]``) and per activation row (token,
  ``[M, 1]``); on CUDA ``_scaled_mm`` writes bf16 for these scales (cast back to the input
  dtype when that differs).
* ``tensorwise``: one fp32 scale for the weight and one for the whole activation tensor.

``y = _scaled_mm(q_x [M, K], q_w^T [K, N], scale_x, scale_w) = (q_x · q_w^T) * scale_x * scale_w``
with fp32 accumulation. The weight ``[N, K]`` is stored row-major, so ``q_w.t()`` is the
column-major operand cuBLASLt expects. Error per element of each operand (round to nearest, 3
mantissa bits): ``|v - q·scale| <= 2**-4 |v| + 2**-10 scale`` (the second term is the
subnormal step's half, below 2**-6).

:class:`Fp8Weight` is an ``nn.Module`` holding the fp8 weight, its scale and an optional bias;
:func:`tracestory.models.llama.linear` dispatches on it, so every caller of that function (the
bench layer, the server) runs FP8 once :func:`quantize_stack` has replaced the projection weights
``wq wk wv wo wg wu wd`` of its layers. :func:`quantize_linears` does the same for the
``nn.Linear`` modules of a Hugging Face model (except its output head).

:func:`scaled_mm` multiplies an activation already quantised (by a fused kernel of
:mod:`.glue_triton`); :data:`SMALL_M` lists the (N, K, M) shapes where :mod:`.fp8_small_m`'s
Triton kernel replaces ``_scaled_mm``, filled by :func:`tune_small_m` from timings on the GPU.
:meth:`Fp8Weight.stacked` concatenates row-wise weights that read one input.

Limits: ``K`` and ``N`` multiples of 16 (``_scaled_mm`` on CUDA); FP8 matmuls need SM89+
on CUDA (Ada, Hopper, Blackwell); the activation scale is computed from the current call (no
delayed or static scaling); biases are added in the output dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import UsageError

FP8_MAX = 448.0
MODES = ("off", "rowwise", "tensorwise")
PROJECTIONS = ("wq", "wk", "wv", "wo", "wg", "wu", "wd")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UsageError(f"--fp8 {mode!r}: expected one of {', '.join(MODES)}")
    return mode


def quantize(v, per_row: bool):
    """``(q e4m3fn, scale fp32)`` of ``v [M, K]``; scale ``[M, 1]`` per row, ``[]`` per tensor.

    On CUDA with Triton this is one kernel per row-wise call (two and a memset per tensor:
    :mod:`.quant_triton`, the same formulas) instead of the ten small torch ops of
    :func:`quantize_reference`: at decode sizes the ops' launches, not their bytes, were the
    cost (elementwise and reduction kernels were half of an FP8 server step's GPU time)."""
    if v.is_cuda and v.dim() == 2 and _triton_quant() is not None:
        qt = _triton_quant()
        if per_row:
            return qt.quantize_per_row(v)
        q, s = qt.quantize_per_tensor(v)
        return q, s.reshape(())
    return quantize_reference(v, per_row)


def quantize_reference(v, per_row: bool):
    """:func:`quantize` in plain torch ops on any device (the CPU path, and the reference the
    Triton kernels are checked against): ``amax = max |v|`` (fp32, per row or whole tensor),
    ``scale = amax / 448``, ``q = e4m3(clamp(v * 448 / amax))``; ``amax == 0`` gives scale 1."""
    vf = v.float()
    amax = vf.abs().amax(dim=-1, keepdim=True) if per_row else vf.abs().amax()
    pos = amax > 0
    safe = torch.where(pos, amax, torch.ones_like(amax))
    scale = torch.where(pos, safe / FP8_MAX, torch.ones_like(amax))
    inv = torch.where(pos, FP8_MAX / safe, torch.ones_like(amax))
    return (vf * inv).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


_TRITON = []


def _triton_quant():
    """:mod:`.quant_triton` when Triton imports, else None (looked up once)."""
    if not _TRITON:
        try:
            from . import quant_triton
        except ImportError:
            quant_triton = None
        _TRITON.append(quant_triton)
    return _TRITON[0]


class Fp8Weight(nn.Module):
    """A projection weight ``[N, K]`` (nn.Linear layout) in e4m3 with its scale, quantised once."""

    def __init__(self, weight, mode: str, bias=None):
        super().__init__()
        if check_mode(mode) == "off":
            raise UsageError("Fp8Weight needs --fp8 rowwise or tensorwise, found off")
        N, K = weight.shape
        if N % 16 or K % 16:
            raise UsageError(f"FP8 projection of shape [{N}, {K}]: _scaled_mm needs both sizes to be "
                             "multiples of 16")
        q, s = quantize(weight.detach(), per_row=mode == "rowwise")
        self.mode = mode
        self.out_features, self.in_features = N, K
        self.weight = nn.Parameter(q, requires_grad=False)                  # [N, K] e4m3
        self.scale = nn.Parameter(s.reshape(1, N).contiguous() if mode == "rowwise" else s,
                                  requires_grad=False)                     # [1, N] or []
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    def dequantize(self):
        """The weight as fp32 ``q * scale`` ``[N, K]``."""
        s = self.scale.reshape(-1, 1) if self.mode == "rowwise" else self.scale
        return self.weight.float() * s

    def nbytes(self) -> int:
        """Bytes a call reads from this weight: 1 per element plus the fp32 scales."""
        return self.weight.numel() + 4 * self.scale.numel()

    def forward(self, x):
        return fp8_linear(x, self)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.mode}"

    @classmethod
    def stacked(cls, parts) -> Fp8Weight | None:
        """One row-wise weight ``[sum N_i, K]`` holding ``parts`` (row-wise, no bias) one after
        another: the quantised rows and their scales are concatenated, not quantised again, so
        each output row is the one its part computes. The parts' weights become views into it
        (nothing is stored twice). None when a part is not row-wise, has a bias, or the inputs
        differ."""
        parts = list(parts)
        if not parts or any(not isinstance(p, Fp8Weight) or p.mode != "rowwise" or p.bias is not None
                            or p.in_features != parts[0].in_features for p in parts):
            return None
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.mode = "rowwise"
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.weight = nn.Parameter(torch.cat([p.weight for p in parts]), requires_grad=False)
        self.scale = nn.Parameter(torch.cat([p.scale for p in parts], dim=1).contiguous(), requires_grad=False)
        self.bias = None
        off = 0
        for p in parts:
            p.weight = nn.Parameter(self.weight[off:off + p.out_features], requires_grad=False)
            off += p.out_features
        return self


def _out_dtype(x, w: Fp8Weight):
    if w.mode == "rowwise" and x.is_cuda:
        return torch.bfloat16                  # the one output dtype of row-wise _scaled_mm on CUDA
    return x.dtype if x.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32


# (N, K, M) -> (BLOCK_K, stages) of :mod:`.fp8_small_m`, where it was measured faster than
# ``_scaled_mm`` (:func:`tune_small_m`); every other shape runs ``_scaled_mm``
SMALL_M: dict[tuple[int, int, int], tuple[int, int]] = {}


def scaled_mm(qx, sx, w: Fp8Weight, out_dtype):
    """``x @ W^T`` of an activation already quantised per row (``qx [M, K]`` e4m3, ``sx [M, 1]``)
    against a row-wise weight, in ``out_dtype`` (bf16 from the GPU kernels, cast when another):
    the small-M Triton kernel where :data:`SMALL_M` lists the shape, else ``_scaled_mm``."""
    cfg = SMALL_M.get((w.out_features, w.in_features, qx.shape[0])) if SMALL_M and qx.is_cuda else None
    if cfg is not None:
        from . import fp8_small_m

        y = fp8_small_m.matmul(qx, sx, w.weight, w.scale, *cfg)
    else:
        y = torch._scaled_mm(qx, w.weight.t(), scale_a=sx, scale_b=w.scale,
                             out_dtype=torch.bfloat16 if qx.is_cuda else out_dtype)
    return y if y.dtype == out_dtype else y.to(out_dtype)


def _graph_seconds(fn, reps: int = 3) -> float:
    """GPU seconds of ``fn`` replayed from a CUDA graph (median of ``reps``; launches excluded)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    out = []
    for _ in range(reps + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return sorted(out[1:])[len(out[1:]) // 2]


def tune_small_m(groups, rows, margin: float = 0.95) -> list[dict]:
    """Measure, for each group of same-shape row-wise weights (one projection of every layer)
    and each row count in ``rows`` up to :data:`.fp8_small_m.MAX_M`, the small-M Triton kernel
    (each of its configs) against ``_scaled_mm`` over the whole group (so the weights come
    from memory, as in a forward), and list the kernel in :data:`SMALL_M` where its best
    config takes under ``margin`` of ``_scaled_mm``'s time and agrees with it (relative error
    < 2e-2). Returns one dict per (shape, rows) measured. CUDA with Triton only."""
    from . import fp8_small_m, quant_triton

    out = []
    for ws in groups:
        ws = [w for w in ws if isinstance(w, Fp8Weight) and w.mode == "rowwise"]
        if not ws:
            continue
        N, K = ws[0].out_features, ws[0].in_features
        for M in sorted(set(rows)):
            if M > fp8_small_m.MAX_M:
                continue
            SMALL_M.pop((N, K, M), None)
            x = torch.randn(M, K, device=ws[0].weight.device, dtype=torch.bfloat16)
            qx, sx = quant_triton.quantize_per_row(x)
            ref = [scaled_mm(qx, sx, w, torch.bfloat16) for w in ws[:1]][0].float()
            t_cublas = _graph_seconds(lambda qx=qx, sx=sx: [scaled_mm(qx, sx, w, torch.bfloat16) for w in ws])
            row = {"n": N, "k": K, "m": M, "weights": len(ws), "scaled_mm_us": round(t_cublas / len(ws) * 1e6, 2)}
            best = None
            for bk, st in fp8_small_m.CONFIGS:
                if not fp8_small_m.fits(M, K, bk):
                    continue
                try:
                    y = fp8_small_m.matmul(qx, sx, ws[0].weight, ws[0].scale, bk, st).float()
                    err = ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                    if err >= 2e-2:
                        row[f"triton_k{bk}_s{st}_error"] = round(err, 4)
                        continue
                    t = _graph_seconds(lambda qx=qx, sx=sx, bk=bk, st=st: [
                        fp8_small_m.matmul(qx, sx, w.weight, w.scale, bk, st) for w in ws])
                except Exception as e:  # noqa: BLE001 -- a config that does not build is skipped, said
                    row[f"triton_k{bk}_s{st}_failed"] = " ".join(str(e).split())[:120]
                    continue
                row[f"triton_k{bk}_s{st}_us"] = round(t / len(ws) * 1e6, 2)
                if best is None or t < best[0]:
                    best = (t, (bk, st))
            if best is not None and best[0] < margin * t_cublas:
                SMALL_M[(N, K, M)] = best[1]
                row["chosen"] = f"triton BLOCK_K={best[1][0]} stages={best[1][1]}"
            else:
                row["chosen"] = "_scaled_mm"
            out.append(row)
    return out


def fp8_linear(x, w: Fp8Weight):
    """``x @ W^T (+ bias)`` with ``x [..., K]`` quantised per row (rowwise) or per tensor."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    qx, sx = quantize(x2, per_row=w.mode == "rowwise")                    # [M, K], [M, 1] or []
    if w.mode == "rowwise" and SMALL_M and x2.is_cuda:
        y = scaled_mm(qx, sx, w, _out_dtype(x, w))
    else:
        y = torch._scaled_mm(qx, w.weight.t(), scale_a=sx, scale_b=w.scale, out_dtype=_out_dtype(x, w))
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    if w.bias is not None:
        y = y + w.bias.to(y.dtype)
    return y.reshape(*lead, w.out_features)


def _layers_of(stack_or_layers):
    return list(stack_or_layers.layers if hasattr(stack_or_layers, "layers") else stack_or_layers)


def quantize_stack(stack_or_layers, mode: str) -> int:
    """Replace the projection weights (``wq wk wv wo wg wu wd``) of every layer by
    :class:`Fp8Weight` in place; a :class:`tracestory.models.llama.Stack` or an iterable of its
    layers. Returns the number of weights replaced (0 for ``off``); weights already in FP8 are
    left alone."""
    if check_mode(mode) == "off":
        return 0
    n = 0
    for layer in _layers_of(stack_or_layers):
        for name in PROJECTIONS:
            w = getattr(layer, name)
            if isinstance(w, Fp8Weight):
                continue
            q = Fp8Weight(w, mode)
            delattr(layer, name)                       # an nn.Parameter slot takes no module
            setattr(layer, name, q)
            n += 1
    return n


def quantize_linears(model, mode: str, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace every ``nn.Linear`` of ``model`` whose attribute name is not in ``skip`` (the
    output head by default) by :class:`Fp8Weight` (bias kept); returns how many."""
    if check_mode(mode) == "off":
        return 0
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear) and name not in skip]
    for parent, name, child in targets:
        setattr(parent, name, Fp8Weight(child.weight, mode, child.bias))
    return len(targets)


def weight_bytes(layer) -> int:
    """Bytes of the projection weights of ``layer`` as stored (FP8 with scales, or dense)."""
    total = 0
    for name in PROJECTIONS:
        w = getattr(layer, name)
        total += w.nbytes() if isinstance(w, Fp8Weight) else w.numel() * w.element_size()
    return total
