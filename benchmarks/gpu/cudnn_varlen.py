"""Why cuDNN's variable-length SDPA (``aten._cudnn_attention_forward`` with ``cum_seq_q/k``) is slow
and not capturable for the fresh-prompt path: one call per case, timed four ways (one GPU).

Cases (llama-3-8b heads: 32 query heads, 8 KV heads, d = 128, bf16; 2,048 rows):

* ``server``: two 1,024-token prompts in a 2,048-row bucket as the server lays them out (33
  sequences: the members, then empty ones; ``max_q = max_k = 2048``), no log-sum-exp;
* ``server_lse``: the same with the log-sum-exp (as ``torch.nn.attention.varlen`` asks for it);
* ``members``: only the two members (``cu = [0, 1024, 2048]``), ``max = 2048``;
* ``members_max``: the same with ``max = 1024``;
* ``one``: one 2,048-token prompt (``cu = [0, 2048]``);
* ``members_mha``: ``members`` with K/V repeated to 32 heads (no grouped-query heads).

For each: the first call (wall, synchronised), the median of 10 eager calls by CUDA events, the
host time per call (no sync), the device time of its kernels and their names over 3 profiled calls
(torch.profiler), and the CUDA runtime calls made there (allocations, copies, syncs), and the max
abs error against ``fresh_attention.reference`` in float32. ``--capture CASE`` instead tries a CUDA
graph capture of one case and a replay (run it in its own process: a failed capture leaves the
process's CUDA generator unusable).

Usage: python benchmarks/gpu/cudnn_varlen.py [--capture CASE]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

import torch

from tracestory.serve import fresh_attention as fresh

H, KH, D, R, M = 32, 8, 128, 2048, 32


def cudnn(q, k, v, cu, mx, lse):
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, mx, mx, lse, 0.0, True, False)[0]


def cases():
    g = torch.Generator().manual_seed(0)           # CPU generator: no CUDA RNG state involved

    def rnd(*s):
        return torch.randn(*s, generator=g).to("cuda", torch.bfloat16)

    q, k, v = rnd(R, H, D), rnd(R, KH, D), rnd(R, KH, D)
    server = torch.tensor(fresh.offsets([1024, 1024], R, M + 1), device="cuda")
    two = torch.tensor([0, 1024, 2048], device="cuda", dtype=torch.int32)
    one = torch.tensor([0, 2048], device="cuda", dtype=torch.int32)
    kr, vr = k.repeat_interleave(H // KH, 1), v.repeat_interleave(H // KH, 1)
    return {"server": (q, k, v, server, R, False), "server_lse": (q, k, v, server, R, True),
            "members": (q, k, v, two, R, False), "members_max": (q, k, v, two, 1024, False),
            "one": (q, k, v, one, R, False), "members_mha": (q, kr, vr, two, R, False)}


def measure(name, args):
    q, k, v, cu, mx, lse = args
    ref = fresh.reference(q.float(), k.float(), v.float(), cu)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    o = cudnn(*args)
    torch.cuda.synchronize()
    first = (time.perf_counter() - t0) * 1e3
    err = (o.float() - ref).abs().max().item()
    for _ in range(2):
        cudnn(*args)
    torch.cuda.synchronize()
    ev = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        cudnn(*args)
        b.record()
        b.synchronize()
        ev.append(a.elapsed_time(b))
    t0 = time.perf_counter()
    for _ in range(10):
        cudnn(*args)
    host = (time.perf_counter() - t0) * 1e3 / 10
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            cudnn(*args)
        torch.cuda.synchronize()
    kern, api = collections.Counter(), collections.Counter()
    dev_us = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kern[e.name[:80]] += 1
            dev_us += e.device_time
        elif e.name.startswith("cuda") or e.name.startswith("cu"):
            api[e.name] += 1
    r = {"case": name, "first_ms": round(first, 2), "event_ms_median": round(statistics.median(ev), 4),
         "host_ms_per_call": round(host, 3), "kernel_us_per_call": round(dev_us / 3, 2),
         "kernels": dict(kern.most_common(4)), "runtime_calls": dict(api.most_common(8)), "max_abs_err": err}
    print(json.dumps(r), flush=True)


def capture(name, args):
    q, k, v, cu, mx, lse = args
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        cudnn(*args)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            out = cudnn(*args)
        g.replay()
        torch.cuda.synchronize()
        ref = fresh.reference(q.float(), k.float(), v.float(), cu)
        print(json.dumps({"case": name, "capture": "ok", "max_abs_err": (out.float() - ref).abs().max().item()}))
    except Exception as e:  # noqa: BLE001 -- the finding
        print(json.dumps({"case": name, "capture": "failed", "error": " ".join(str(e).split())[:240]}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--capture")
    a = ap.parse_args()
    c = cases()
    if a.capture:
        capture(a.capture, c[a.capture])
        return
    for name, args in c.items():
        try:
            measure(name, args)
        except Exception as e:  # noqa: BLE001 -- report and go on
            print(json.dumps({"case": name, "error": " ".join(str(e).split())[:240]}), flush=True)


if __name__ == "__main__":
    main()
