"""GPU peak table: dense FLOP/s per dtype and DRAM bandwidth, plus measured overrides.

Model
-----
One row per GPU: an ordered regular expression on the device name (first match wins, so
"H100.*PCIe" is tried before "H100"), peak **dense** (no 2:4 sparsity) FLOP/s per dtype, peak
DRAM bytes/s, and the source the numbers come from. Dtype keys: ``fp64`` (CUDA cores),
``fp64_tensor``, ``fp16_simt`` (non-tensor packed half), ``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``fp4`` (only where the chip has
it). Tensor-core figures are with FP32 accumulation; datasheets that quote sparse figures are
halved, which the row's source says.

Measured peaks override datasheet ones: a TOML/JSON file (``--peaks FILE``) or a ``peaks`` entry
in a capture's manifest, shaped like::

    name = "NVIDIA H200"                 # optional: only apply to matching devices (regex)
    dram_bytes_per_s = 4.27e12
    source = "measured: D2D copy, do_bench median"
    [flops_per_s]
    bf16 = 7.9e14

The measurements made for this project on one H200 are built in (:data:`MEASURED`) and applied
by default (``measured=False`` gives the datasheet row alone). An unknown GPU gives ``None``
and :func:`peaks_warning` says so; nothing is guessed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import TraceFormatError

T = 1e12


@dataclass(frozen=True)
class Peaks:
    """Peak rates of one GPU. ``flops_per_s`` maps dtype -> dense FLOP/s."""

    name: str
    flops_per_s: Mapping[str, float]
    dram_bytes_per_s: float
    source: str
    datasheet_flops_per_s: Mapping[str, float] = field(default_factory=dict)
    datasheet_dram_bytes_per_s: float | None = None
    measured: tuple[str, ...] = ()  # which entries come from measurements
    notes: str = ""

    def flops(self, dtype: str) -> float | None:
        return self.flops_per_s.get(dtype)

    def ridge_flop_per_byte(self, dtype: str) -> float | None:
        """Arithmetic intensity where the memory roof meets the compute roof of ``dtype``."""
        f = self.flops(dtype)
        return None if f is None or not self.dram_bytes_per_s else f / self.dram_bytes_per_s


def _row(pattern, name, dram_tbps, source, **tflops):
    return (re.compile(pattern, re.IGNORECASE), name, {k: v * T for k, v in tflops.items()}, dram_tbps * T, source)


# Ordered: more specific patterns first.
SPECS = (
    _row(r"H100.*PCIe", "NVIDIA H100 PCIe", 2.0,
         "NVIDIA H100 Tensor Core GPU datasheet (PCIe column; sparse tensor figures halved), "
         "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
         fp64=26, fp64_tensor=51, fp32=51, tf32=378, bf16=756, fp16=756, fp8=1513),
    _row(r"H100.*NVL", "NVIDIA H100 NVL", 3.9,
         "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL column; sparse tensor figures halved)",
         fp64=30, fp64_tensor=60, fp32=60, tf32=417.5, bf16=835, fp16=835, fp8=1670),
    _row(r"H100", "NVIDIA H100 SXM", 3.35,
         "NVIDIA H100 Tensor Core GPU datasheet (SXM column; sparse tensor figures halved); "
         "non-tensor FP16 from the NVIDIA H100 Tensor Core GPU Architecture whitepaper (SXM5)",
         fp16_simt=133.8, fp64=34, fp64_tensor=67, fp32=67, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9),
    _row(r"H200.*NVL", "NVIDIA H200 NVL", 4.8,
         "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL column; sparse tensor figures halved), "
         "https://www.nvidia.com/en-us/data-center/h200/",
         fp64=30, fp64_tensor=60, fp32=60, tf32=417.5, bf16=835, fp16=835, fp8=1670),
    _row(r"H200", "NVIDIA H200", 4.8,
         "NVIDIA H200 Tensor Core GPU datasheet (SXM column; sparse tensor figures halved), "
         "https://www.nvidia.com/en-us/data-center/h200/; non-tensor FP16 as H100 SXM5 (same GH100 "
         "SXM configuration, H100 architecture whitepaper)",
         fp16_simt=133.8, fp64=34, fp64_tensor=67, fp32=67, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9),
    _row(r"H800.*PCIe", "NVIDIA H800 PCIe", 2.0,
         "NVIDIA H800 Tensor Core GPU datasheet (H800 PCIe column; sparse tensor figures halved): the H100 "
         "PCIe tensor rates with FP64 cut to 0.8 TFLOPS",
         fp64=0.8, fp64_tensor=0.8, fp32=51, tf32=378, bf16=756, fp16=756, fp8=1513),
    _row(r"H800", "NVIDIA H800 SXM", 3.35,
         "NVIDIA H800 Tensor Core GPU datasheet (H800 SXM column; sparse tensor figures halved): the H100 "
         "SXM tensor rates and bandwidth with FP64 cut to 1 TFLOPS (and NVLink to 400 GB/s)",
         fp64=1, fp64_tensor=1, fp32=67, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9),
    _row(r"B200", "NVIDIA B200", 8.0,
         "NVIDIA HGX B200 datasheet (8-GPU totals / 8: FP64 296 TF, FP32 600 TF, TF32 18 PF, FP16/BF16 "
         "36 PF, FP8 72 PF, FP4 144 PF sparse -> halved, HBM3e 64 TB/s), "
         "https://www.nvidia.com/en-us/data-center/hgx/",
         fp64=37, fp64_tensor=37, fp32=75, tf32=1125, bf16=2250, fp16=2250, fp8=4500, fp4=9000),
    # A100 rows: NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf,
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf):
    # FP64 9.7, FP64 tensor 19.5, FP32 19.5, TF32 156 (312 sparse), BF16/FP16 312 (624 sparse) TFLOPS in
    # every column; GPU memory bandwidth 1,555 GB/s (40GB PCIe and SXM), 1,935 GB/s (80GB PCIe), 2,039 GB/s
    # (80GB SXM). No FP8.
    _row(r"A100.*(80GB.*PCIe|PCIe.*80GB)", "NVIDIA A100 80GB PCIe", 1.935,
         "NVIDIA A100 Tensor Core GPU datasheet (80GB PCIe column: 1,935 GB/s; BF16 312 TFLOPS dense), "
         "https://www.nvidia.com/en-us/data-center/a100/",
         fp64=9.7, fp64_tensor=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312),
    _row(r"A100.*80GB", "NVIDIA A100 80GB SXM", 2.039,
         "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column: 2,039 GB/s; BF16 312 TFLOPS dense), "
         "https://www.nvidia.com/en-us/data-center/a100/",
         fp64=9.7, fp64_tensor=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312),
    _row(r"A100", "NVIDIA A100 40GB", 1.555,
         "NVIDIA A100 Tensor Core GPU datasheet (40GB PCIe and SXM columns: 1,555 GB/s; BF16 312 TFLOPS "
         "dense), https://www.nvidia.com/en-us/data-center/a100/",
         fp64=9.7, fp64_tensor=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312),
    _row(r"V100S", "NVIDIA V100S PCIe", 1.134,
         "NVIDIA V100S Tensor Core GPU datasheet (PCIe 32GB): FP64 8.2, FP32 16.4, tensor (FP16 in, FP32 "
         "accumulate) 130 TFLOPS, HBM2 1134 GB/s; Volta has no BF16",
         fp64=8.2, fp32=16.4, fp16=130),
    _row(r"V100.*PCIE", "NVIDIA V100 PCIe", 0.9,
         "NVIDIA Tesla V100 GPU Accelerator datasheet (PCIe column): FP64 7, FP32 14, tensor (FP16 in, FP32 "
         "accumulate) 112 TFLOPS, HBM2 900 GB/s, "
         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
         fp64=7, fp32=14, fp16=112),
    _row(r"V100", "NVIDIA V100 SXM2", 0.9,
         "NVIDIA Tesla V100 GPU Accelerator datasheet (SXM2/NVLink column): FP64 7.8, FP32 15.7, tensor (FP16 "
         "in, FP32 accumulate) 125 TFLOPS, HBM2 900 GB/s; Volta has no BF16 or TF32",
         fp64=7.8, fp32=15.7, fp16=125),
    _row(r"MI300X", "AMD Instinct MI300X", 5.3,
         "AMD Instinct MI300X accelerator data sheet (peak theoretical, without sparsity: FP64 vector 81.7, "
         "FP64/FP32 matrix 163.4, TF32 653.7, FP16/BF16 1307.4, FP8 2614.9 TFLOPS; HBM3 5.3 TB/s), "
         "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/"
         "amd-instinct-mi300x-data-sheet.pdf",
         fp64=81.7, fp64_tensor=163.4, fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9),
    _row(r"MI250", "AMD Instinct MI250X (one GCD)", 1.6,
         "AMD Instinct MI250X data sheet (per OAM module: FP64/FP32 vector 47.9, FP64 matrix 95.7, FP16/BF16 "
         "383 TFLOPS, HBM2e 3.2 TB/s) halved: ROCm shows each of its two GCDs as one GPU (AMD's MI250 "
         "microarchitecture page: 1.6 TB/s per GCD). ROCm names both parts 'AMD Instinct MI250X/MI250', so an "
         "MI250 (about 5% lower rates) gets this row too",
         fp64=23.95, fp64_tensor=47.85, fp32=23.95, bf16=191.5, fp16=191.5),
    _row(r"L40S", "NVIDIA L40S", 0.864,
         "NVIDIA L40S GPU datasheet (FP32 91.6, TF32 183 | 366 sparse, BF16/FP16 362.05 | 733 sparse, FP8 733 | "
         "1,466 sparse TFLOPS; GDDR6 864 GB/s; the dense figures are kept), "
         "https://www.nvidia.com/en-us/data-center/l40s/",
         fp32=91.6, tf32=183, bf16=362.05, fp16=362.05, fp8=733),
    _row(r"RTX 4090", "NVIDIA GeForce RTX 4090", 1.008,
         "NVIDIA Ada GPU Architecture whitepaper, appendix A (RTX 4090; FP16/BF16 tensor with FP32 "
         "accumulate, dense)",
         fp32=82.6, tf32=82.6, bf16=165.2, fp16=165.2, fp8=330.3),
    _row(r"RTX 5070 Ti", "NVIDIA GeForce RTX 5070 Ti", 0.896,
         "NVIDIA GeForce RTX 5070 Ti product page (1406 AI TOPS = FP4 sparse; halved for dense, "
         "FP8 = FP4 / 2, FP16 = FP8 / 2) and RTX Blackwell GPU architecture whitepaper; 256-bit 28 Gbps "
         "GDDR7. FP16 with FP32 accumulate may run at half this rate on GeForce parts",
         fp32=43.9, tf32=43.9, bf16=175.8, fp16=175.8, fp8=351.5, fp4=703),
    _row(r"RTX 3060(?!\s*Ti)", "NVIDIA GeForce RTX 3060", 0.360,
         "NVIDIA GeForce RTX 3060 specifications (3584 CUDA cores, 1.777 GHz boost, 192-bit 15 Gbps "
         "GDDR6) with the NVIDIA Ampere GA102 whitepaper's per-SM rates (GA10x: FP16 tensor with FP32 "
         "accumulate at half rate on GeForce)",
         fp32=12.7, tf32=12.7, bf16=25.5, fp16=25.5),
)

# Measured on the project's H200 (tests/data/PROVENANCE.md): D2D copy 4.27 TB/s
# (read + write), bf16 8192^3 matmul 689-790 TFLOP/s (790 used as the roof), fp8 e4m3
# torch._scaled_mm 8192^3 1258 TFLOP/s; triton.testing.do_bench medians.
MEASURED: tuple[tuple[re.Pattern, dict], ...] = (
    (re.compile(r"H200(?!.*NVL)", re.IGNORECASE), {
        "dram_bytes_per_s": 4.27e12,
        "flops_per_s": {"bf16": 790e12, "fp16": 790e12, "fp8": 1258e12},
        "source": "measured on one H200 for this project (do_bench medians): D2D copy 4.27 TB/s, "
                  "bf16 8192^3 matmul 689-790 TFLOP/s (790 used), fp8 e4m3 _scaled_mm 1258 TFLOP/s",
    }),
)


def datasheet_peaks(device_name: str) -> Peaks | None:
    for pattern, name, flops, dram, source in SPECS:
        if pattern.search(device_name or ""):
            return Peaks(name=name, flops_per_s=dict(flops), dram_bytes_per_s=dram, source=source,
                         datasheet_flops_per_s=dict(flops), datasheet_dram_bytes_per_s=dram)
    return None


def apply_overrides(peaks: Peaks, entry: Mapping, origin: str = "") -> Peaks:
    """``peaks`` with the measured values of ``entry`` (keys ``dram_bytes_per_s``, ``flops_per_s``)."""
    flops = dict(peaks.flops_per_s)
    measured = list(peaks.measured)
    dram = peaks.dram_bytes_per_s
    if entry.get("dram_bytes_per_s") is not None:
        dram = float(entry["dram_bytes_per_s"])
        measured.append("dram")
    for k, v in (entry.get("flops_per_s") or {}).items():
        flops[str(k)] = float(v)
        measured.append(str(k))
    source = entry.get("source") or origin or "measured override"
    return replace(peaks, flops_per_s=flops, dram_bytes_per_s=dram, measured=tuple(dict.fromkeys(measured)),
                   source=f"{peaks.source}; overridden by {source}")


def load_overrides(path) -> dict:
    """A ``--peaks`` TOML/JSON file or a capture manifest -> the override entry (may be empty)."""
    path = Path(path)
    text = path.read_text()
    try:
        if path.suffix.lower() == ".toml":
            import tomllib

            doc = tomllib.loads(text)
        else:
            doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:  # tomllib/json decode errors are ValueErrors
        raise TraceFormatError(path, "a TOML or JSON peaks file", f"unparsable text ({e})") from None
    if not isinstance(doc, dict):
        raise TraceFormatError(path, "a table of peaks", type(doc).__name__)
    entry = doc.get("peaks", doc)
    if not isinstance(entry, dict):
        raise TraceFormatError(path, "a 'peaks' table", type(entry).__name__)
    bad = set(entry) - {"name", "dram_bytes_per_s", "flops_per_s", "source"}
    if bad:
        raise TraceFormatError(path, "keys name, dram_bytes_per_s, flops_per_s, source", f"{sorted(bad)}")
    return entry


def peaks_for(device_name: str, overrides_path=None, *, measured: bool = True,
              manifest: Mapping | None = None) -> Peaks | None:
    """Peaks of ``device_name``: datasheet row, then built-in measurements (``measured``), then a
    manifest's ``peaks`` entry, then ``overrides_path``. ``None`` for an unknown GPU."""
    peaks = datasheet_peaks(device_name)
    if peaks is None and overrides_path is not None:
        entry = load_overrides(overrides_path)
        if entry.get("dram_bytes_per_s") and entry.get("flops_per_s"):  # a full row for an unlisted GPU
            peaks = Peaks(name=device_name or "unknown GPU", flops_per_s={}, dram_bytes_per_s=0.0,
                          source="no datasheet row")
    if peaks is None:
        return None
    if measured:
        for pattern, entry in MEASURED:
            if pattern.search(device_name):
                peaks = apply_overrides(peaks, entry)
    entries = []
    if manifest and isinstance(manifest.get("peaks"), Mapping):
        entries.append((manifest["peaks"], "the capture manifest"))
    if overrides_path is not None:
        entries.append((load_overrides(overrides_path), str(overrides_path)))
    for entry, origin in entries:
        if entry.get("name") and not re.search(str(entry["name"]), device_name, re.IGNORECASE):
            continue
        peaks = apply_overrides(peaks, entry, origin)
    return peaks


def peaks_warning(device_name: str | None) -> str | None:
    """The warning to show when no peaks are known for ``device_name`` (``None`` when known)."""
    if device_name and datasheet_peaks(device_name) is not None:
        return None
    return (f"no peak FLOP/s or bandwidth known for GPU {device_name or '(unnamed)'!r}: roofline "
            "percentages are n/a; pass --peaks FILE with dram_bytes_per_s and flops_per_s")


def resolve_peaks(device_names, overrides_path=None, *, manifest: Mapping | None = None) -> dict[str, Peaks | None]:
    """The peaks of each named GPU, resolved once for a whole report: the ``--peaks`` file over a
    capture manifest's ``peaks`` entry over the built-in measurements over the datasheet row
    (:func:`peaks_for`). Unnamed devices are left out; an unknown GPU maps to ``None``."""
    return {name: peaks_for(name, overrides_path, manifest=manifest) for name in dict.fromkeys(device_names) if name}
