"""Result dataclasses -> plain JSON values (a leaf every JSON writer of ``render`` imports).

Missing values stay ``None``; NaN and infinities become ``None``, never 0.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgspec
import numpy as np


def jsonable(obj: Any) -> Any:
    """Dataclasses, msgspec Structs (the records that are cheaper to create, docs/PERFORMANCE.md
    "Tiny-trace analyze"), numpy scalars, tuples -> plain JSON values. Numpy arrays and dataclass
    fields marked ``compare=False`` (row-index helpers, full sample series) are left out; a
    Struct's fields all count (none of them is such a helper)."""
    if isinstance(obj, msgspec.Struct):
        out = {}
        for name in obj.__struct_fields__:
            v = getattr(obj, name)
            if not isinstance(v, np.ndarray):
                out[name] = jsonable(v)
        return out
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if not f.compare:
                continue
            v = getattr(obj, f.name)
            if isinstance(v, np.ndarray):
                continue
            out[f.name] = jsonable(v)
        return out
    if isinstance(obj, dict) or (hasattr(obj, "items") and hasattr(obj, "keys")):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    return obj
