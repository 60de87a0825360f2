"""The names of the tables of :meth:`Results.table <tracestory.analysis.results.Results.table>`
(``tracestory analyze --table NAME``), apart from the code that builds them
(:mod:`tracestory.analysis.tables`, :mod:`tracestory.analysis.nsys_tables`): the command line's
choices and the results need the names at start-up, the tables only when one is asked for, so
the table builders are reached by name (:mod:`tracestory.lazy`; docs/PERFORMANCE.md
"Tiny-trace analyze")."""

from __future__ import annotations

# the ``nsys stats`` summaries (tracestory.analysis.nsys_tables)
NSYS_TABLES = ("cuda_api_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum", "osrt_sum")

TABLES = ("kernels", "categories", "ops", "leaf_ops", "modules", "phases", "gaps", "collectives", "roofline",
          *NSYS_TABLES)
