"""The fresh-prompt kernels on a CUDA GPU (run on the device machine): cuDNN's graphs per bucket
(:mod:`tracestory.serve.fresh_cudnn`, built by :func:`~tracestory.serve.fresh_attention.prepare`)
and flash's call against :func:`~tracestory.serve.fresh_attention.reference` (masked SDPA in
float32, another implementation), on the server's bucket shapes (llama-3-8b heads, bf16, 33
sequences: members, padding rows, empty sequences), eagerly and replayed from a CUDA graph
captured on another layout of the bucket; the start-up choice. Needs ``nvidia-cudnn-frontend``.

Tolerance 0.02: bf16 inputs and output against a float32 reference (the benchmark measured
0.0079-0.0090 for both kernels on these layouts, docs/BENCHMARKS.md "Faster kernels for fresh
prompts, tried")."""

import pytest
import torch

from tracestory.serve import fresh_attention as fresh

pytestmark = pytest.mark.gpu

H, KH, D, M, TOL = 32, 8, 128, 32, 0.02
BUCKETS = [512, 1024, 2048]
LAYOUTS = [((2048,), 2048), ((700, 900), 2048), ((128,) * 16, 2048), ((1024, 1024), 2048),
           ((300, 200, 250), 1024), ((512,), 512), ((1,), 512)]


@pytest.fixture(scope="module")
def prepared():
    """cuDNN chosen (auto) and built for the buckets, as the model's prepare() does."""
    mp = pytest.MonkeyPatch()
    mp.delenv(fresh.ENV, raising=False)
    said = []
    got = fresh.prepare(BUCKETS, M + 1, H, KH, D, torch.bfloat16, torch.device("cuda"), said.append)
    yield got, said
    fresh._graphs.clear()
    fresh.info.clear()
    mp.undo()


def _case(lengths, R, gen):
    q = torch.randn(R, H, D, generator=gen, device="cuda").to(torch.bfloat16)
    k = torch.randn(R, KH, D, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(R, KH, D, generator=gen, device="cuda").to(torch.bfloat16)
    cu = torch.tensor(fresh.offsets(lengths, R, M + 1), device="cuda")
    return q, k, v, cu, fresh.reference(q.float(), k.float(), v.float(), cu)


def _err(o, ref):      # every row: the members and the padding rows' own sequence
    return (o.float() - ref).abs().max().item()


def test_auto_chooses_cudnn_on_this_gpu_and_says_so_once(prepared):
    got, said = prepared
    assert got["kernel"] == "cudnn", got
    assert got["buckets"] == BUCKETS
    assert said == [f"fresh-prompt attention: cudnn ({got['reason']})"]


@pytest.mark.parametrize("kernel", ["run", "flash_call"])
def test_kernel_matches_the_reference_eagerly_and_from_a_graph(prepared, kernel):
    """``run``: the prepared cuDNN graph of each bucket (checked to be the one that ran)."""
    call = getattr(fresh, kernel)
    gen = torch.Generator(device="cuda").manual_seed(11)
    graphs = {}
    for lengths, R in LAYOUTS:
        q, k, v, cu, ref = _case(lengths, R, gen)
        if kernel == "run":
            assert fresh._key(q.device, R, M + 1, H, KH, D, q.dtype) in fresh._graphs
        assert _err(call(q, k, v, cu, R), ref) < TOL, (kernel, lengths)
        if R not in graphs:       # captured on one whole-bucket prompt, replayed on this layout
            static = [torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v),
                      torch.tensor(fresh.offsets([R], R, M + 1), device="cuda")]
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                call(*static, R)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = call(*static, R)
            graphs[R] = (g, static, out)
        g, static, out = graphs[R]
        for dst, src in zip(static, (q, k, v, cu), strict=True):
            dst.copy_(src)
        g.replay()
        assert _err(out, ref) < TOL, (kernel, "graph", lengths)


def test_attend_gathers_and_takes_the_prepared_graph(prepared, monkeypatch):
    """``attend`` (the gather at the rows' slots, then :func:`run`) on a bucket: the cuDNN graph
    runs (flash made to fail) and matches the reference on the gathered rows."""
    monkeypatch.setattr(fresh, "flash_call", lambda *a: pytest.fail("flash ran where a cuDNN graph was prepared"))
    gen = torch.Generator(device="cuda").manual_seed(5)
    S, R, lengths = 4096, 1024, (600, 300)
    kc = torch.randn(S, KH, D, generator=gen, device="cuda").to(torch.bfloat16)
    vc = torch.randn(S, KH, D, generator=gen, device="cuda").to(torch.bfloat16)
    q = torch.randn(H, R, D, generator=gen, device="cuda").to(torch.bfloat16)
    slots = torch.randperm(S, generator=gen, device="cuda")[:R]
    cu = torch.tensor(fresh.offsets(lengths, R, M + 1), device="cuda")
    o = fresh.attend(q, kc, vc, slots, cu, R)
    ref = fresh.reference(q.transpose(0, 1).float(), kc[slots].float(), vc[slots].float(), cu).reshape(R, H * D)
    assert _err(o, ref) < TOL


def test_flash_asked_for_drops_the_graphs(monkeypatch):
    monkeypatch.setenv(fresh.ENV, "flash")
    got = fresh.prepare([512], M + 1, H, KH, D, torch.bfloat16, torch.device("cuda"))
    assert got == {"kernel": "flash", "reason": "TRACESTORY_FRESH_ATTN=flash", "buckets": []}
    assert fresh._graphs == {}
