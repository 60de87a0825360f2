"""What the capture ran on: GPUs, driver, CUDA, library versions, host, topology, git commit.

Every field is read, never assumed: a value that cannot be read is ``None`` (a GPU-less
machine has ``gpus == []`` and ``driver_version is None``). Sources, in order of trust:
``torch.cuda`` for per-GPU name / compute capability / memory / SM count (torch is imported
here only if it is installed), ``nvidia-smi --query-gpu`` for the driver and as the fallback
GPU list, ``nvidia-smi topo -m`` for the topology matrix, ``git`` for the workload's commit.

Also here: :func:`external_profiler`, which tells whether this process already runs under
Nsight Systems or Nsight Compute, so tracestory never nests a second profiler (torch.profiler
under ncu fails with CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any, Mapping

_TIMEOUT_S = 20
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """nvidia-smi underlines the topology header with terminal escapes; keep plain text."""
    return _ANSI.sub("", text)


def external_profiler(env: Mapping[str, str] | None = None) -> str | None:
    """``"nsys"`` or ``"ncu"`` when this process runs under that profiler, else ``None``.

    nsys sets ``NSYS_PROFILING_SESSION_ID`` in the profiled process. ncu injects itself
    through ``CUDA_INJECTION64_PATH`` and sets ``NV_COMPUTE_PROFILER_*`` /
    ``NV_NSIGHT_INJECTION_*`` variables; any of those without the nsys marker means ncu.
    """
    env = os.environ if env is None else env
    if env.get("NSYS_PROFILING_SESSION_ID"):
        return "nsys"
    if env.get("CUDA_INJECTION64_PATH") or any(
        k.startswith(("NV_COMPUTE_PROFILER_", "NV_NSIGHT_INJECTION_", "NV_TPS_")) for k in env
    ):
        return "ncu"
    return None


def _run(argv: list[str], cwd: str | Path | None = None) -> str | None:
    """stdout of a short command, or None when it is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_info() -> dict[str, Any]:
    out: dict[str, Any] = {"torch": None, "cuda_runtime": None, "cudnn": None, "gpus": []}
    try:
        import torch
    except Exception:
        return out
    out["torch"] = torch.__version__
    out["cuda_runtime"] = getattr(torch.version, "cuda", None)
    try:
        v = torch.backends.cudnn.version()
        out["cudnn"] = str(v) if v else None
    except Exception:
        pass
    try:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        n = 0
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        out["gpus"].append({
            "index": i,
            "name": p.name,
            "compute_capability": f"{p.major}.{p.minor}",
            "memory_bytes": int(p.total_memory),
            "sm_count": int(p.multi_processor_count),
        })
    return out


def _smi_gpus() -> tuple[list[dict[str, Any]], str | None]:
    text = _run(["nvidia-smi", "--query-gpu=index,name,compute_cap,memory.total,driver_version",
                 "--format=csv,noheader,nounits"])
    if not text:
        return [], None
    gpus, driver = [], None
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        idx, name, cc, mem_mib, driver = parts[:5]
        gpus.append({
            "index": int(idx) if idx.isdigit() else None,
            "name": name,
            "compute_capability": cc or None,
            # nvidia-smi reports MiB with nounits
            "memory_bytes": int(float(mem_mib) * 1024 * 1024) if mem_mib.replace(".", "").isdigit() else None,
            "sm_count": None,
        })
    return gpus, driver


GIT_DIFF_MAX_CHARS = 200_000


def git_info(path: str | Path) -> dict[str, Any]:
    """Commit, dirty flag, top-level folder, the diff against HEAD (capped) and the untracked
    files of the git repository holding ``path``."""
    path = Path(path)
    d = path if path.is_dir() else path.parent
    top = _run(["git", "-C", str(d), "rev-parse", "--show-toplevel"])
    if top is None:
        return {"repo": None, "remote": None, "commit": None, "dirty": None}
    commit = _run(["git", "-C", str(d), "rev-parse", "HEAD"])
    remote = _run(["git", "-C", str(d), "remote", "get-url", "origin"])
    status = _run(["git", "-C", str(d), "status", "--porcelain", "--untracked-files=no"])
    dirty = bool(status.strip()) if status is not None else None
    info = {
        "repo": top.strip(),
        "commit": commit.strip() if commit else None,  # None: a repository with no commit yet
        "dirty": dirty,
        "remote": remote.strip() if remote else None,
    }
    if commit:
        # The modifications themselves, so the report can show them (the report format: "code diffs
        # included for all modifications"); capped so a huge diff cannot bloat the manifest.
        diff = _run(["git", "-C", str(d), "diff", "HEAD", "--no-color", "--no-ext-diff"]) if dirty else ""
        untracked = _run(["git", "-C", str(d), "ls-files", "--others", "--exclude-standard"])
        if diff is not None:
            info["diff"] = diff[:GIT_DIFF_MAX_CHARS]
            info["diff_truncated"] = len(diff) > GIT_DIFF_MAX_CHARS
        if untracked is not None:
            files = untracked.splitlines()
            info["untracked"] = files[:200]
            info["untracked_count"] = len(files)
    return info


def _tool_version(tool: str) -> str | None:
    text = _run([tool, "--version"])
    if not text:
        return None
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else None


def collect_environment(workload_path: str | Path | None = None) -> dict[str, Any]:
    """The manifest's ``environment`` block (plain JSON types)."""
    info = _torch_info()
    smi_gpus, driver = _smi_gpus()
    gpus = info["gpus"]
    if not gpus:  # torch absent or CPU-only: nvidia-smi still names the GPUs
        gpus = smi_gpus
    topo = _run(["nvidia-smi", "topo", "-m"])
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": info["torch"],
        "cuda_runtime": info["cuda_runtime"],
        "cudnn": info["cudnn"],
        "triton": _version("triton"),
        "tracestory": _version("tracestory"),
        "driver_version": driver,
        "gpu_count": len(gpus),
        "gpus": gpus,
        "topology": strip_ansi(topo).rstrip() if topo else None,
        "nsys_version": _tool_version("nsys"),
        "ncu_version": _tool_version("ncu"),
        "git": git_info(workload_path) if workload_path is not None else
        {"repo": None, "remote": None, "commit": None, "dirty": None},
    }
