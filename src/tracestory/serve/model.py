"""The built-in Llama testbench model run over the paged KV cache, one forward per iteration.

Weights: on the CPU the decoder layers are those of :func:`tracestory.models.llama.build_model`
(same seed, same layer math: RMSNorm, RoPE rotate-half, GQA, SwiGLU); on CUDA the same shapes
and scales are drawn on the device (a 32-layer stack in seconds; other values than the CPU's).
Plus a random token embedding ``[vocab, D]``, a final RMSNorm and a random LM head ``[vocab, D]``
(scaled 1/sqrt(D)). Random weights, fixed seed: the generated ids are meaningless but
deterministic.

Cache: per layer one K and one V tensor of ``[num_blocks * block_size, Hkv, d]`` token slots;
token position ``p`` of a request lives in slot ``table[p // bs] * bs + p % bs`` of its block
table (:mod:`.kv_cache`).

One iteration (:meth:`PagedLlama.step`) over members ``m`` with ``n_m`` new tokens at positions
``start_m .. start_m + n_m - 1``::

    x = embed[concat(token ids)]                                   # [T, D], T = sum n_m
    per layer:
        q, k, v = RoPE(Wq·n1(x)), RoPE(Wk·n1(x)), Wv·n1(x)          # [T, H|Hkv, d]
        K[slots], V[slots] = k, v                                   # write the new tokens
        per member: o_m = SDPA(q_m, K[ctx slots], V[ctx slots])     # keys 0..start_m+i for query i
        x = x + Wo·o ;  x = x + Wd·(silu(Wg·n2(x)) * Wu·n2(x))
    next token of a sampling member = argmax(LM head · norm(x[last row of m]))

The matmuls and MLP run once over all ``T`` tokens (prefill chunks and decode tokens mixed).
:meth:`PagedLlama.prepare` stacks Wq/Wk/Wv and Wg/Wu into one weight each (one GEMM, one FP8
activation quantisation per group). On CUDA with Triton the elementwise glue between the GEMMs
runs fused (:meth:`PagedLlama._layers_glue`, :mod:`tracestory.models.glue_triton`: residual add +
norm + FP8 quantisation, RoPE + the K/V cache write, SwiGLU + quantisation; ``glue="torch"`` or
``TRACESTORY_GLUE=torch`` keeps one torch op each), and FP8 projections at decode buckets of up
to 16 rows run the small-M Triton GEMM where start-up timing found it faster than
``_scaled_mm`` (:func:`tracestory.models.fp8.tune_small_m`; ``TRACESTORY_SMALL_M=0``: never).
Attention gathers K/V through the block tables: the single-token members (decode) in one
batched SDPA, their contexts padded to the longest and the padding masked; each longer member
(a prefill chunk) in its own SDPA with a causal mask offset by its start. Query heads are
folded into ``Hkv`` groups (``[.., Hkv, g·n, d]``) so K/V are not repeated per head.
With ``attention="sdpa"`` the gather copies every member's context in every layer, and the
index tensors of an iteration go to the device in one copy. With ``attention="flex"``
FlexAttention reads K/V through the block tables (:mod:`.paged_attention`): the prefill
chunks of a mixed iteration are one query sequence over the whole cache with a block-table
mask, decode tokens go through FlexAttention's decoding kernel, and on CUDA decode-only
iterations replay a CUDA graph per batch-size bucket (:mod:`.graphs`), whose attention is the
paged split-KV Triton kernels of :mod:`tracestory.models.decode_attn_triton` (bf16/fp16/fp32 with
Triton; ``TRACESTORY_DECODE_ATTN=0``: FlexAttention's decoding kernel there too; opt-in, not yet
measured: ``TRACESTORY_DECODE_ATTN_FUSED=1``, one kernel a layer, and with it
``TRACESTORY_DECODE_ATTN_QUANT=1``, which also writes an FP8 row-wise ``Wo``'s input where the glue
is fused, replacing the quantiser); prefill and mixed
iterations replay one per (decode rows, chunk rows) bucket (:mod:`.mixed`) when they fit, else run
eagerly (the layers' Python launches every op). On CUDA in bf16/fp16, an iteration whose every
chunk is a fresh prompt (from position 0) attends its chunks with one variable-length call over the
K/V just written (a cuDNN graph per chunk bucket where the cuDNN frontend is installed, else flash)
instead of FlexAttention's chunk kernel (:mod:`.fresh_attention`, its own buckets). The caches hold one scratch block after the
last (``num_blocks``), which no block table lists: padding rows of those graphs write there.

Asynchronous iterations (:meth:`PagedLlama.launch`): the sampled ids stay on the device (the
next iteration may take its input ids from them, ``-(r+1)`` = row ``r``) and are copied to
pinned host memory without waiting; :meth:`Launch.result` waits for that copy. On the CPU a
launch computes at once.

Each iteration is a :func:`tracestory.region` named ``iteration N``, so torch.profiler, nsys and
ncu see the iterations. Device memory (``torch.cuda.memory_allocated/reserved``) is reported on
CUDA only (:meth:`PagedLlama.memory`; ``None`` on CPU).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ..capture.region import region
from ..models import decode_attn, pdl
from ..models.llama_config import LlamaConfig, layer_params
from ..models.switches import env_on, opted_in
from . import fresh_attention
from .graphs import DecodeGraphs, bucket_for, decode_buckets
from .mixed import MixedGraphs, chunk_buckets
from .paged_attention import PAD_ROW, Q_TILE, FlexPagedAttention, cache_blocks, chunk_tiles

ATTENTION_BACKENDS = ("sdpa", "flex")
# decode CUDA graphs hold block tables this long (tokens); a longer context runs eagerly
GRAPH_MAX_MODEL_LEN = 8192

# A realistic LM-head width for the real presets, a small one for the tiny test config.
DEFAULT_VOCAB = {"tiny": 512, "llama-2-7b": 32000, "llama-3-8b": 128256}


def kv_bytes_per_block(cfg: LlamaConfig, layers: int, block_size: int, dtype_bytes: int) -> int:
    """Bytes of K and V for one block over all layers: ``2 * layers * block_size * Hkv * d * b``."""
    return 2 * layers * block_size * cfg.n_kv_heads * cfg.head_dim * dtype_bytes


def weight_bytes(cfg: LlamaConfig, layers: int, vocab: int, dtype_bytes: int) -> int:
    """Bytes of the weights: the layers plus embedding, LM head and final norm."""
    return (layers * layer_params(cfg) + 2 * vocab * cfg.dim + cfg.dim) * dtype_bytes


def _identity(x):
    return x


def _rowwise(w) -> bool:
    """Whether projections by ``w`` take an activation quantised per row (FP8 row-wise weight)."""
    return getattr(w, "mode", None) == "rowwise"


def _round_up(n: int, k: int) -> int:
    return max(k, -(-n // k) * k)


def _sdpa_backends():
    """SDPA without the cuDNN backend: it builds an execution plan for every new shape (about
    40 ms each on an H200 with torch 2.11), and under continuous batching nearly every iteration
    has a new (members, longest context) shape. Flash, memory-efficient and math kernels need no
    plan. A no-op where torch has no ``torch.nn.attention``."""
    import contextlib

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class _DeviceLayer:
    """A decoder layer's weights drawn on the device (same names and layout as
    :class:`tracestory.models.llama.Layer`: ``[out, in]``, scaled 1/sqrt(in); norms 1 + 0.1·N(0,1))."""

    def __init__(self, cfg: LlamaConfig, device, dtype, gen):
        import torch

        D, H, K, d, I = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim

        def w(out_f, in_f):
            t = torch.randn(out_f, in_f, generator=gen, device=device, dtype=torch.float32)
            return t.mul_(in_f ** -0.5).to(dtype)

        self.wq, self.wk, self.wv, self.wo = w(H * d, D), w(K * d, D), w(K * d, D), w(D, H * d)
        self.wg, self.wu, self.wd = w(I, D), w(I, D), w(D, I)
        self.n1 = (1 + 0.1 * torch.randn(D, generator=gen, device=device)).to(dtype)
        self.n2 = (1 + 0.1 * torch.randn(D, generator=gen, device=device)).to(dtype)


class _DeviceStack:
    def __init__(self, cfg: LlamaConfig, layers: int, device, dtype, seed: int):
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        self.layers = [_DeviceLayer(cfg, device, dtype, gen) for _ in range(layers)]


class Launch:
    """The sampled tokens of one launched iteration: ``result()`` waits for them (an event on
    CUDA; already there on CPU) and returns ``{request_id: token}``.

    ``timing`` (CUDA): two timing events recorded on the model's stream around the launched
    work, outside any CUDA graph (a graph's replay is one more item on the stream between them);
    ``result()`` then waits on the later one (recorded after the copy of the sampled ids, so
    the ids are on the host too) and :attr:`gpu_ns` is their ``elapsed_time``: the device time
    from the first queued op of the forward to the ids' copy, including any wait of the stream
    in a collective (at tensor parallelism, for a slower rank). Read only after ``result()``, so
    it never blocks; None on CPU, before ``result()``, when the events are not done (an iteration
    that samples no token is not waited for) or could not be read."""

    def __init__(self, who: list[str], host, event, path: str, timing: tuple | None = None):
        self.who, self._host, self._event, self.path = who, host, event, path
        self._timing = timing
        self._done = False

    def result(self) -> dict[str, int]:
        if not self.who:
            self._done = True
            return {}
        if self._timing is not None:
            self._timing[1].synchronize()        # recorded after self._event on the same stream
        elif self._event is not None:
            self._event.synchronize()
        self._done = True
        return dict(zip(self.who, (int(t) for t in self._host[:len(self.who)].tolist())))

    @property
    def gpu_ns(self) -> int | None:
        if self._timing is None or not self._done:
            return None
        start, end = self._timing
        try:
            if not end.query():
                return None
            return int(round(start.elapsed_time(end) * 1e6))
        except RuntimeError:                      # e.g. an event never recorded
            return None


class PagedLlama:
    """``layers`` Llama decoder layers with an embedding, LM head and a paged KV cache.

    ``attention``: ``sdpa`` (contexts gathered per iteration, see the module docstring) or
    ``flex`` (FlexAttention reading the cache through the block tables, :mod:`.paged_attention`;
    compiled on CUDA, eager on CPU).

    Shape-dependent state (FlexAttention's mask buffers and compiled kernels, the decode CUDA
    graphs and their static buffers) is built by :meth:`prepare`, not here, so the weights and
    caches may be replaced (sharded) in between; shapes are read from ``self.cfg`` and the
    caches at run time. Without :meth:`prepare` every iteration runs eagerly."""

    def __init__(self, cfg: LlamaConfig, *, layers: int, num_blocks: int, block_size: int,
                 vocab: int | None = None, device: str = "cpu", dtype=None, seed: int = 0,
                 attention: str = "sdpa"):
        import torch

        from ..models import llama

        if attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention: expected one of {', '.join(ATTENTION_BACKENDS)}, found {attention!r}")
        self.torch = torch
        self.cfg = cfg
        self.attention = attention
        self.num_layers = int(layers)
        self.block_size = int(block_size)
        self.num_blocks = int(num_blocks)
        self.vocab = int(vocab or DEFAULT_VOCAB.get(cfg.name, 32000))
        self.device = device
        self.dtype = dtype or torch.float32
        self._rms_norm, self._rope, self._linear = llama.rms_norm, llama.rope, llama.linear
        D = cfg.dim
        if str(device).startswith("cuda"):
            # drawn on the device: a full-size stack is built in seconds, not minutes of CPU randn
            self.stack = _DeviceStack(cfg, layers, device, self.dtype, seed)
            gen = torch.Generator(device=device).manual_seed(seed + 1)
            self.embed = torch.randn(self.vocab, D, generator=gen, device=device).to(self.dtype)
            self.norm = (1 + 0.1 * torch.randn(D, generator=gen, device=device)).to(self.dtype)
            self.lm_head = (torch.randn(self.vocab, D, generator=gen, device=device) / D ** 0.5).to(self.dtype)
        else:
            # the layers' own contiguous caches (batch 1, max_len 1) are unused: a few bytes each
            self.stack = llama.build_model(cfg, layers=layers, batch=1, max_len=1, device=device, dtype=self.dtype,
                                           seed=seed)
            gen = torch.Generator().manual_seed(seed + 1)
            self.embed = torch.randn(self.vocab, D, generator=gen).to(device, self.dtype)
            self.norm = (1 + 0.1 * torch.randn(D, generator=gen)).to(device, self.dtype)
            self.lm_head = (torch.randn(self.vocab, D, generator=gen) / D ** 0.5).to(device, self.dtype)
        # one scratch block after the last: padding rows of prefill/mixed graphs write there
        # (.mixed); compiled FlexAttention (CUDA) reads whole KV tiles: caches hold whole groups
        compiled = str(device).startswith("cuda") and attention == "flex"
        slots = cache_blocks(self.num_blocks, self.block_size, compiled) * self.block_size
        shape = (slots, cfg.n_kv_heads, cfg.head_dim)
        self.k_cache = [torch.zeros(shape, device=device, dtype=self.dtype) for _ in range(layers)]
        self.v_cache = [torch.zeros(shape, device=device, dtype=self.dtype) for _ in range(layers)]
        d = cfg.head_dim
        self._inv_freq = (1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)).to(device)
        self._table_dtype = torch.promote_types(self.dtype, torch.float32)
        # sums the partial outputs of row-parallel projections across tensor-parallel ranks;
        # the identity on one GPU
        self.tp_reduce = _identity
        # greedy ids from a vocab-parallel LM head (each rank holds a slice of its rows); None:
        # the whole head is here
        self.tp_argmax = None
        self.on_cuda = str(device).startswith("cuda")
        self._flex = None            # FlexPagedAttention (prepare, or lazily)
        self._graphs = None          # graphs.DecodeGraphs (prepare)
        self._mixed = None           # mixed.MixedGraphs (prepare)
        self._chunk_buckets: list[int] | None = None   # chunk row buckets compiled at start-up (CUDA)
        self._sampled = None         # [rows] int64: the last launch's sampled ids, on the device
        self._out_ring: list = []    # pinned host buffers + events for the sampled ids (CUDA)
        self._out_next = 0
        self._launch_timing: list = []   # pairs of timing events around launches (CUDA; Launch.gpu_ns)
        self._launch_timing_next = 0
        self._glue = None            # models.glue_triton when the fused glue runs (prepare, CUDA)
        self._decode_attn = None     # models.decode_attn_triton when the decode graphs use it (prepare)
        self._decode_attn_fused = False  # its last split combines (opt-in, prepare)
        self._decode_attn_quant = False  # it also writes Wo's FP8 input (opt-in, prepare)
        # prefill chunks of fresh prompts through flash (.fresh_attention): CUDA, FlexAttention's
        # backend, a dtype flash takes; tests may switch it on elsewhere (the reference then runs)
        self._fresh = (self.on_cuda and attention == "flex" and self.dtype in (torch.bfloat16, torch.float16)
                       and fresh_attention.enabled())
        self.startup: dict = {}      # what prepare() built and how long it took

    # ------------------------------------------------------------------ public
    def step(self, members: Sequence, iteration: int | None = None) -> dict[str, int]:
        """Run one iteration over scheduler members (:class:`~.scheduler.Member`); returns the
        greedy next token of every member with ``samples``."""
        return self.launch(members, iteration).result()

    def launch(self, members: Sequence, iteration: int | None = None,
               token_ids: Sequence[int] | None = None) -> Launch:
        """Queue one iteration on the device and return at once (CUDA); ``result()`` of the
        returned :class:`Launch` waits for the sampled ids.

        ``token_ids`` (default: the members' own, concatenated) may hold ``-(r + 1)`` for "row
        ``r`` of the previous launch's sampled ids", resolved on the device: the previous
        iteration's tokens feed this one without a round trip through the host."""
        import numpy as np

        torch = self.torch
        name = f"iteration {iteration}" if iteration is not None else "iteration"
        ids = np.fromiter(token_ids if token_ids is not None else (t for m in members for t in m.token_ids),
                          dtype=np.int64)
        who = [m.request_id for m in members if m.samples]
        timing = self._timing_events() if self.on_cuda else None
        with region(name), torch.inference_mode():
            if timing is not None:
                timing[0].record()                # on the current stream, outside any graph
            self._ensure_sampled(max(len(members), 1))
            g, mx = self._graphs, self._mixed
            key = mx.key(members) if mx is not None and not (g is not None and g.fits(members)) else None
            if g is not None and g.fits(members):
                g.run(members, ids)
                path = "graph" if g.use_graphs else "static"
            elif key is not None:
                mx.run(members, ids, key)
                path = "mixed-graph" if mx.use_graphs and key in mx.graphs else "mixed-static"
            else:
                self._eager(members, ids)
                path = "eager"
            return self._fetch(who, path, timing)

    def _timing_events(self) -> tuple:
        """The next pair of timing events of a small ring (Launch's ``gpu_ns``): at most two
        launches are in flight (the engine's overlap), so a pair is read before it is recorded
        again."""
        ring = self._launch_timing
        if not ring:
            ev = self.torch.cuda.Event
            ring.extend((ev(enable_timing=True), ev(enable_timing=True)) for _ in range(4))
        pair = ring[self._launch_timing_next]
        self._launch_timing_next = (self._launch_timing_next + 1) % len(ring)
        return pair

    def prepare(self, *, max_num_seqs: int, max_batch_tokens: int, cuda_graphs: bool = True,
                max_model_len: int | None = None, log=None, mixed_graphs: bool = True,
                glue: str | None = None) -> dict:
        """Build the shape-dependent state once the model is final (after any sharding):
        FlexAttention's mask buffers and compiled kernels (one per shape bucket, compiled here by
        a warm-up, not in the first request), and on CUDA the decode CUDA graphs, one per
        batch-size bucket (:mod:`.graphs`). Returns (and keeps in :attr:`startup`) what was
        built and the seconds it took; ``log(line)`` is told each stage.

        First the projections that read one input are stacked (:meth:`_fuse_projections`), and
        ``glue`` picks how the elementwise ops between the GEMMs run: ``triton`` (fused kernels,
        :meth:`_layers_glue`; CUDA with Triton only) or ``torch`` (one op each); default: the
        ``TRACESTORY_GLUE`` environment variable, else ``triton`` where it can run."""
        import os
        import time

        torch = self.torch
        say = log or (lambda _line: None)
        info: dict = {"attention": self.attention, "cuda_graphs": False, "fresh_attention": self._fresh}
        stacked = self._fuse_projections()
        glue = glue or os.environ.get("TRACESTORY_GLUE", "triton")
        if glue not in ("triton", "torch"):
            raise ValueError(f"glue: expected triton or torch, found {glue!r}")
        self._glue = None
        if glue == "triton" and stacked and self.on_cuda:
            from ..models.fp8 import _triton_quant

            if _triton_quant() is not None:      # Triton imports
                from ..models import glue_triton

                self._glue = glue_triton
        info.update(stacked_projections=stacked, glue="triton" if self._glue is not None else "torch")
        if self._glue is not None:
            info["pdl"] = pdl.enabled(self.torch.device(self.device))
            say("programmatic dependent launch of the Triton glue and small-M GEMM: "
                + ("on" if info["pdl"] else f"off ({pdl.ENV}=0, or no Hopper GPU or Triton launch_pdl)"))
        if self.on_cuda and stacked and env_on("TRACESTORY_SMALL_M"):
            info.update(self._tune_small_m(decode_buckets(max_num_seqs), say))
        rows = _round_up(max_batch_tokens, Q_TILE) if self.on_cuda else max_batch_tokens
        if self.on_cuda:
            self._chunk_buckets = chunk_buckets(max_batch_tokens)
        self._ensure_sampled(max(max_num_seqs, 1))
        if hasattr(self.tp_reduce, "prepare"):       # tensor parallel: the all-reduce's buffers (.allreduce)
            info["all_reduce"] = self.tp_reduce.prepare(max(rows, max_num_seqs) + max_num_seqs, self.cfg.dim,
                                                        self.dtype, self.device, say)
        if self.attention == "flex":
            self._flex = FlexPagedAttention(num_blocks=self.num_blocks, block_size=self.block_size,
                                            max_rows=max(rows, max_num_seqs), device=self.device,
                                            compiled=self.on_cuda)
        buckets = decode_buckets(max_num_seqs)
        if self.on_cuda and self.attention == "flex":
            cap = min(self.num_blocks * self.block_size, max_model_len or GRAPH_MAX_MODEL_LEN)
            width = -(-cap // self.block_size)
            self._decode_attn = self._pick_decode_attn()
            info["decode_attn"] = "triton" if self._decode_attn is not None else "flex"
            # opt-in (models.decode_attn): the last split combines; it also quantises Wo's input
            # where the fused glue runs an FP8 row-wise Wo
            self._decode_attn_fused = self._decode_attn is not None and opted_in(decode_attn.FUSED_ENV)
            self._decode_attn_quant = (self._decode_attn_fused and self._glue is not None
                                       and _rowwise(self.stack.layers[0].wo)
                                       and opted_in(decode_attn.QUANT_ENV))
            info.update(decode_attn_fused=self._decode_attn_fused, decode_attn_quant=self._decode_attn_quant)
            say("decode graphs' attention: " + ("the paged split-KV Triton kernels" if self._decode_attn is not None
                                                else f"FlexAttention's decoding kernel ({decode_attn.ENV}=0, "
                                                "or no Triton, or a dtype it does not take)"))
            t0 = time.perf_counter()
            with torch.inference_mode():
                self._graphs = DecodeGraphs(self, buckets, width, use_graphs=cuda_graphs)
                compile_s, capture_s = self._graphs.build(say)
                chunk_s = self._warm_chunks(rows, say) + self._warm_mixed_decode(say)
                mixed_warm = mixed_capture = 0.0
                if cuda_graphs and mixed_graphs:
                    if self._fresh:   # the fresh buckets' kernel: cuDNN graphs per chunk bucket, else flash
                        info["fresh_kernel"] = fresh_attention.prepare(
                            self._chunk_buckets, max_num_seqs + 1, self.cfg.n_heads, self.cfg.n_kv_heads,
                            self.cfg.head_dim, self.dtype, self.device, say)
                    t1 = time.perf_counter()
                    try:
                        self._mixed = MixedGraphs(self, buckets, self._chunk_buckets, width, max_num_seqs)
                        mixed_warm, mixed_capture = self._mixed.build(say)
                        say(f"prefill/mixed buckets (decode rows {self._mixed.dbuckets} x chunk rows "
                            f"{self._mixed.rbuckets}): {len(self._mixed.graphs)} CUDA graphs captured in "
                            f"{time.perf_counter() - t1:.1f} s")
                    except Exception as e:  # noqa: BLE001 -- serve eagerly rather than not at all
                        self._mixed = None
                        info["mixed_graphs_error"] = " ".join(str(e).split())[:300]
                        say(f"prefill/mixed buckets could not be built ({info['mixed_graphs_error']}); "
                            "prefill and mixed iterations run eagerly")
            torch.cuda.synchronize(self.device)
            info.update(cuda_graphs=cuda_graphs, decode_buckets=buckets, table_width_blocks=width,
                        compile_s=round(compile_s + chunk_s, 3), graph_capture_s=round(capture_s, 3),
                        prepare_s=round(time.perf_counter() - t0, 3),
                        chunk_rows=list(self._chunk_buckets),
                        mixed_graphs=len(self._mixed.graphs) if self._mixed is not None else 0,
                        mixed_warmup_s=round(mixed_warm, 3), mixed_capture_s=round(mixed_capture, 3))
            if self._mixed is not None and self._mixed.failed:
                info["mixed_graphs_error"] = self._mixed.failed
        self.startup = info
        return info

    def _pick_decode_attn(self):
        """:mod:`tracestory.models.decode_attn_triton` when the decode graphs should use it
        (:func:`tracestory.models.decode_attn.wanted` and Triton imports), else None (FlexAttention)."""
        if not decode_attn.wanted(str(self.dtype).removeprefix("torch."), self.on_cuda):
            return None
        try:
            from ..models import decode_attn_triton
        except ImportError:
            return None
        return decode_attn_triton

    def forward_hidden(self, x, spans: Sequence[tuple[int, int, Sequence[int]]]):
        """Hidden states ``[T, D]`` after the layers for ``x`` ``[T, D]`` made of spans
        ``(start, n, block_table)``: ``n`` tokens at positions ``start..start+n-1`` of a request
        whose cache blocks are ``block_table``. Writes their K/V into the cache."""
        if self.attention == "flex":
            cos, sin, slots, attend = self._flex_chunk_setup(spans)
            return self._layers(x, cos, sin, slots, attend)
        lay = self._layout(spans)
        cos, sin = self._rope_tables(lay["pos"])
        with _sdpa_backends():
            return self._layers(x, cos, sin, lay["slots"], lambda q, kc, vc: self._sdpa_attend(q, kc, vc, lay))

    def memory(self) -> dict | None:
        """``{"allocated_bytes", "reserved_bytes"}`` of the CUDA caching allocator; None on CPU."""
        torch = self.torch
        if not self.on_cuda:
            return None
        return {"allocated_bytes": int(torch.cuda.memory_allocated(self.device)),
                "reserved_bytes": int(torch.cuda.memory_reserved(self.device))}

    # ------------------------------------------------------------------ the layers
    def _rope_tables(self, pos):
        torch = self.torch
        ang = pos.to(torch.float64)[:, None] * self._inv_freq[None, :]
        ang = torch.cat((ang, ang), dim=-1)
        return ang.cos().to(self._table_dtype), ang.sin().to(self._table_dtype)   # [T, d]

    def _layers(self, x, cos, sin, slots, attend):
        """The decoder layers over ``x`` ``[T, D]``; ``attend(q [H, T, d], k_cache, v_cache)``
        returns ``[T, H*d]`` after the new K/V are written at ``slots``."""
        import torch.nn.functional as F

        cfg = self.cfg
        T = x.shape[0]
        H, K, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        if self._glue is not None:
            return self._layers_glue(x, cos, sin, slots, attend)
        for li, layer in enumerate(self.stack.layers):
            a = self._rms_norm(x, layer.n1, cfg.norm_eps)
            qkv = getattr(layer, "wqkv", None)
            if qkv is not None:
                q, k, v = self._linear(a, qkv).split([H * d, K * d, K * d], dim=-1)
            else:
                q, k, v = self._linear(a, layer.wq), self._linear(a, layer.wk), self._linear(a, layer.wv)
            q = self._rope(q.view(T, H, d).transpose(0, 1), cos, sin)                           # [H, T, d]
            k = self._rope(k.reshape(T, K, d).transpose(0, 1), cos, sin)                        # [Hkv, T, d]
            v = v.reshape(T, K, d)
            kc, vc = self.k_cache[li], self.v_cache[li]
            kc[slots] = k.transpose(0, 1)
            vc[slots] = v
            o = attend(q, kc, vc)
            h = x + self.tp_reduce(self._linear(o, layer.wo))
            m = self._rms_norm(h, layer.n2, cfg.norm_eps)
            gu = getattr(layer, "wgu", None)
            if gu is not None:
                g, u = self._linear(m, gu).split([cfg.ffn_dim, cfg.ffn_dim], dim=-1)
            else:
                g, u = self._linear(m, layer.wg), self._linear(m, layer.wu)
            x = h + self.tp_reduce(self._linear(F.silu(g) * u, layer.wd))
        return x

    def _layers_glue(self, x, cos, sin, slots, attend):
        """:meth:`_layers` with the glue fused (:mod:`tracestory.models.glue_triton`): per layer
        one norm kernel (adding the previous block's output to the residual stream, norm, FP8
        quantisation), the QKV GEMM, one RoPE kernel that also writes K/V into the cache,
        attention (in the decode graphs it may return ``Wo``'s FP8 input ``(q, scale)``), the
        output projection, its all-reduce, one norm kernel, the gate/up GEMM, one SwiGLU kernel
        (quantising), the down projection and its all-reduce. The same math and
        roundings as :meth:`_layers` (the GPU tests compare the two)."""
        G, cfg = self._glue, self.cfg
        H, K, eps = cfg.n_heads, cfg.n_kv_heads, cfg.norm_eps
        r = None
        for li, layer in enumerate(self.stack.layers):
            x, a = G.norm(x, layer.n1, eps, residual=r, quant=_rowwise(layer.wqkv))
            qkv = self._project(a, layer.wqkv, x.dtype)
            q = G.rope_qkv(qkv, cos, sin, self.k_cache[li], self.v_cache[li], slots, H, K)    # [H, T, d]
            o = attend(q, self.k_cache[li], self.v_cache[li])       # or Wo's FP8 input (q, scale)
            y = self.tp_reduce(self._project(o, layer.wo, x.dtype))
            x, m = G.norm(x, layer.n2, eps, residual=y, quant=_rowwise(layer.wgu))
            s = G.silu_mul(self._project(m, layer.wgu, x.dtype), quant=_rowwise(layer.wd))
            r = self.tp_reduce(self._project(s, layer.wd, x.dtype))
        return x if r is None else x + r

    def _tune_small_m(self, rows, say) -> dict:
        """Measure, per FP8 projection shape and decode bucket, the small-M Triton GEMM against
        ``_scaled_mm`` and keep the faster (:func:`tracestory.models.fp8.tune_small_m`)."""
        import time

        from ..models import fp8

        layers = self.stack.layers
        groups = [[getattr(layer, n) for layer in layers] for n in ("wqkv", "wo", "wgu", "wd")]
        if fp8._triton_quant() is None or not any(_rowwise(g[0]) for g in groups):
            return {}
        t0 = time.perf_counter()
        with self.torch.inference_mode():
            rows_out = fp8.tune_small_m(groups, rows)
        chosen = [r for r in rows_out if r["chosen"] != "_scaled_mm"]
        say(f"FP8 small-M GEMM: the Triton kernel measured faster than _scaled_mm for {len(chosen)} of "
            f"{len(rows_out)} (shape, rows) in {time.perf_counter() - t0:.1f} s")
        return {"small_m": rows_out}

    def _project(self, a, w, dtype):
        """``a @ w^T`` where ``a`` may be an FP8 activation ``(q, scale)`` already quantised."""
        if isinstance(a, tuple):
            from ..models.fp8 import scaled_mm

            return scaled_mm(a[0], a[1], w, dtype)
        return self._linear(a, w)

    def _fuse_projections(self) -> bool:
        """One QKV and one gate/up weight per layer (``wqkv``, ``wgu``: rows concatenated, the
        parts become views; an FP8 weight keeps its row-wise scales, so nothing is quantised
        again): at decode one GEMM and one activation quantisation where there were three and
        two. Returns False (nothing changed) where a part cannot be stacked (tensor-wise FP8)."""
        from ..models.fp8 import Fp8Weight

        torch = self.torch
        if all(getattr(layer, "wqkv", None) is not None for layer in self.stack.layers):
            return True                    # stacked by an earlier prepare
        plans = []
        for layer in self.stack.layers:
            groups = []
            for names in (("wq", "wk", "wv"), ("wg", "wu")):
                parts = [getattr(layer, n) for n in names]
                if all(isinstance(p, Fp8Weight) for p in parts):
                    if any(p.mode != "rowwise" or p.bias is not None for p in parts):
                        return False
                elif any(isinstance(p, Fp8Weight) for p in parts):
                    return False
                groups.append(parts)
            plans.append((layer, groups))
        for layer, (qkv, gu) in plans:
            for attr, parts in (("wqkv", qkv), ("wgu", gu)):
                if isinstance(parts[0], Fp8Weight):
                    fused = Fp8Weight.stacked(parts)
                else:
                    fused = torch.cat([p.detach() for p in parts])
                    off = 0
                    names = ("wq", "wk", "wv") if attr == "wqkv" else ("wg", "wu")
                    for n, p in zip(names, parts):
                        view = fused[off:off + p.shape[0]]
                        off += p.shape[0]
                        if isinstance(p, torch.nn.Parameter):
                            view = torch.nn.Parameter(view, requires_grad=False)
                        if isinstance(layer, torch.nn.Module) and n in layer._parameters:
                            del layer._parameters[n]
                        setattr(layer, n, view)
                if isinstance(layer, torch.nn.Module) and attr in layer._parameters:
                    del layer._parameters[attr]
                setattr(layer, attr, fused)
        return True

    def _sample_rows(self, h):
        """Greedy ids of the rows ``h`` ``[n, D]`` into the sampled buffer ``[:n]``."""
        if self._glue is not None:
            last = self._glue.norm(h.contiguous(), self.norm, self.cfg.norm_eps)[1]
        else:
            last = self._rms_norm(h, self.norm, self.cfg.norm_eps)
        logits = self._linear(last, self.lm_head)                       # [n, vocab] (or this rank's slice)
        row_max = self._glue.row_max if self._glue is not None else None  # the same pick, two short kernels
        if self.tp_argmax is not None:
            self._sampled[:h.shape[0]] = self.tp_argmax(logits, row_max=row_max)
        elif row_max is not None:
            self._sampled[:h.shape[0]] = row_max(logits)[1]
        else:
            self._sampled[:h.shape[0]] = logits.float().argmax(-1)

    def _resolve_ids(self, ids):
        """Token ids ``[T]`` with ``-(r+1)`` entries -> ids, from the previous launch's samples."""
        torch = self.torch
        return torch.where(ids >= 0, ids, self._sampled[(-ids - 1).clamp(min=0)])

    # ------------------------------------------------------------------ eager iteration
    def _eager(self, members, ids) -> None:
        import numpy as np

        ids_t = self._to_device(ids)
        if (ids < 0).any():
            ids_t = self._resolve_ids(ids_t)
        x = self.embed[ids_t]
        h = self.forward_hidden(x, [(m.start, m.tokens, m.block_table) for m in members])
        rows, off = [], 0
        for m in members:
            off += m.tokens
            if m.samples:
                rows.append(off - 1)
        if rows:
            self._sample_rows(h[self._to_device(np.asarray(rows, dtype=np.int64))])

    def _decode_static(self, b: int, g) -> None:
        """A decode-only iteration of bucket ``b`` over the static buffers of ``g``
        (:class:`~.graphs.DecodeGraphs`): no host sync, no allocation that depends on the
        batch's contents, so a CUDA graph can replay it."""
        x = self.embed[self._resolve_ids(g.tok[:b])]
        cos, sin = self._rope_tables(g.pos[:b])
        dat = self._decode_attn
        if dat is not None:
            # the paged split-KV kernels read the tables and positions directly; their split count
            # follows from the shapes (bucket, table width), so the graph replays any contents
            tables, pos, bs = g.tables[:b], g.pos[:b], self.block_size
            fused, quant = self._decode_attn_fused, self._decode_attn_quant
            h = self._layers(x, cos, sin, g.slot[:b],
                             lambda q, kc, vc: dat.decode(q, kc, vc, tables, pos, bs, fused=fused, quant=quant))
        else:
            fa = self._flex
            g.tables32[:b].copy_(g.tables[:b])
            g.nblk32[:b].copy_(g.nblk[:b])
            fa.dec_owner[:b].copy_(g.mid[:b])
            fa.dec_pos[:b].copy_(g.pos[:b])
            fa.set_blocks(g.tables[:b], g.mid[:b])
            mask = g.masks[b]
            h = self._layers(x, cos, sin, g.slot[:b], lambda q, kc, vc: fa.decode(q, kc, vc, mask))
        self._sample_rows(h)

    def _sdpa_attend(self, q, kc, vc, lay):
        import torch.nn.functional as F

        torch, cfg = self.torch, self.cfg
        H, T, d = q.shape
        K, g = cfg.n_kv_heads, cfg.group
        rows, B = lay["rows"], lay["rows"].shape[0]
        o = torch.empty(T, H * d, device=q.device, dtype=q.dtype)
        if B:
            # single-token spans (decode) in one SDPA: context padded to the longest, padding masked
            qs = q[:, rows].transpose(0, 1).reshape(B, K, g, d)             # [B, Hkv, g, d]
            ks = kc[lay["pad"]].transpose(1, 2)                              # [B, Hkv, Lmax, d]
            vs = vc[lay["pad"]].transpose(1, 2)
            os_ = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=lay["pad_mask"])
            o[rows] = os_.reshape(B, H * d)
        for off, n, cs, mask in lay["multi"]:
            qm = q[:, off:off + n].reshape(K, g * n, d)                   # [Hkv, g·n, d]
            km, vm = kc[cs].transpose(0, 1), vc[cs].transpose(0, 1)       # [Hkv, ctx, d]
            om = F.scaled_dot_product_attention(qm, km, vm, attn_mask=mask)
            o[off:off + n] = om.reshape(H, n, d).transpose(0, 1).reshape(n, H * d)
        return o

    def _flex_chunk_setup(self, spans):
        """FlexAttention for one iteration (:mod:`.paged_attention`): the leading single-token
        spans through the decode call (padded to a bucket) when the model has decode graphs
        whose buckets and table width hold them, the rest as one chunk query sequence.
        Returns ``(cos, sin, slots, attend)``; every index goes to the device in one copy."""
        import numpy as np

        torch, bs, nb, dev = self.torch, self.block_size, self.num_blocks, self.device
        g = self._graphs
        lead = 0
        if g is not None:
            while lead < len(spans) and spans[lead][1] == 1 and len(spans[lead][2]) <= g.width:
                lead += 1
            lead = min(lead, g.bmax)
        bd = bucket_for(lead, g.buckets) if lead else 0
        pos_l, slot_l, own_l, tabs, tiles = [], [], [], [], []
        off = 0
        width = max(max((len(t) for *_, t in spans), default=1), g.width if bd else 1)
        for i, (start, n, table) in enumerate(spans):
            table = np.asarray(table, dtype=np.int64)
            if len(table) * bs < start + n:
                raise ValueError(f"block table of {len(table)} blocks cannot hold {start + n} tokens")
            p = np.arange(start, start + n, dtype=np.int64)
            pos_l.append(p)
            slot_l.append(table[p // bs] * bs + p % bs)
            own_l.append(np.full(n, i, dtype=np.int64))
            tabs.append(np.pad(table, (0, width - len(table)), constant_values=nb))
            if i >= lead:
                tiles.append((off - lead, n, start, table))
            off += n
        T = off
        tc = T - lead                                  # chunk rows
        rows = (self._chunk_rows(tc) if self.on_cuda else tc) if tc else 0
        fa = self._flex_for(max(rows, bd))
        pos_all = np.concatenate(pos_l)
        parts = [pos_all, np.concatenate(slot_l), np.stack(tabs).ravel()]
        # every chunk a fresh prompt: one variable-length call over the K/V just written (.fresh_attention)
        fresh = bool(tc) and self._fresh and fresh_attention.is_fresh((s, n) for s, n, _t in spans[lead:])
        cu = fresh_attention.offsets([n for _s, n, _t in spans[lead:]], tc, len(spans) - lead) if fresh else None
        if rows:
            kv_num, kv_idx, full_num, full_idx = chunk_tiles(tiles, bs, rows, fa.group)
            if self.on_cuda:          # one compiled shape per row bucket: tile lists as wide as the cache
                kv_idx = np.pad(kv_idx, ((0, 0), (0, fa.chunk_width - kv_idx.shape[1])), mode="edge")
                full_idx = np.pad(full_idx, ((0, 0), (0, fa.chunk_width - full_idx.shape[1])), mode="edge")
            own = np.full(rows, PAD_ROW, dtype=np.int64)
            own[:tc] = np.concatenate(own_l)[lead:]
            pos = np.zeros(rows, dtype=np.int64)
            pos[:tc] = pos_all[lead:]
            parts += [pos, own, kv_num.astype(np.int64), kv_idx.astype(np.int64).ravel(),
                      full_num.astype(np.int64), full_idx.astype(np.int64).ravel()]
        if bd:
            src = np.where(np.arange(bd) < lead, np.arange(bd), 0)       # padding rows repeat row 0
            dtab = np.stack(tabs[:lead])[:, :g.width][src]
            nblk = -(-(pos_all[:lead] + 1) // bs)
            parts += [src, pos_all[:lead][src], nblk[src], dtab.ravel()]
        if fresh:
            parts.append(cu.astype(np.int64))
        buf = self._to_device(np.concatenate(parts))
        cut = np.cumsum([0] + [len(p) for p in parts])
        d = [buf[a:b] for a, b in itertools.pairwise(cut)]
        R = len(spans)
        fa.set_blocks(d[2].view(R, width), torch.arange(R, device=dev))
        slots_n = self.k_cache[0].shape[0]
        chunk_mask = dec_mask = None
        if rows:
            fa.row_pos[:rows] = d[3]
            fa.row_owner[:rows] = d[4]
            chunk_mask = fa.chunk_block_mask(d[5].to(torch.int32), d[6].to(torch.int32).view(kv_idx.shape), rows,
                                             slots_n, d[7].to(torch.int32), d[8].to(torch.int32).view(full_idx.shape))
        if bd:
            k = 9 if rows else 3
            fa.dec_owner[:bd] = d[k]
            fa.dec_pos[:bd] = d[k + 1]
            dec_mask = fa.decode_block_mask(d[k + 3].to(torch.int32).view(bd, g.width), d[k + 2].to(torch.int32),
                                            slots_n)
            dec_rows = d[k]

        if fresh:
            cu_d, chunk_slots = d[-1].to(torch.int32), d[1][lead:]

        def chunk(q, kc, vc):
            if fresh:
                return fresh_attention.attend(q, kc, vc, chunk_slots, cu_d, tc)
            return fa.chunk(q, kc, vc, chunk_mask, rows)

        def attend(q, kc, vc):
            if not bd:
                return chunk(q, kc, vc)
            od = fa.decode(q[:, dec_rows], kc, vc, dec_mask)[:lead]
            if not rows:
                return od
            return torch.cat((od, chunk(q[:, lead:], kc, vc)))

        cos, sin = self._rope_tables(d[0])
        return cos, sin, d[1], attend

    def _chunk_rows(self, tc: int) -> int:
        """Query rows of a chunk call of ``tc`` tokens on CUDA: its compiled bucket (start-up
        buckets, :func:`.mixed.chunk_buckets`), else ``tc`` rounded up to 128."""
        b = bucket_for(tc, self._chunk_buckets) if self._chunk_buckets else None
        return b if b is not None else _round_up(tc, Q_TILE)

    def _mixed_static(self, g, key, dmask, cmask) -> None:
        """A prefill or mixed iteration of bucket ``key = (bd, R)`` over the static buffers of
        ``g`` (:class:`~.mixed.MixedGraphs`): ``bd`` decode rows through the decode graphs'
        attention (the split-KV kernels, else FlexAttention's decoding kernel),
        ``R`` chunk rows through the chunk kernel, every sampled row through the LM head. No host
        sync and no allocation that depends on the contents, so a CUDA graph can replay it."""
        torch = self.torch
        bd, R = key[:2]
        fresh = len(key) > 2 and key[2]
        N = bd + R
        fa = self._flex
        fa.set_blocks(g.mtab, g.mids)
        if bd:
            fa.dec_owner[:bd].copy_(g.didx[:bd])
            fa.dec_pos[:bd].copy_(g.pos[:bd])
        fa.row_owner[:R].copy_(g.rown[:R])
        fa.row_pos[:R].copy_(g.pos[bd:N])
        x = self.embed[self._resolve_ids(g.tok[:N])]
        cos, sin = self._rope_tables(g.pos[:N])
        didx = g.didx[:bd]
        dat = self._decode_attn
        if dat is not None and bd:
            # the decode rows through the decode graphs' paged split-KV kernels: their member's
            # table (padding rows repeat member 0's) and position; plain output (no fused variants:
            # it is concatenated with the chunk rows' output)
            dtables, dpos, bs = g.mtab[didx], g.pos[:bd], self.block_size

        def attend(q, kc, vc):
            if fresh:      # every chunk a fresh prompt: cuDNN or flash over the rows' own K/V (.fresh_attention)
                oc = fresh_attention.attend(q[:, bd:], kc, vc, g.slot[bd:N], g.cu, R)
            else:
                oc = fa.chunk(q[:, bd:], kc, vc, cmask, R)
            if not bd:
                return oc
            if dat is not None:
                return torch.cat((dat.decode(q[:, didx], kc, vc, dtables, dpos, bs), oc))
            return torch.cat((fa.decode(q[:, didx], kc, vc, dmask), oc))

        h = self._layers(x, cos, sin, g.slot[:N], attend)
        self._sample_rows(h[g.srow])

    def _flex_for(self, rows: int) -> FlexPagedAttention:
        fa = self._flex
        if fa is None or fa.row_owner.shape[0] < max(rows, 1):
            if fa is not None and self._graphs is not None:
                raise ValueError(f"{rows} query rows exceed the {fa.row_owner.shape[0]} prepared for")
            fa = self._flex = FlexPagedAttention(num_blocks=self.num_blocks, block_size=self.block_size,
                                                 max_rows=max(rows, 64), device=self.device, compiled=self.on_cuda)
        return fa

    def _warm_chunks(self, rows_max: int, say) -> float:
        """Compile the chunk (mixed-iteration) FlexAttention once per row bucket: a throwaway
        forward over one request of ``rows`` tokens in block 0.. (its K/V are overwritten later).
        That request is a fresh prompt: the fresh-prompt path is held off meanwhile, so the chunk
        kernel (which chunks over cached blocks need) is the one compiled."""
        import time

        t_all = 0.0
        fresh, self._fresh = self._fresh, False
        try:
            for rows in self._chunk_buckets or range(Q_TILE, rows_max + 1, Q_TILE):
                n = min(rows, self.num_blocks * self.block_size)
                table = list(range(-(-n // self.block_size)))
                x = self.embed[:1].expand(n, -1)
                t0 = time.perf_counter()
                self.forward_hidden(x, [(0, n, table)])
                self.torch.cuda.synchronize(self.device)
                dt = time.perf_counter() - t0
                t_all += dt
                say(f"flex chunk attention for {rows} rows compiled in {dt:.1f} s")
        finally:
            self._fresh = fresh
        return t_all

    def _warm_mixed_decode(self, say) -> float:
        """Compile the decode call of mixed iterations (eager, outside the graphs: other strides,
        so other compiled kernels) once per bucket: a throwaway forward over ``b`` single-token
        spans at position 0 of blocks ``0..b-1`` (those slots are rewritten before any read)."""
        import time

        g = self._graphs
        t0 = time.perf_counter()
        for b in g.buckets:
            if b > self.num_blocks:
                break
            x = self.embed[:1].expand(b, -1)
            self.forward_hidden(x, [(0, 1, [i]) for i in range(b)])
        if self.on_cuda:
            self.torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        say(f"flex decode attention of mixed iterations compiled for batch sizes {g.buckets} in {dt:.1f} s")
        return dt

    # ------------------------------------------------------------------ buffers
    def _to_device(self, array):
        """A numpy int64 array on the model's device; on CUDA through pinned memory without
        waiting (a pageable copy would wait for the iteration in flight)."""
        t = self.torch.from_numpy(array)
        if not self.on_cuda:
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def _ensure_sampled(self, rows: int) -> None:
        torch = self.torch
        if self._sampled is None or self._sampled.shape[0] < rows:
            old = self._sampled
            self._sampled = torch.zeros(max(rows, 64), dtype=torch.long, device=self.device)
            if old is not None:
                self._sampled[:old.shape[0]] = old
            if self.on_cuda:
                n = self._sampled.shape[0]
                self._out_ring = [(torch.empty(n, dtype=torch.long, pin_memory=True), torch.cuda.Event())
                                  for _ in range(4)]

    def _fetch(self, who: list[str], path: str, timing: tuple | None = None) -> Launch:
        """Copy the sampled ids to the host without waiting (CUDA) or at once (CPU); the second
        event of ``timing`` (:meth:`_timing_events`) is recorded after that copy."""
        n = len(who)
        if not self.on_cuda:
            return Launch(who, self._sampled[:n].clone(), None, path)
        host, ev = self._out_ring[self._out_next]
        self._out_next = (self._out_next + 1) % len(self._out_ring)
        if n:
            host[:n].copy_(self._sampled[:n], non_blocking=True)
        ev.record()
        if timing is not None:
            timing[1].record()
        return Launch(who, host, ev, path, timing)

    # ------------------------------------------------------------------ helpers
    def _layout(self, spans) -> dict:
        """Index tensors of one forward, built in numpy and copied to the device in one transfer:
        ``pos``/``slots`` of the new tokens; for the single-token spans their rows in the batch,
        their context slots padded to the longest (``pad`` [B, Lmax], padding -> slot 0) and the
        padding mask (None when all contexts are equally long); for longer spans (prefill
        chunks) ``(offset, n, context slots, causal mask)``: query i (position start+i) sees keys
        0..start+i, the mask rows repeated per folded query head."""
        import numpy as np

        torch, bs, dev, g = self.torch, self.block_size, self.device, self.cfg.group
        pos_l, slot_l, single, multi = [], [], [], []
        off = 0
        for start, n, table in spans:
            ctx = start + n
            table = np.asarray(table, dtype=np.int64)
            if len(table) * bs < ctx:
                raise ValueError(f"block table of {len(table)} blocks cannot hold {ctx} tokens")
            p = np.arange(ctx, dtype=np.int64)
            cs = table[p // bs] * bs + p % bs
            pos_l.append(p[start:])
            slot_l.append(cs[start:])
            (single if n == 1 else multi).append((off, start, n, cs))
            off += n
        T, B = off, len(single)
        lmax = max((len(cs) for *_, cs in single), default=0)
        pad = np.zeros((B, lmax), dtype=np.int64)
        for i, (*_, cs) in enumerate(single):
            pad[i, :len(cs)] = cs
        ctxs = np.array([len(cs) for *_, cs in single], dtype=np.int64)
        rows = np.array([o for o, *_ in single], dtype=np.int64)
        buf = torch.from_numpy(np.concatenate(pos_l + slot_l + [rows, ctxs, pad.ravel()] + [cs for *_, cs in multi]))
        buf = self._to_device(buf.numpy())
        cut = np.cumsum([0, T, T, B, B, B * lmax] + [len(cs) for *_, cs in multi])
        part = [buf[a:b] for a, b in itertools.pairwise(cut)]
        out = {"pos": part[0], "slots": part[1], "rows": part[2], "pad": part[4].view(B, lmax), "pad_mask": None}
        if B and (ctxs != lmax).any():
            keys = torch.arange(lmax, device=dev)
            out["pad_mask"] = (keys[None, :] < part[3][:, None]).view(B, 1, 1, lmax)
        out["multi"] = []
        for (o, start, n, cs), dcs in zip(multi, part[5:]):
            keys, qpos = torch.arange(len(cs), device=dev), torch.arange(start, start + n, device=dev)
            out["multi"].append((o, n, dcs, (keys[None, :] <= qpos[:, None]).repeat(g, 1)))
        return out
