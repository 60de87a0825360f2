"""Writes the two hand-built inputs of this folder (no real file of these kinds was found; see
tests/data/PROVENANCE.md). Run from the repository root: ``python3 tests/data/kinds/make_hand_built.py``.

* ``stream_capture_small.json.gz``: the shape torch.profiler writes when the profiled window
  captures a CUDA graph (``torch.cuda.graph``) and replays nothing: a ``cudaStreamBeginCapture``
  ... ``cudaStreamEndCapture`` pair on the main thread with 300 ``cudaLaunchKernel`` calls inside
  (captured: no kernel event, no flow), one ``cudaGraphInstantiate``, and before the capture two
  fill kernels launched and run directly (``cudaLaunchKernel`` with correlation ids and their
  ``kernel`` events). Event fields as in the torch 2.x traces of tests/data/graphs.
* ``nsys_stats_column_format.txt``: ``nsys stats`` output in its default column format (the
  table layout printed without ``--format csv``), as printed by Nsight Systems 2023.2 for a
  one-kernel vector add in public notes.
"""

import gzip
import json
from pathlib import Path

HERE = Path(__file__).parent
FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")


def stream_capture() -> dict:
    pid, tid = 4242, 4242
    ev = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}}]
    t = 1_000_000.0
    corr = 100
    for i in range(2):  # two fills run before the capture
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::fill_", "pid": pid, "tid": tid, "ts": t, "dur": 8.0,
                   "args": {"External id": 10 + i}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                   "ts": t + 2.0, "dur": 4.0, "args": {"External id": 10 + i, "correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": FILL, "pid": 0, "tid": 7, "ts": t + 10.0, "dur": 1.5,
                   "args": {"External id": 10 + i, "correlation": corr, "device": 0, "stream": 7,
                            "grid": [1, 1, 1], "block": [128, 1, 1]}})
        t += 20.0
        corr += 1
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamBeginCapture", "pid": pid, "tid": tid,
               "ts": t, "dur": 3.0, "args": {"correlation": corr}})
    corr += 1
    t += 5.0
    for i in range(300):  # captured: recorded into the graph, no kernel runs
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": pid, "tid": tid, "ts": t, "dur": 6.0,
                   "args": {"External id": 100 + i}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                   "ts": t + 1.0, "dur": 3.0, "args": {"External id": 100 + i, "correlation": corr}})
        t += 8.0
        corr += 1
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamEndCapture", "pid": pid, "tid": tid,
               "ts": t, "dur": 40.0, "args": {"correlation": corr}})
    ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphInstantiate", "pid": pid, "tid": tid,
               "ts": t + 50.0, "dur": 900.0, "args": {"correlation": corr + 1}})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9,
                                                       "computeMinor": 0, "numSms": 132}],
            "traceEvents": ev, "traceName": "stream_capture_small.json"}


STATS = """Generating SQLite file report1.sqlite from report1.nsys-rep
Processing [report1.sqlite] with [/opt/nvidia/nsight-systems/2023.2.3/host-linux-x64/reports/cuda_gpu_kern_sum.py]... 

 ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):

 Time (%)  Total Time (ns)  Instances  Avg (ns)  Med (ns)  Min (ns)  Max (ns)  StdDev (ns)                             Name                            
 --------  ---------------  ---------  --------  --------  --------  --------  -----------  -----------------------------------------------------------
    100.0             5087          1    5087.0    5087.0      5087      5087          0.0  vectorAddKernel(const float *, const float *, float *, int)

"""

if __name__ == "__main__":
    (HERE / "stream_capture_small.json.gz").write_bytes(
        gzip.compress(json.dumps(stream_capture()).encode(), compresslevel=9, mtime=0))
    (HERE / "nsys_stats_column_format.txt").write_text(STATS)
