"""Domain errors. Each message says what was read, what was expected and what was found.

The CLI turns any :class:`TracestoryError` into one line on stderr and exit code 2.
"""

from __future__ import annotations


class TracestoryError(Exception):
    """Base class of every error the CLI reports as one line with exit code 2."""


def one_line(text: object, limit: int = 300) -> str:
    """``text`` on one line (every run of whitespace, newlines included, made one space), cut to
    ``limit`` characters: library messages quote damaged bytes, which may hold anything."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


class TraceFormatError(TracestoryError):
    """An input file cannot be read as the format it claims to be. ``expected`` and ``found``
    are kept to one line each (see :func:`one_line`)."""

    def __init__(self, path: object, expected: str, found: str):
        self.path = str(path)
        self.expected = one_line(expected)
        self.found = one_line(found)
        super().__init__(f"{self.path}: expected {self.expected}, found {self.found}")

    def __reduce__(self):  # picklable across worker processes (parallel.map_ranks)
        return (type(self), (self.path, self.expected, self.found))


class ToolNotFound(TracestoryError):
    """An external tool (nsys, ncu, torchrun) or optional Python package is missing."""

    def __init__(self, tool: str, hint: str):
        self.tool = tool
        self.hint = hint
        super().__init__(f"{tool} not found: {hint}")

    def __reduce__(self):
        return (type(self), (self.tool, self.hint))


class UnsupportedGPU(TracestoryError):
    """The GPU cannot run what was asked (a precision, an instruction set)."""


class UsageError(TracestoryError):
    """Arguments that cannot work together, a missing input, an unknown name."""
