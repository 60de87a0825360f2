"""Make the graph-replay and FlexAttention fixtures in this folder (run on one CUDA GPU).

    python3 tests/data/graphs/capture_graph_fixtures.py OUT_DIR

A small Llama-shaped decoder (4 layers, d=2048, 16 heads of 128, SwiGLU 5632, bf16, batch 4,
KV cache of 512 tokens) decodes one token per step under torch.profiler (record_shapes, a
schedule of wait 1, warmup 1, active 2, so the trace holds ProfilerStep#2 and #3). Each case is
one trace file:

* ``reduce_overhead_decode``: the step under ``torch.compile(mode="reduce-overhead")`` (Inductor
  kernels replayed from a CUDA graph by cudaGraphLaunch), in ``record_function("decode_graph")``.
* ``manual_graph_decode``: the eager step captured once with ``torch.cuda.CUDAGraph`` and replayed
  (``graph.replay()``) in ``record_function("decode_graph")``.
* ``mixed_graph_eager``: the layers replayed from a manual CUDA graph, then sampling (lm-head
  GEMM, softmax, top-k, multinomial) launched eagerly in ``record_function("decode_eager")``.
* ``flex_prefill_decode``: FlexAttention (compiled ``flex_attention``): a 512-token causal
  prefill with a block mask in ``record_function("prefill")``, then one decode step (query
  length 1 against the 512 cached tokens and its own) in ``record_function("decode")``.

Everything else (weights, inputs) is random; nothing is downloaded.
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function, schedule

D, H, HD, FF, LAYERS, B, KV = 2048, 16, 128, 5632, 4, 4, 512
DT = torch.bfloat16
DEV = "cuda"


def weights():
    g = torch.Generator(device=DEV).manual_seed(0)
    w = []
    for _ in range(LAYERS):
        w.append({
            "qkv": torch.randn(3 * D, D, device=DEV, dtype=DT, generator=g) * 0.02,
            "o": torch.randn(D, D, device=DEV, dtype=DT, generator=g) * 0.02,
            "up": torch.randn(2 * FF, D, device=DEV, dtype=DT, generator=g) * 0.02,
            "down": torch.randn(D, FF, device=DEV, dtype=DT, generator=g) * 0.02,
            "n1": torch.ones(D, device=DEV, dtype=DT), "n2": torch.ones(D, device=DEV, dtype=DT),
        })
    return w


def rms(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-5)


def layer_decode(x, lw, k_cache, v_cache, attend):
    """x: [B, 1, D]; caches: [B, H, KV, HD]; attends over the KV cached tokens and the new one."""
    q, k, v = F.linear(rms(x, lw["n1"]), lw["qkv"]).split(D, dim=-1)
    q = q.view(B, 1, H, HD).transpose(1, 2)
    # The new token's key and value join the cache without writing into it (a step that mutates
    # its inputs is not replayed from a CUDA graph by reduce-overhead).
    k = torch.cat([k_cache, k.view(B, 1, H, HD).transpose(1, 2)], dim=2)
    v = torch.cat([v_cache, v.view(B, 1, H, HD).transpose(1, 2)], dim=2)
    a = attend(q, k, v).transpose(1, 2).reshape(B, 1, D)
    x = x + F.linear(a, lw["o"])
    gate, up = F.linear(rms(x, lw["n2"]), lw["up"]).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, lw["down"])


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


class Decoder(torch.nn.Module):
    """Weights and KV caches as buffers: static to CUDA graphs, so reduce-overhead copies only
    the step's input, as a serving engine's static decode buffers are."""

    def __init__(self, w, caches, attend=sdpa):
        super().__init__()
        self.attend = attend
        for i, (lw, (kc, vc)) in enumerate(zip(w, caches)):
            for name, t in lw.items():
                self.register_buffer(f"l{i}_{name}", t)
            self.register_buffer(f"l{i}_k", kc)
            self.register_buffer(f"l{i}_v", vc)

    def forward(self, x):
        for i in range(LAYERS):
            lw = {n: getattr(self, f"l{i}_{n}") for n in ("qkv", "o", "up", "down", "n1", "n2")}
            x = layer_decode(x, lw, getattr(self, f"l{i}_k"), getattr(self, f"l{i}_v"), self.attend)
        return x


def make_step(w, caches, attend=sdpa):
    return Decoder(w, caches, attend)


def run(out: Path, name: str, body):
    """Profile ``body()`` for 4 steps with a (1, 1, 2) schedule into ``out/name.trace.json.gz``."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=2)) as prof:
        for _ in range(4):
            body()
            torch.cuda.synchronize()
            prof.step()
    raw = out / f"{name}.trace.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as f, gzip.open(str(raw) + ".gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    raw.unlink()
    print(name, (out / f"{name}.trace.json.gz").stat().st_size, "bytes")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    w = weights()
    caches = [(torch.randn(B, H, KV, HD, device=DEV, dtype=DT), torch.randn(B, H, KV, HD, device=DEV, dtype=DT))
              for _ in range(LAYERS)]
    x = torch.randn(B, 1, D, device=DEV, dtype=DT)
    step = make_step(w, caches)
    lm_head = torch.randn(32000, D, device=DEV, dtype=DT) * 0.02

    # reduce-overhead: Inductor + CUDA graphs
    compiled = torch.compile(step, mode="reduce-overhead")
    for _ in range(5):
        compiled(x)

    def ro():
        with record_function("decode_graph"):
            compiled(x)
    run(out, "reduce_overhead_decode", ro)

    # manual CUDA graph of the eager step
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step(static_x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step(static_x)

    def manual():
        with record_function("decode_graph"):
            graph.replay()
    run(out, "manual_graph_decode", manual)

    def mixed():
        with record_function("decode_graph"):
            graph.replay()
        with record_function("decode_eager"):
            logits = F.linear(static_out[:, -1], lm_head).float()
            probs = torch.softmax(logits / 0.8, dim=-1)
            top = torch.topk(probs, 50, dim=-1)
            torch.multinomial(top.values, 1)
    run(out, "mixed_graph_eager", mixed)

    # FlexAttention prefill (causal block mask) and decode
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention)
    S = KV

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    mask = create_block_mask(causal, B=None, H=None, Q_LEN=S, KV_LEN=S, device=DEV)
    q = torch.randn(B, H, S, HD, device=DEV, dtype=DT)
    k = torch.randn(B, H, S, HD, device=DEV, dtype=DT)
    v = torch.randn(B, H, S, HD, device=DEV, dtype=DT)
    flex_step = make_step(w, caches, attend=lambda q1, kc, vc: flex(q1, kc, vc))
    for _ in range(3):
        flex(q, k, v, block_mask=mask)
        flex_step(x)

    def flex_body():
        with record_function("prefill"):
            flex(q, k, v, block_mask=mask)
        with record_function("decode"):
            flex_step(x)
    run(out, "flex_prefill_decode", flex_body)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "graph_fixtures"))
