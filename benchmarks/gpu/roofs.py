"""The roofs a serving run is judged against, measured on this GPU in the same run.

* dense GEMM rate: ``M = N = K = 8192`` bf16 ``torch.mm``, and FP8 e4m3 ``torch._scaled_mm`` with
  row-wise scales (the kernel ``serve --fp8 rowwise`` calls), FLOPs ``2 M N K`` per call;
* copy roof: a 1 GiB device-to-device copy, bytes read + written.

Each is the best of 20 timed calls (CUDA events, after 5 warm-ups), and the median is printed too.
Usage: python benchmarks/gpu/roofs.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def cuda_times(fn, reps=20, warm=5):
    """(min, median) seconds of ``fn`` over ``reps`` calls timed by CUDA events, after ``warm`` calls."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return min(out), statistics.median(out)


def captured_graph(calls, reps: int, warm: int) -> torch.cuda.CUDAGraph:
    """One CUDA graph of ``reps`` calls ``calls[i % len(calls)]()``, captured after ``warm`` such calls
    on a side stream (as capture needs); time its ``replay`` with :func:`cuda_times`."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(warm):
            calls[i % len(calls)]()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            calls[i % len(calls)]()
    torch.cuda.synchronize()
    return g


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    best, med = cuda_times(lambda: torch.mm(x, w))
    res = {"gpu": torch.cuda.get_device_name(), "bf16_gemm_tflops": 2 * n**3 / best / 1e12,
           "bf16_gemm_tflops_median": 2 * n**3 / med / 1e12}
    xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    sx = torch.ones(n, 1, device="cuda", dtype=torch.float32)
    sw = torch.ones(1, n, device="cuda", dtype=torch.float32)
    try:
        best, med = cuda_times(lambda: torch._scaled_mm(xf, wf.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16))
        res.update(fp8_rowwise_gemm_tflops=2 * n**3 / best / 1e12, fp8_rowwise_gemm_tflops_median=2 * n**3 / med / 1e12)
    except RuntimeError as e:
        res["fp8_error"] = str(e)[:200]
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    best, med = cuda_times(lambda: dst.copy_(src), reps=10)
    res.update(copy_tbps=2 * 2**30 / best / 1e12, copy_tbps_median=2 * 2**30 / med / 1e12)
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
