"""Where the models run: dtype names, device resolution, the optional packages they need.

Dtypes: every workload and the server take ``bf16``, ``fp16`` or ``fp32``; the torch spellings
``bfloat16``, ``float16`` and ``float32`` (and ``half``, ``float``) are the same names
(:func:`dtype_name`), and only the short name is shown. Devices: ``auto`` (or nothing) is CUDA
when torch sees a GPU, else the CPU; ``cuda[:N]`` without CUDA is a usage error. Torch is
imported only inside the functions that need it.
"""

from __future__ import annotations

import importlib

from ..errors import ToolNotFound, UsageError

DTYPES = ("bf16", "fp16", "fp32")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


def dtype_name(text: str) -> str:
    """The short name (``bf16``, ``fp16``, ``fp32``) of a dtype given either way; ValueError otherwise."""
    name = DTYPE_ALIASES.get(text.strip().lower(), text.strip().lower())
    if name not in DTYPES:
        raise ValueError(f"expected a dtype bf16, fp16 or fp32 (or bfloat16, float16, float32), found {text!r}")
    return name


def torch_dtype(name: str):
    """The torch dtype of a short or torch-spelled name."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name(name)]


def require_package(module: str, what: str, extra: str) -> None:
    """Raise :class:`ToolNotFound` (one line, exit 2 in the CLI) when ``module`` cannot be imported."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise ToolNotFound(module, f"{what} needs the Python package {module!r}: "
                                   f"pip install 'tracestory[{extra}]'") from None


def resolve_device(requested: str | None) -> str:
    """``auto``/None -> cuda when available else cpu."""
    import torch

    if requested in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {requested}: CUDA is not available in this torch ({torch.__version__})")
    return requested
