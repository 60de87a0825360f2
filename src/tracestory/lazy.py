"""Code reached by name: a module that only some inputs need is imported when one of them comes.

Start-up is part of every command: ``tracestory analyze`` of a small Kineto trace spends more time
importing than analysing, and on Python 3.11 each frozen dataclass costs about 1 ms to create
(its methods are generated and compiled one by one). Readers of other formats (Nsight Systems,
Nsight Compute, rocprof, the serving files) and the passes that only some inputs feed (the
serving run's batching story, the multi-GPU result, GPU telemetry, the Execution Story of the
report) are therefore not imported by the modules that call them. They are resolved by
:func:`entry` on the code path that needs them: a reader when the sniff names its format, a pass
when its input exists, a renderer when its result is there.

Internal imports otherwise sit at the top of each module (``tests/api/test_layers.py``), and
these edges are checked like imports: every call is ``entry("tracestory.<module>", "<name>")``
with two literal strings, the layer rule applies to it, and ``test_layers.PLUGIN_POINTS`` lists
each one with the reason it is reached by name. Types such as ``SchedulerLog`` in a field's
annotation are imported under ``TYPE_CHECKING`` (annotations are strings here,
``from __future__ import annotations``); the layer test reads those imports like any other.
"""

from __future__ import annotations

import importlib
from typing import Any


def entry(module: str, name: str) -> Any:
    """``module.name``, importing ``module`` on first use (Python caches it afterwards)."""
    return getattr(importlib.import_module(module), name)
