"""matplotlib, imported only when a plot is drawn (the ``plots`` extra), set up for
deterministic PNGs (Agg backend, no timestamp or version in the metadata)."""

from __future__ import annotations

from pathlib import Path

from .. import outputs
from ..errors import ToolNotFound

DPI = 110  # of every PNG written


def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ToolNotFound("matplotlib", "pip install 'tracestory[plots]' to write PNG plots") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Deterministic output: no timestamps or software version in the PNG metadata.
    plt.rcParams["svg.hashsalt"] = "tracestory"
    return plt


def save(fig, path: Path) -> Path:
    """Write ``fig`` as PNG, atomically (a failure leaves the previous file as it was)."""
    with outputs.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
