"""TraceLens side of the peer benchmark: load one PyTorch trace, get the GPU timeline and kernel tables.

Run with the Python of a venv that has TraceLens installed from source (github AMD-AGI/TraceLens)::

    python tracelens_run.py TRACE.json[.gz] RESULT.json

It does what a TraceLens user does for a first look -- ``TreePerfAnalyzer.from_file(path)`` (parse
and build the CPU-op / kernel tree), then ``get_df_gpu_timeline()`` (busy, idle, computation,
communication, memcpy) and ``get_df_kernels()`` (one row per kernel with its launching op) -- and
writes the kernel count and time sum to RESULT.json so the parent can compare them with
tracestory's. Imports are part of the measured time, as they are for the ``tracestory`` CLI.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("result")
    a = p.parse_args()
    t0 = time.perf_counter()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    from TraceLens import TreePerfAnalyzer

    t_import = time.perf_counter()
    perf = TreePerfAnalyzer.from_file(a.trace)
    t_load = time.perf_counter()
    timeline = perf.get_df_gpu_timeline()
    kernels = perf.get_df_kernels()
    t_tables = time.perf_counter()
    dur_col = next((c for c in kernels.columns if "dur" in c.lower()), None)
    out = {
        "timeline": {str(r.iloc[0]): float(r.iloc[1]) for _, r in timeline.iterrows()},
        "kernel_rows": len(kernels),
        "kernel_dur_column": dur_col,
        "kernel_dur_sum": float(kernels[dur_col].sum()) if dur_col else None,
        "seconds": {"import": t_import - t0, "load": t_load - t_import, "tables": t_tables - t_load},
    }
    with open(a.result, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
