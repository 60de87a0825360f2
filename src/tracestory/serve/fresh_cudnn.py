"""Fresh-prompt attention through cuDNN's frontend: one SDPA graph per chunk bucket.

The model. A chunk bucket of ``R`` rows whose ``cu`` (:func:`.fresh_attention.offsets`) holds
``count`` causal sequences (the members, the padding rows as one sequence, then empty ones) is one
cuDNN graph built once (``nvidia-cudnn-frontend``, ``import cudnn``; :class:`BucketGraph`):

* Q, K, V and O in the THD layout: the rows ``[R, heads, d]`` as they are, declared as
  ``[count, heads, R, d]`` with row stride ``heads * d`` and a ragged offset per sequence;
* the per-sequence lengths with the padding mask, the causal mask (top-left diagonal, right bound
  0), grouped-query heads as they are, scale ``1/sqrt(d)``, float accumulation, no softmax stats
  (inference).

Each call computes the lengths ``cu[1:] - cu[:-1]`` and the ragged offsets (``cu * heads * d``
elements: cuDNN before 9.24 has no offset multiplier) from the device ``cu`` with three small
tensor ops and executes the built plan on torch's current stream: no host sync, no build, so a
CUDA graph captured around the call once replays any layout of the bucket.

Empty sequences: they have length 0 at offset ``R`` (the end of the rows); cuDNN 9.19 on an H100
took them as they are (``benchmarks/gpu/cudnn_fe_attn.py``). ``spare=True`` is the way round a
cuDNN that would refuse them, not exercised since: one more row on Q, K, V and O (row ``R``,
zeros), every empty sequence made length 1 at that row, so no member's row is read or written
differently; it costs a copy of Q, K and V per call. The server builds without it (a refusal
fails :func:`.fresh_attention.probe`, whose layout has empty sequences: flash then serves).

Limits: bf16/fp16 (Hopper or later, cuDNN 9 with ragged SDPA); int32 offsets, so
``R * heads * d < 2**31``; the bucket's shape (rows, sequences, heads) is fixed at build; a
process-wide cuDNN handle per device, so calls on one device must not overlap on two streams.
"""

from __future__ import annotations

import math
import time

_handles: dict = {}          # device index -> cudnn.Handle


def import_reason() -> str:
    """Why ``import cudnn`` (the frontend) fails here, '' when it works."""
    try:
        import cudnn  # noqa: F401
    except Exception as e:  # noqa: BLE001 -- any failure is a reason to stay on flash
        return f"import cudnn failed: {' '.join(str(e).split())[:160] or type(e).__name__}"
    return ""


def versions() -> dict:
    """The frontend's and the cuDNN library's versions (import errors propagate)."""
    import cudnn

    return {"frontend": cudnn.__version__, "backend": int(cudnn.backend_version())}


def _handle(torch, device):
    import cudnn

    idx = device.index if device.index is not None else torch.cuda.current_device()
    h = _handles.get(idx)
    if h is None:
        with torch.cuda.device(idx):
            h = _handles[idx] = cudnn.create_handle()
    return h


class BucketGraph:
    """The cuDNN SDPA graph of one bucket (module docstring): built at construction (``build_s``
    seconds), then ``g(q, k, v, cu)`` with ``q`` ``[R, H, d]``, ``k, v`` ``[R, Hkv, d]`` and ``cu``
    (device int32, ``count + 1``) returns ``[R, H, d]``. ``causal``: ``"band"`` (diagonal band,
    right bound 0) or ``"flag"`` (``use_causal_mask``), the same mask asked for two ways."""

    def __init__(self, rows: int, count: int, heads: int, kv_heads: int, head_dim: int, dtype, device,
                 *, spare: bool = False, causal: str = "band"):
        import cudnn
        import torch

        self.torch = torch
        self.rows, self.count, self.heads, self.kv_heads, self.head_dim = rows, count, heads, kv_heads, head_dim
        self.spare = bool(spare)
        self.device = torch.device(device)
        if rows * heads * head_dim >= 2**31:
            raise ValueError(f"{rows} rows x {heads} heads x {head_dim} exceed int32 ragged offsets")
        io = {torch.bfloat16: cudnn.data_type.BFLOAT16, torch.float16: cudnn.data_type.HALF}.get(dtype)
        if io is None:
            raise ValueError(f"cuDNN's fresh-prompt graph takes bf16 or fp16, not {dtype}")
        t0 = time.perf_counter()
        self.handle = _handle(torch, self.device)
        B, S, d = count, rows, head_dim
        i32 = cudnn.data_type.INT32
        g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=self.handle,
                          is_cuda_graph_replay_expected=True)

        def ints(name, n):
            return g.tensor(name=name, dim=[n, 1, 1, 1], stride=[1, 1, 1, 1], data_type=i32)

        ro_q, ro_k, ro_v = ints("ro_q", B + 1), ints("ro_k", B + 1), ints("ro_v", B + 1)
        len_q, len_kv = ints("len_q", B), ints("len_kv", B)

        def thd(name, h, ro):
            return g.tensor(name=name, dim=[B, h, S, d], stride=[S * h * d, d, h * d, 1], data_type=io,
                            ragged_offset=ro)

        q, k, v = thd("q", heads, ro_q), thd("k", kv_heads, ro_k), thd("v", kv_heads, ro_v)
        mask = ({"diagonal_alignment": cudnn.diagonal_alignment.TOP_LEFT, "diagonal_band_right_bound": 0}
                if causal == "band" else {"use_causal_mask": True})
        o, _stats = g.sdpa(name="fresh", q=q, k=k, v=v, attn_scale=1.0 / math.sqrt(d), generate_stats=False,
                           use_padding_mask=True, seq_len_q=len_q, seq_len_kv=len_kv, **mask)
        o.set_output(True).set_dim([B, heads, S, d]).set_stride([S * heads * d, d, heads * d, 1])
        o.set_data_type(io).set_ragged_offset(ro_q)
        g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        self.graph = g
        self._t = (q, k, v, o, ro_q, ro_k, ro_v, len_q, len_kv)
        ws = int(g.get_workspace_size())
        self.workspace = torch.empty(max(ws, 1), dtype=torch.uint8, device=self.device)
        self.workspace_bytes = ws
        self.build_s = time.perf_counter() - t0

    def __call__(self, q, k, v, cu):
        torch = self.torch
        import cudnn

        R = self.rows
        if q.shape[0] != R or k.shape[0] != R or cu.shape[0] != self.count + 1:
            raise ValueError(f"a bucket of {R} rows and {self.count} sequences got {q.shape[0]} rows, "
                             f"{cu.shape[0] - 1} sequences")
        cu = cu.to(torch.int32)
        lens = (cu[1:] - cu[:-1]).contiguous()
        if self.spare:           # empty sequences: length 1 at the spare row R
            lens = lens.clamp(min=1)
            q, k, v = (torch.cat((x, x.new_zeros(1, *x.shape[1:]))) for x in (q, k, v))
        hd, kd = self.heads * self.head_dim, self.kv_heads * self.head_dim
        ro_q, ro_kv = (cu * hd).contiguous(), (cu * kd).contiguous()
        o = torch.empty_like(q)
        tq, tk, tv, to, rq, rk, rv, lq, lkv = self._t
        cudnn.set_stream(self.handle, torch.cuda.current_stream(self.device).cuda_stream)
        self.graph.execute({tq: q, tk: k, tv: v, to: o, rq: ro_q, rk: ro_kv, rv: ro_kv, lq: lens, lkv: lens},
                           self.workspace, handle=self.handle)
        return o[:R] if self.spare else o
