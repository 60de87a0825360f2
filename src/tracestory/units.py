"""The one place that turns numbers into text: durations, percentages, bytes, SI rates.

Every renderer, finding title and command prints through these functions, so a value reads the
same wherever it appears. The unit is chosen *after* rounding: 999,999 ns is ``1.00 ms``, never
``1000 us`` or ``1e+03 us``. ``None`` and NaN print as ``n/a``.
"""

from __future__ import annotations

import math
import re

NA = "n/a"

_TIME_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "us"), (1.0, "ns"))
_SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def sig(v: float, digits: int = 3) -> str:
    """``v`` with ``digits`` significant digits, never in exponent form; the integer part is
    always kept (``1234.5`` with 3 digits is ``1235``)."""
    a = abs(v)
    if a == 0:
        return "0"
    int_digits = int(math.floor(math.log10(a))) + 1 if a >= 1 else 1
    decimals = max(0, digits - int_digits)
    return f"{v:.{decimals}f}"


def _scaled(v: float, scales, digits: int) -> tuple[str, str]:
    """``v`` in the largest unit of ``scales`` whose rounded value is at least 1."""
    a = abs(v)
    for i, (scale, unit) in enumerate(scales):
        if a >= scale or i == len(scales) - 1:
            text = sig(v / scale, digits)
            # 999.9996 us rounds to "1000": that is the next unit up.
            if i > 0 and abs(float(text)) >= 1000 and scales[i - 1][0] == scale * 1000:
                return sig(v / scales[i - 1][0], digits), scales[i - 1][1]
            return text, unit
    raise AssertionError("unreachable")


def fmt_ns(ns: float | int | None, *, digits: int = 3) -> str:
    """A duration in the unit that fits it: ``850 ns``, ``12.4 us``, ``3.21 ms``, ``1.50 s``.
    ``digits`` significant digits; below 1 us whole nanoseconds."""
    if _missing(ns):
        return NA
    v = float(ns)
    if abs(v) < 1e3:
        return f"{v:.0f} ns" if abs(round(v)) < 1000 else f"{sig(v / 1e3, digits)} us"
    text, unit = _scaled(v, _TIME_UNITS[:3], digits)
    return f"{text} {unit}"


def fmt_ms(ns: float | int | None, decimals: int = 3) -> str:
    """A duration in milliseconds with fixed decimals (table columns that must line up)."""
    if _missing(ns):
        return NA
    return f"{float(ns) / 1e6:.{decimals}f}"


def fmt_pct(fraction: float | None, decimals: int = 1) -> str:
    """A fraction 0.523 as ``52.3%``."""
    if _missing(fraction):
        return NA
    return f"{100.0 * fraction:.{decimals}f}%"


def fmt_bytes(n: float | int | None) -> str:
    """Bytes in binary units with 3 significant digits: ``512 B``, ``1.50 KiB``, ``3.21 GiB``."""
    if _missing(n):
        return NA
    v = float(n)
    if abs(v) < 1024:
        return f"{v:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        v /= 1024
        text = sig(v, 3)
        if abs(float(text)) < 1024 or unit == "TiB":
            return f"{text} {unit}"
    raise AssertionError("unreachable")


def fmt_si(v: float | None, unit: str, digits: int = 3) -> str:
    """A rate or count with an SI prefix: ``4.27 TB/s``, ``790 TFLOP/s``, ``12.0 k``."""
    if _missing(v):
        return NA
    text, prefix = _scaled(float(v), _SI_PREFIXES, digits)
    return f"{text} {prefix}{unit}" if unit or prefix else text


def plural(n: int, word: str, many: str | None = None) -> str:
    """``"1 call"``, ``"3 calls"`` (``many`` for an irregular plural), with thousands separators."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def fmt_count(v: float) -> str:
    """A count as an integer when it is one, else with 3 significant digits."""
    return f"{int(v)}" if float(v).is_integer() else sig(float(v), 3)


def clip_text(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, with ``…`` when cut."""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + "…"


def capital(text: str) -> str:
    """The first letter upper-cased, the rest untouched."""
    return text[:1].upper() + text[1:]


_NOISE = {"void", "at", "native", "c10", "std", "detail", "float", "int", "long", "unsigned",
          "char", "bool", "true", "false", "anonymous", "namespace", "BFloat16", "Half",
          "Array", "array", "cutlass", "const", "at_cuda_detail", "cub", "signed", "short",
          "double", "__nv_bfloat16", "half", "func_wrapper_t", "gpu_kernel_impl_nocast",
          "gpu_kernel_impl", "unsigned_int", "OffsetCalculator", "TrivialOffsetCalculator"}


def _without_return_type(s: str) -> str:
    """``s`` from its function name on: a demangled signature may start with a return type
    (``std::enable_if<!T7, void>::type internal::gemvx::kernel<...>(...)``), separated from the
    name by the last space outside brackets before the parameter list."""
    depth, cut = 0, -1
    for i, ch in enumerate(s):
        if ch in "<([":
            if ch == "(" and depth == 0:
                break
            depth += 1
        elif ch in ">)]":
            depth = max(depth - 1, 0)
        elif ch == " " and depth == 0:
            cut = i
    if cut < 0 or cut == len(s) - 1 or not any(t in s[:cut] for t in ("::", "<", ">")):
        return s  # no space, or words that are not a C++ type before it ("Memcpy HtoD (...)")
    return s[cut + 1 :]


def _base(qualified: str) -> str:
    """The last component of ``a::b::c``, with its scope when it says nothing alone
    (``internal::gemvx::kernel`` -> ``gemvx::kernel``)."""
    parts = qualified.split("::")
    if len(parts) > 1 and parts[-1] in ("kernel", "kernel_impl", "device_kernel", "global_kernel"):
        return "::".join(parts[-2:])
    return parts[-1] or qualified


def _declaration(name: str) -> str:
    """``name`` without ``void``, anonymous-namespace qualifiers and a leading return type."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    return _without_return_type(s.replace("(anonymous namespace)::", "").replace("<unnamed>::", ""))


def short_name(name: str, width: int = 48) -> str:
    """A readable kernel name: no ``void``, no argument list, no namespaces; for a template
    kernel the most telling template argument in brackets (the functor of an ATen elementwise
    kernel, the tile config of a CUTLASS ``Kernel``)."""
    s = name.strip()
    if s.startswith(("Memcpy", "Memset")):
        return clip_text(s, width)
    s = _declaration(s)
    base_end = min([i for i in (s.find("<"), s.find("(")) if i >= 0] or [len(s)])
    base = _base(s[:base_end])
    inner = ""
    if base_end < len(s) and s[base_end] == "<":
        idents = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", s[base_end:].split("(")[0]
                            if base in ("Kernel", "Kernel2") else s[base_end:])
        idents = [w for w in idents if w not in _NOISE and not w.startswith("Offset")]
        if base in ("Kernel", "Kernel2") and idents:
            return clip_text(idents[0], width)
        if idents:
            inner = idents[0]
    out = f"{base}[{inner}]" if inner else base
    return clip_text(out, width)


def kernel_base(name: str) -> str:
    """A kernel's base name: no ``void``, no template arguments, no parameters, no namespaces
    (``void clover::par_ranged2d_kernel<...>(...)`` -> ``par_ranged2d_kernel``): the name a
    template's instantiations share."""
    s = _declaration(name)
    end = min([i for i in (s.find("<"), s.find("(")) if i >= 0] or [len(s)])
    return _base(s[:end]) or s


COLLECTIVE_TITLE = {"allreduce": "all-reduce", "allgather": "all-gather", "reduce_scatter": "reduce-scatter",
                    "alltoall": "all-to-all", "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send/recv",
                    "send": "send", "recv": "recv"}


def collective_title(kind: str | None) -> str:
    """A collective's kind as prose (``allreduce`` -> ``all-reduce``)."""
    return COLLECTIVE_TITLE.get(kind or "", kind or "unknown")


def fmt_gbps(bytes_per_s: float | None) -> str:
    """A bandwidth in GB/s (10^9 bytes per second), ``n/a`` when unknown."""
    return "n/a" if bytes_per_s is None else f"{bytes_per_s / 1e9:.1f} GB/s"


def gpu_label(rank: int) -> str:
    return f"GPU {rank}"
