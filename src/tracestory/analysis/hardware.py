"""Hardware interpretation of Nsight Compute kernels: occupancy, compute, memory, warp stalls.

Each sentence is produced by a rule on the numbers of one kernel (thresholds below), so every
claim in the report can be traced to a metric. A metric the input lacks produces no sentence
(the renderer shows ``n/a``), never a claim about a zero.

Rules (``pct`` are percentages):

* occupancy: theoretical < 100 -> named limiter(s) (the fewest blocks per SM); achieved below
  ``ACHIEVED_GAP`` x theoretical -> warps not resident (tail / imbalance / short kernel);
  waves per SM < 1 -> grid smaller than one wave; fractional last wave < 50 % -> tail effect.
* compute: SM throughput >= ``HIGH`` -> compute pipes busy; tensor pipe >= ``HIGH`` -> tensor
  cores well fed, tensor FLOPs with tensor pipe < ``LOW`` -> tensor cores under-fed; SM and
  memory throughput both < ``LOW`` -> latency-bound.
* memory: DRAM throughput >= ``HIGH`` with SM throughput below it -> memory-bound on DRAM; L2 hit
  rate < 50 -> little reuse in L2; shared-memory bank conflicts > 10 % of shared wavefronts.
* warp stalls: the dominant reason (largest share of stall cycles) explained, plus any other
  reason >= ``STALL_NOTE`` % (barrier: synchronization cost; long_scoreboard: waiting on global
  memory, ...).
"""

from __future__ import annotations

import math

import msgspec

HIGH, LOW = 60.0, 20.0
ACHIEVED_GAP = 0.8
STALL_NOTE = 15.0

STALL_MEANING = {
    "long_scoreboard": "waiting on global/local memory (L1TEX: L2 or DRAM loads)",
    "barrier": "waiting at a barrier (`__syncthreads`): synchronization cost",
    "short_scoreboard": "waiting on shared memory or MIO (special math, shuffles) results",
    "mio_throttle": "MIO queue full: too many shared-memory/special instructions",
    "lg_throttle": "LSU queue full: too many global/local memory instructions",
    "math_pipe_throttle": "a math pipe is saturated (compute-bound on that pipe)",
    "wait": "fixed-latency dependencies between instructions",
    "gmma": "waiting on warpgroup MMA (wgmma) results from the tensor cores",
    "not_selected": "eligible but another warp issued: enough parallelism (healthy)",
    "selected": "issuing",
    "no_instruction": "instruction fetch misses or branch targets not ready",
    "imc_miss": "immediate-constant cache misses",
    "drain": "draining memory stores at warp exit",
    "dispatch_stall": "dispatcher could not issue (pipeline conflicts)",
    "branch_resolving": "resolving branch targets",
    "membar": "waiting on a memory barrier/fence",
    "sleeping": "warps sleeping (nanosleep, yield)",
    "tex_throttle": "texture unit queue full",
    "warpgroup_arrive": "waiting at a warpgroup arrive barrier",
}


class KernelHardware(msgspec.Struct, frozen=True):
    """The interpreted hardware behaviour of one ncu kernel."""

    kernel_id: int
    name: str
    duration_ns: int | None
    time_share: float | None       # of the trace's GPU kernel time, when joined
    occupancy: tuple[str, ...]
    compute: tuple[str, ...]
    memory: tuple[str, ...]
    stalls: tuple[str, ...]
    dominant_stall: str | None
    verdict: str                   # one line: share, roofline position, bound


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def waves(k) -> float | None:
    """Waves per SM: grid blocks / (SMs x resident blocks per SM), recomputed from the limits
    because CSV exports round ncu's value to two decimals (0.00 for small grids)."""
    lims = [getattr(k, f) for f in ("occupancy_limit_registers", "occupancy_limit_shared_mem",
                                    "occupancy_limit_warps", "occupancy_limit_blocks")]
    if k.grid_size is not None and k.sm_count and all(v is not None and v > 0 for v in lims):
        return k.grid_size / (k.sm_count * min(lims))
    return k.waves_per_sm


def _occupancy(k) -> list[str]:
    out = []
    th, ach = k.theoretical_occupancy_pct, k.achieved_occupancy_pct
    if th is not None and th < 100 and k.occupancy_limiters:
        out.append(f"theoretical occupancy {th:.0f}% is limited by {' and '.join(k.occupancy_limiters)}")
    if th is not None and ach is not None and ach < ACHIEVED_GAP * th:
        out.append(f"achieved {ach:.1f}% is well below theoretical {th:.0f}%: warps are not resident "
                   "for the whole kernel (short kernel, tail or load imbalance)")
    w = waves(k)
    if w is not None and k.grid_size is not None:
        if w < 1:
            out.append(f"{k.grid_size} blocks fill {w * 100:.3g}% of one wave (waves per SM {w:.3g}): "
                       "SMs sit idle, tail effect")
        else:
            frac = w - math.floor(w)
            if 1e-6 < frac < 0.5:
                out.append(f"{w:.2f} waves: the last wave is only {frac * 100:.0f}% full (tail effect)")
    if k.occupancy_limiters and th is not None:
        out.append(f"conclusion: {' and '.join(k.occupancy_limiters)} "
                   f"{'is' if len(k.occupancy_limiters) == 1 else 'are'} the occupancy limiter")
    return out


def _compute(k) -> list[str]:
    out = []
    sm, mem, tp = k.sm_throughput_pct, k.memory_throughput_pct, k.tensor_pipe_pct
    if sm is not None and sm >= HIGH:
        out.append(f"SM throughput {sm:.0f}% of peak: compute pipes are busy")
    tensor_flops = sum(v for p, v in (k.flops_by_precision or {}).items() if p.startswith("tensor_"))
    if tp is not None and tp >= HIGH:
        out.append(f"tensor pipe active {tp:.0f}% of cycles: tensor cores well fed")
    elif tp is not None and tensor_flops > 0 and tp < LOW:
        out.append(f"tensor pipe active only {tp:.0f}% of cycles: tensor cores under-fed")
    if k.fp32_pipe_pct is not None and k.fp32_pipe_pct >= HIGH:
        out.append(f"FP32 pipe active {k.fp32_pipe_pct:.0f}% of cycles")
    if sm is not None and mem is not None and sm < LOW and mem < LOW:
        out.append(f"SM {sm:.1f}% and memory {mem:.1f}% of peak: neither is busy, the kernel is "
                   "latency-bound (too little work or parallelism to fill the GPU)")
    return out


def _memory(k, point, peaks) -> list[str]:
    out = []
    dram, sm = k.dram_throughput_pct, k.sm_throughput_pct
    if dram is not None and dram >= HIGH and (sm is None or sm < dram):
        out.append(f"DRAM throughput {dram:.0f}% of peak with SM {_pct(sm)}: memory-bound on DRAM")
    if point is not None and point.achieved_bytes_per_s is not None and peaks is not None:
        out.append(f"moves {point.achieved_bytes_per_s / 1e9:.4g} GB/s = "
                   f"{100 * point.achieved_bytes_per_s / peaks.dram_bytes_per_s:.3g}% of the "
                   f"{peaks.dram_bytes_per_s / 1e12:.2f} TB/s DRAM roof")
    if k.l2_hit_rate_pct is not None and k.l2_hit_rate_pct < 50:
        out.append(f"L2 hit rate {k.l2_hit_rate_pct:.0f}%: little reuse in L2")
    if k.shared_bank_conflicts and k.shared_wavefronts:
        ratio = k.shared_bank_conflicts / k.shared_wavefronts
        if ratio > 0.1:
            out.append(f"shared-memory bank conflicts are {ratio * 100:.0f}% of shared wavefronts "
                       f"({k.shared_bank_conflicts:.0f} conflicts)")
    return out


def _stalls(k) -> tuple[list[str], str | None]:
    if not k.warp_stall_pct:
        return [], None
    ranked = sorted(k.warp_stall_pct.items(), key=lambda kv: -kv[1])
    top, share = ranked[0]
    out = [f"{top} dominates ({share:.0f}% of stall cycles): {STALL_MEANING.get(top, 'see ncu docs')}"]
    for reason, v in ranked[1:]:
        if v >= STALL_NOTE:
            out.append(f"{reason} {v:.0f}%: {STALL_MEANING.get(reason, 'see ncu docs')}")
    return out, top


def _verdict(k, point, match) -> str:
    parts = []
    if match is not None and match.time_share is not None:
        parts.append(f"{match.time_share * 100:.1f}% of GPU kernel time")
    if point is not None and point.bound is not None and point.pct_of_roof is not None:
        what = "DRAM bandwidth" if point.bound == "memory" else f"{point.roof_dtype} peak FLOP/s"
        parts.append(f"runs at {point.pct_of_roof:.3g}% of {what}: {point.bound}-bound")
    elif k.dram_throughput_pct is not None and k.sm_throughput_pct is not None:
        parts.append(f"SM {k.sm_throughput_pct:.3g}% / DRAM {k.dram_throughput_pct:.3g}% of peak")
    return "; ".join(parts) if parts else "n/a (no timing share or roofline numbers)"


def analyze_kernel(k, point=None, match=None, peaks=None) -> KernelHardware:
    stalls, top = _stalls(k)
    return KernelHardware(
        kernel_id=k.id, name=k.name, duration_ns=k.duration_ns,
        time_share=None if match is None else match.time_share,
        occupancy=tuple(_occupancy(k)), compute=tuple(_compute(k)), memory=tuple(_memory(k, point, peaks)),
        stalls=tuple(stalls), dominant_stall=top, verdict=_verdict(k, point, match),
    )


def top_kernels(km, join=None, top: int = 5) -> list:
    """Kernels ranked by trace time share when joined, else by ncu duration."""
    def score(k):
        m = join.for_kernel(k.id) if join is not None else None
        share = m.time_share if m is not None and m.time_share is not None else -1.0
        return (-share, -(k.duration_ns or 0), k.id)
    return sorted(km.kernels, key=score)[:top]


def hardware_analysis(km, join=None, roofline=None, peaks=None, top: int = 5) -> tuple[KernelHardware, ...]:
    points = {p.kernel_id: p for p in roofline.points} if roofline is not None else {}
    return tuple(
        analyze_kernel(k, points.get(k.id), join.for_kernel(k.id) if join is not None else None, peaks)
        for k in top_kernels(km, join, top)
    )
