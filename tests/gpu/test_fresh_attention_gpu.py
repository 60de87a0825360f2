"""The fresh-prompt kernels on a CUDA GPU (run on the device machine): cuDNN's and flash's
variable-length calls against :func:`~tracestory.serve.fresh_attention.reference` (masked SDPA in
float32, another implementation), on the server's bucket shapes (llama-3-8b heads, bf16), eagerly
and replayed from a CUDA graph captured on another layout of the bucket; the start-up choice.

Tolerance 0.02: bf16 inputs and output against a float32 reference (the benchmark measured
0.0085-0.0099 for every variant on 2,048 rows, docs/BENCHMARKS.md "Fresh-prompt attention")."""

import pytest
import torch

from tracestory.serve import fresh_attention as fresh

pytestmark = pytest.mark.gpu

H, KH, D, M, TOL = 32, 8, 128, 32, 0.02
LAYOUTS = [((2048,), 2048), ((700, 900), 2048), ((128,) * 16, 2048), ((300, 200, 250), 1024), ((512,), 512)]


def _case(lengths, R, gen):
    q = torch.randn(R, H, D, generator=gen, device="cuda").to(torch.bfloat16)
    k = torch.randn(R, KH, D, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(R, KH, D, generator=gen, device="cuda").to(torch.bfloat16)
    cu = torch.tensor(fresh.offsets(lengths, R, M + 1), device="cuda")
    ref = fresh.reference(q.float(), k.float(), v.float(), cu)
    return q, k, v, cu, ref


def _err(o, ref, n):
    return (o[:n].float() - ref[:n]).abs().max().item()


@pytest.mark.parametrize("kernel", ["cudnn_call", "flash_call"])
def test_kernel_matches_the_reference_eagerly_and_from_a_graph(kernel):
    call = getattr(fresh, kernel)
    gen = torch.Generator(device="cuda").manual_seed(11)
    graphs = {}
    for lengths, R in LAYOUTS:
        q, k, v, cu, ref = _case(lengths, R, gen)
        n = sum(lengths)
        assert _err(call(q, k, v, cu, R), ref, n) < TOL, (kernel, lengths)
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
        assert _err(out, ref, n) < TOL, (kernel, "graph", lengths)


def test_start_up_choice_and_attend(monkeypatch):
    """On an H100 with torch's cuDNN the probe passes and ``auto`` picks cuDNN (said once); with
    ``TRACESTORY_FRESH_ATTN=flash`` flash. ``attend`` (the gather at the rows' slots, then the
    chosen kernel) matches the reference on a bucket either way."""
    said = []
    monkeypatch.setattr(fresh, "info", {})
    monkeypatch.delenv(fresh.ENV, raising=False)
    assert fresh.probe(H, KH, D, torch.bfloat16, torch.device("cuda")) == ""
    got = fresh.choose(H, KH, D, torch.bfloat16, torch.device("cuda"), said.append)
    assert got["kernel"] == "cudnn" and len(said) == 1 and said[0].startswith("fresh-prompt attention: cudnn")
    assert fresh.choose(H, KH, D, torch.bfloat16, torch.device("cuda"), said.append) is got and len(said) == 1

    gen = torch.Generator(device="cuda").manual_seed(5)
    lengths, R, S = (700, 900), 2048, 8192
    kc = torch.randn(S, KH, D, generator=gen, device="cuda").to(torch.bfloat16)
    vc = torch.randn(S, KH, D, generator=gen, device="cuda").to(torch.bfloat16)
    slots = torch.randperm(S, generator=gen, device="cuda")[:R]
    q = torch.randn(H, R, D, generator=gen, device="cuda").to(torch.bfloat16)
    cu = torch.tensor(fresh.offsets(lengths, R, M + 1), device="cuda")
    ref = fresh.reference(q.transpose(0, 1).float(), kc[slots].float(), vc[slots].float(), cu).reshape(R, H * D)
    for mode in ("cudnn", "flash"):
        monkeypatch.setattr(fresh, "info", {})
        monkeypatch.setenv(fresh.ENV, mode)
        o = fresh.attend(q, kc, vc, slots, cu, R)
        assert fresh.info["kernel"] == mode
        assert o.shape == (R, H * D) and _err(o, ref, sum(lengths)) < TOL, mode
