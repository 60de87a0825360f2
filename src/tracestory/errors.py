"""Domain errors. Each message says what was read, what was expected and what was found.

The CLI turns any :class:`TracestoryError` into one line on stderr and exit code 2.
"""

from __future__ import annotations


class TracestoryError(Exception):
    """Base class of every error the CLI reports as one line with exit code 2."""


class TraceFormatError(TracestoryError):
    """An input file cannot be read as the format it claims to be."""

    def __init__(self, path: object, expected: str, found: str):
        self.path = str(path)
        self.expected = expected
        self.found = found
        super().__init__(f"{self.path}: expected {expected}, found {found}")

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
