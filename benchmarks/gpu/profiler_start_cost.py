"""How long torch.profiler's start and stop block the calling thread on a GPU: cold ("late"),
after an early ``prepare_trace()`` ("early": Kineto's warm-up, CUPTI set up ahead of the
recorded window), and after a throw-away start/stop on the main thread before the work
("primed").

Each mode runs in a fresh process (CUPTI is initialized once per process). A thread launches
``--iters`` iterations of ``--kernels`` small kernels; the profiler records iterations
[skip, skip+count). Prints one JSON line per mode: start/stop durations, the longest
iteration outside the window, kernels in the trace, peak host RSS.
"""
import argparse, gzip, json, resource, subprocess, sys, threading, time


def child(mode: str, iters: int, kernels: int, skip: int, count: int, out: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(256, 256, device="cuda")
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    res = {"mode": mode}
    durs = []
    if mode == "primed":
        a = time.perf_counter_ns()
        p0 = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        p0.start(); p0.stop()
        res["prime_ms"] = (time.perf_counter_ns() - a) / 1e6

    def engine():
        nonlocal x
        for i in range(iters):
            t0 = time.perf_counter_ns()
            if mode == "early" and i == 0:
                a = time.perf_counter_ns(); prof.prepare_trace(); res["prepare_ms"] = (time.perf_counter_ns() - a) / 1e6
            if i == skip:
                a = time.perf_counter_ns()
                (prof.start_trace if mode == "early" else prof.start)()
                res["start_ms"] = (time.perf_counter_ns() - a) / 1e6
            for _ in range(kernels):
                x = x * 1.0001
            torch.cuda.synchronize()
            if i == skip + count - 1:
                a = time.perf_counter_ns()
                (prof.stop_trace if mode == "early" else prof.stop)()
                res["stop_ms"] = (time.perf_counter_ns() - a) / 1e6
            durs.append((time.perf_counter_ns() - t0) / 1e6)

    t = threading.Thread(target=engine); t.start(); t.join()
    prof.export_chrome_trace(out)
    with gzip.open(out, "rt") as f:
        ev = json.load(f)["traceEvents"]
    res["kernels_in_trace"] = sum(1 for e in ev if e.get("cat") == "kernel")
    res["expected_kernels"] = count * kernels
    res["iteration_ms_median"] = sorted(durs)[len(durs) // 2]
    res["iteration_ms_at_prepare"] = durs[0]
    res["iteration_ms_at_start"] = durs[skip]
    res["iteration_ms_at_stop"] = durs[skip + count - 1]
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=700)
    ap.add_argument("--kernels", type=int, default=1000)
    ap.add_argument("--skip", type=int, default=600)
    ap.add_argument("--count", type=int, default=24)
    ap.add_argument("--child", choices=("late", "early", "primed"))
    ap.add_argument("--modes", default="late,early,late,early")
    ap.add_argument("--out", default="/tmp/psc.json.gz")
    a = ap.parse_args()
    if a.child:
        child(a.child, a.iters, a.kernels, a.skip, a.count, a.out)
    else:
        for mode in a.modes.split(","):
            subprocess.run([sys.executable, __file__, "--child", mode, "--iters", str(a.iters), "--kernels",
                            str(a.kernels), "--skip", str(a.skip), "--count", str(a.count), "--out", a.out])
