# %% [markdown]
# # tracestory in a notebook
#
# A tour of the Python API on the H200 Llama trace kept in the repository (two Llama-2 style
# decoder layers, prefill then decode, eager PyTorch). Each `# %%` block is one notebook cell:
# VS Code and Jupytext open this file as a notebook; `python3 examples/notebook_tour.py` runs it
# as a script. It needs pandas (`pip install pandas`).

# %%
from pathlib import Path

import pandas as pd

import tracestory

pd.set_option("display.width", 160)
pd.set_option("display.max_columns", 12)
pd.set_option("display.max_colwidth", 48)

TRACE = Path(__file__).resolve().parents[1] / "tests" / "data" / "h200" / "llama2layer_eager_decode.trace.json.gz"

# %% [markdown]
# ## Load: one Trace, columnar, kernels as a DataFrame with real names

# %%
trace = tracestory.load(TRACE)
print(trace)
kernels = trace.kernels_frame()
print(kernels[["name", "dur_ns", "grid_x", "block_x"]].head())

# %% [markdown]
# Plain pandas from here: GPU time per kernel name, in ns.

# %%
per_name = kernels.groupby("name")["dur_ns"].agg(["count", "sum", "median"]).sort_values("sum", ascending=False)
print(per_name.head())

# %% [markdown]
# ## Analyze: every result computed once, then named tables

# %%
results = tracestory.analyze(trace)
print(results)

# %%
# per kernel name, as `nsys stats --report cuda_gpu_kern_sum` reports it
print(results.table("kernels").to_pandas().head())

# %%
# GPU time per kernel category, with the Amdahl ceiling of making each one free
print(results.table("categories").to_pandas()[["category", "count", "total_ns", "share", "amdahl_max_speedup"]])

# %%
# the phases the trace's annotations mark (prefill, decode steps)
print(results.table("phases").to_pandas()[["name", "wall_ns", "gpu_busy_ns", "kernels"]].head())

# %% [markdown]
# ## GPU time per operator
#
# Each kernel goes to the CPU op that launched it (correlation id -> launch call -> the ops
# around it); the top-level op groups by name and input shapes.

# %%
ops = results.table("ops").to_pandas()
print(ops[["name", "input_dims", "calls", "kernels", "total_ns", "share"]].head(10))
print(f"top-level op groups: {len(ops)}; their shares sum to {ops['share'].sum():.3f}")

# %%
# the innermost op instead: which aten call launched the kernel
print(results.table("leaf_ops").to_pandas()[["name", "input_dims", "total_ns", "share"]].head(5))

# %% [markdown]
# Any table also goes to Arrow, CSV or Markdown: `table.to_arrow()`, `table.to_csv(path)`,
# `table.to_markdown()`; on the command line, `tracestory analyze TRACE --table ops --format csv`.

# %% [markdown]
# ## Kernels with what the analysis knows about them
#
# `results.kernels_frame()` is the kernel frame above plus each kernel's category, the phase
# that launched it and the CPU op around its launch (`op`, innermost; `top_op`, outermost).

# %%
frame = results.kernels_frame()
print(frame.groupby(["phase", "category"])["dur_ns"].sum().unstack(fill_value=0).head())

# %% [markdown]
# ## Findings as typed records, and the CPU op under each idle gap

# %%
for f in results.findings[:3]:
    print(f"[{f.severity}] {f.title}  ({f.rule}; {len(f.evidence)} numbers)")

# %%
gaps = results.table("gaps").to_pandas()
print(gaps.sort_values("dur_ns", ascending=False)[["dur_ns", "launch_wait_ns", "cpu_op"]].head(3))
