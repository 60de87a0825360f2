"""Multi-GPU rules over :class:`~tracestory.analysis.multigpu.MultiGpu`: the straggler (who
arrives last at the collectives, and why: more compute, or a late host), load imbalance,
communication share and exposure, clock alignment, and the bandwidth of the largest collective.

Waiting inside collectives (``MultiGpu.rank_wait_ns``, ``RankBalance.spin_ns``): the part of
each NCCL kernel that ran before the last GPU arrived is not GPU work. ``multigpu_rank_wait``
says per GPU how much of its GPU op time that is and its busy share without it, so that a
per-GPU verdict ("GPU-bound", "communication is X% of GPU op time, reduce its volume") is told on
the work, and ``multigpu_communication`` splits communication into waiting and transfer. With
one rank the wait cannot be told: nothing is said about it.

Severities: the straggler is ``high`` when the wait it causes is at least 10% of another GPU's
window, ``medium`` from 2%; imbalance is ``medium`` from max/mean 1.1 (reported from 1.05);
communication is ``medium`` when its exposed cost reaches 10% of the step (or window).
:func:`headline` is the one-sentence summary the report and ``tracestory ranks`` open with.
"""

from __future__ import annotations

import numpy as np

from ...units import collective_title as _kind
from ...units import fmt_bytes, fmt_ns, fmt_pct
from ...units import fmt_gbps as _gbps
from ...units import gpu_label as _gpu
from ..multigpu import MultiGpu
from .base import Evidence, Finding


def _late_text(s) -> str:
    return fmt_ns(s.late_mean_ns) if s.late_mean_ns is not None else "n/a"


def _main_kind(result: MultiGpu, rank: int) -> str:
    """The collective type the others spent most time waiting in for ``rank``."""
    waits: dict[str, int] = {}
    for c in result.collectives:
        if c.last_rank == rank:
            waits[c.kind] = waits.get(c.kind, 0) + c.total_wait_ns
    return _kind(max(waits, key=lambda k: (waits[k], k))) if waits else "collectives"


def _straggler_cause(result: MultiGpu, s) -> tuple[str, str]:
    """Why the straggler is late, from its per-step compute and idle time against the others'."""
    late = s.late_mean_ns or 0.0
    per_step = late * s.last_count / max(s.steps, 1)
    ce, ie, sl = s.compute_excess_mean_ns, s.idle_excess_mean_ns, s.start_late_mean_ns
    if ce is not None and ce > 0 and ce >= 0.5 * per_step:
        return (f"It has more GPU work: {fmt_ns(ce)} more compute per step than the others' mean.",
                f"Investigate {_gpu(s.rank)}'s workload imbalance: compare its kernels per step with another "
                f"GPU's (extra or larger kernels, uneven sharding or input sizes) and balance the work.")
    host = max(ie or 0.0, 0.0) + max(sl or 0.0, 0.0)
    if ce is not None and host > 0:
        late = " and ".join(x for x in ((f"starts its steps {fmt_ns(sl)} later" if sl and sl > 0 else ""),
                                        (f"idles {fmt_ns(ie)} longer inside them" if ie and ie > 0 else "")) if x)
        head = (f"Its extra compute ({fmt_ns(ce)} per step) explains under half of its lateness; it " if ce >= 0 else
                f"It computes {fmt_ns(-ce)} less per step than the others, yet it ")
        return (head + late + ": its host submits the work late.",
                f"Look at {_gpu(s.rank)}'s host side before its collectives: launch overhead, Python work, "
                f"data loading, CPU contention or core affinity (its trace's CPU ops and the largest GPU gaps); "
                f"CUDA Graphs remove the launch cost.")
    return ("Neither its compute nor its idle time stands out per step.",
            f"Compare {_gpu(s.rank)}'s timeline with another GPU's around its late collectives; check its "
            f"clocks and throttling (nvidia-smi -q -d CLOCK,PERFORMANCE).")


def wait_share(result: MultiGpu) -> float | None:
    """Share of all ranks' communication time spent waiting for a late GPU; None with one rank."""
    if result.rank_wait_ns is None:
        return None
    comm = sum(b.comm_ns for b in result.per_rank)
    return sum(result.rank_wait_ns.values()) / comm if comm > 0 else None


def _rank_wait_finding(result: MultiGpu) -> Finding | None:
    """Per GPU: GPU op time that was NCCL kernels waiting for a late peer (multi-rank only)."""
    if result.rank_wait_ns is None:
        return None
    rows = [b for b in result.per_rank if b.spin_ns and b.busy_ns > 0]
    if not rows:
        return None
    top = max(rows, key=lambda b: (b.spin_exposed_ns / b.busy_ns, -b.rank))
    share = top.spin_exposed_ns / top.busy_ns
    if share < 0.02:
        return None
    ev = []
    for b in sorted(rows, key=lambda b: -b.spin_ns):
        ev += [Evidence(f"{_gpu(b.rank)}: waiting inside collectives", b.spin_ns, "ns"),
               Evidence(f"{_gpu(b.rank)}: of it with no compute beside it, share of its GPU busy time",
                        b.spin_exposed_ns / b.busy_ns, "fraction"),
               Evidence(f"{_gpu(b.rank)}: waiting share of its communication time",
                        b.spin_ns / b.comm_ns if b.comm_ns else None, "fraction")]
    window = top.window_ns
    busy_net = top.busy_ns - top.spin_exposed_ns
    # whom it waited for: named when every collective it waited in had the same last GPU
    waited_for = {c.last_rank for c in result.collectives
                  if top.rank in c.ranks and c.spin_ns and c.spin_ns[c.ranks.index(top.rank)] > 0}
    late = f" for {_gpu(next(iter(waited_for)))}" if len(waited_for) == 1 and None not in waited_for else ""
    return Finding(
        "multigpu_rank_wait", "medium" if share >= 0.1 else "low",
        f"{_gpu(top.rank)}'s NCCL kernels wait {fmt_ns(top.spin_ns)}{late} before any data moves: "
        f"{fmt_pct(share)} of its GPU busy time is waiting, not work",
        tuple(ev),
        f"An NCCL kernel that starts before the last GPU joins its collective spins until it does; the timeline "
        f"counts that as GPU busy time and as communication. Without the wait {_gpu(top.rank)} is busy "
        f"{fmt_pct(busy_net / window) if window else 'n/a'} of its GPU window (not "
        f"{fmt_pct(top.busy_ns / window) if window else 'n/a'}), and {fmt_ns(max(top.comm_ns - top.spin_ns, 0))} "
        f"of its {fmt_ns(top.comm_ns)} communication is transfer.",
        "Judge this GPU on its work: the wait makes it look busy (GPU-bound) and communication-heavy, and sending "
        "less per collective does not shorten a wait. Make the late GPU arrive sooner (balance the "
        "work per GPU, remove its host delays), then look at transfer.")


def headline(result: MultiGpu) -> str | None:
    """One sentence: the straggler, where the others wait, communication share and exposure."""
    parts = []
    s = result.straggler
    if s is not None:
        every = (f", in {s.steps_last} of {s.steps} steps" if s.steps_last < s.steps else ", every step") \
            if s.steps else ""
        parts.append(f"{_gpu(s.rank)} arrives last at {s.last_count} of {s.compared} collectives, "
                     f"{_late_text(s)} late on average{every}; the others wait in "
                     f"{_main_kind(result, s.rank)} ({fmt_ns(s.wait_caused_ns)} in total)")
    if result.comm_share is not None:
        basis = "step time" if result.steps else "GPU time"
        waiting = wait_share(result)
        parts.append(f"communication is {fmt_pct(result.comm_share, 0)} of {basis}"
                     + (f", {fmt_pct(result.exposed_share, 0)} of it exposed" if result.exposed_share is not None else "")
                     + (f", {fmt_pct(waiting, 0)} of it waiting for a late GPU" if waiting else ""))
    return ("; ".join(parts) + ".") if parts else None


def _balance_what(workloads) -> str:
    """What to balance across ranks, in the terms of the workload the traces show."""
    kinds = set(workloads or ())
    if kinds and kinds <= {"llm_decode", "llm_prefill", "llm_generate", "llm_serving", "llm_training"}:
        return "shard sizes, tokens per rank, expert placement"
    if kinds == {"recommender"}:
        return "embedding tables and lookups per rank (the sharding plan), batch per rank"
    return "shard sizes, input sizes per rank"


def _overlap_advice(modes, collectives: set[str]) -> tuple[str, str]:
    """How to shorten exposed communication, for the programs the traces come from (their
    ``producer.mode``) and the collective kinds matched across ranks, and what overlap can and
    cannot fix: (advice, what it leaves). Inference with all-reduces and no all-to-all is read as
    tensor parallelism (the all-reduces of row-parallel layers)."""
    kinds = set(modes or ())
    if kinds == {"inference"} and "allreduce" in collectives and "alltoall" not in collectives:
        return ("The collectives sit between dependent layers (tensor parallel), so there is little to overlap "
                "them with: shorten them (a one-shot all-reduce for small messages, the all-reduce fused with "
                "the next norm), overlap them with another micro-batch's compute, or use fewer GPUs at small "
                "batch.", "faster collectives")
    if kinds == {"training"}:
        return ("Overlap collectives with compute (async collectives, gradient bucketing, sequence or "
                "tensor-parallel overlap).", "overlap, bucketing or less gradient volume")
    return ("Overlap collectives with independent compute where the program has it, or send less per step.",
            "overlap or less volume")


def multigpu_findings(result: MultiGpu, coverage=None, workloads=(), modes=()) -> list[Finding]:
    """Straggler, load imbalance, communication share, clock alignment and bandwidth findings.

    ``workloads`` and ``modes`` (the runs' ``workload.kind`` and ``producer.mode``) choose the
    advice's terms: what to balance, and how exposed communication can be shortened (gradient
    bucketing is training advice; a tensor-parallel inference step has little to overlap with).

    ``coverage`` (:class:`~tracestory.analysis.limitations.RankCoverage`): when the traces declare
    more ranks than were given, straggler and imbalance claims say "of the k given (N declared)"
    and are at most ``medium``: the slowest of two ranks need not be the slowest of eight."""
    out: list[Finding] = []
    partial = coverage is not None and coverage.partial
    among = f" of the {coverage.given} given ({coverage.declared} in the job)" if partial else ""
    s = result.straggler
    mean_window = float(np.mean([b.window_ns for b in result.per_rank])) if result.per_rank else 0.0
    if s is not None:
        others = max(len(result.ranks) - 1, 1)
        frac = s.wait_caused_ns / others / mean_window if mean_window > 0 else 0.0
        sev = "high" if frac >= 0.1 else "medium" if frac >= 0.02 else "low"
        if partial and sev == "high":
            sev = "medium"
        ev = [Evidence("last to arrive at collectives", s.last_count, "count"),
              Evidence("collectives on two or more GPUs", s.compared, "count"),
              Evidence("mean lateness when last (vs median of the others)", s.late_mean_ns, "ns"),
              Evidence("wait it caused (sum over the other GPUs)", s.wait_caused_ns, "ns"),
              Evidence("wait at all collectives (all GPUs)", s.total_wait_ns, "ns"),
              Evidence("per other GPU, share of its GPU window", frac, "fraction")]
        if s.steps:
            ev.append(Evidence("steps where it caused the most wait", s.steps_last, "count"))
            ev.append(Evidence("its compute minus the others' mean, per step", s.compute_excess_mean_ns, "ns"))
            ev.append(Evidence("its idle time minus the others' mean, per step", s.idle_excess_mean_ns, "ns"))
            ev.append(Evidence("its step start minus the others' median, mean over steps", s.start_late_mean_ns, "ns"))
        cause, rec = _straggler_cause(result, s)
        out.append(Finding(
            "multigpu_straggler", sev,
            f"{_gpu(s.rank)} is the slowest GPU{among}: last at {s.last_count} of {s.compared} collectives, "
            f"{_late_text(s)} late on average",
            tuple(ev),
            f"A collective completes only when every GPU has joined it: the others sit in "
            f"{_main_kind(result, s.rank)} while {_gpu(s.rank)} catches up, {fmt_ns(s.wait_caused_ns)} of GPU "
            f"time in total. {cause}",
            rec))
    if result.imbalance_max is not None and result.imbalance_max >= 1.05 and len(result.ranks) > 1:
        slow = [st.slowest_rank for st in result.steps] or [max(result.per_rank, key=lambda b: b.compute_ns).rank]
        vals, counts = np.unique(slow, return_counts=True)
        top = int(vals[np.argmax(counts)])
        ev = (Evidence("max / mean compute (worst step)", result.imbalance_max, "ratio"),
              Evidence("GPU with the most compute (most often)", _gpu(top), "text"),
              Evidence("steps where it had the most compute", int(counts.max()) if result.steps else None, "count"),
              Evidence("steps", len(result.steps), "count"))
        out.append(Finding(
            "multigpu_imbalance", "medium" if result.imbalance_max >= 1.1 else "low",
            f"Load imbalance: max/mean compute per {'step' if result.steps else 'run'} reaches "
            f"{result.imbalance_max:.2f}, most on {_gpu(top)}{among}",
            ev, "With synchronous collectives every step runs at the pace of the GPU with the most work.",
            "Balance the work per GPU (" + _balance_what(workloads) + ") or overlap the collectives with "
            "independent compute."))
    if result.comm_share is not None and result.comm_share > 0:
        exposed = result.exposed_share
        cost = result.comm_share * (exposed if exposed is not None else 1.0)
        waiting = wait_share(result)
        ev = [Evidence("communication share of " + ("step time" if result.steps else "GPU window"),
                       result.comm_share, "fraction"),
              Evidence("exposed share of communication (not overlapped by compute)", exposed, "fraction")]
        implication = "Exposed communication adds to the step."
        rec, leaves = _overlap_advice(modes, {g.kind for g in result.groups})
        if result.rank_wait_ns is not None:
            rec = rec[:-1] + (", and remove the straggler first: its wait is paid by every other GPU."
                              if result.straggler is not None else
                              ", and shorten the waits: the GPUs wait for each other's late arrivals in turn "
                              "(no one GPU is the straggler), so look at what delays each GPU's launches.")
            ev += [Evidence("waiting for a late GPU inside collectives (all GPUs)", sum(result.rank_wait_ns.values()), "ns"),
                   Evidence("waiting share of communication time (all GPUs)", waiting, "fraction")]
            if waiting is not None:
                implication += (f" {fmt_pct(waiting)} of the communication time is NCCL kernels waiting for the last "
                                f"GPU to arrive, not transfer.")
            if waiting is not None and waiting >= 0.5:
                rec = ("Most of it is waiting, not transfer: balance the work per GPU and remove the late GPU's delays "
                       f"first; {leaves} shorten only the transfer part.")
        out.append(Finding(
            "multigpu_communication", "medium" if cost >= 0.1 else "low" if cost >= 0.02 else "info",
            f"Communication is {fmt_pct(result.comm_share)} of {'step time' if result.steps else 'the GPU window'}"
            + (f", {fmt_pct(exposed)} of it exposed" if exposed is not None else "")
            + (f"; {fmt_pct(waiting)} of it is waiting for a late GPU" if waiting else ""),
            tuple(ev), implication, rec))
    rw = _rank_wait_finding(result)
    if rw is not None:
        out.append(rw)
    al = result.alignment
    if len(result.ranks) > 1:
        bad = al.residual_median_ns is not None and al.residual_median_ns > 50_000
        out.append(Finding(
            "multigpu_clocks", "low" if bad or al.unaligned_ranks else "info",
            f"Rank clocks aligned by {al.method.replace('_', ' ')}"
            + (f", collective ends agree within {fmt_ns(al.residual_median_ns)} (median)"
               if al.residual_median_ns is not None else ""),
            (Evidence("collectives used", al.matched_collectives, "count"),
             Evidence("residual end spread, median", al.residual_median_ns, "ns"),
             Evidence("residual end spread, max", al.residual_max_ns, "ns"),
             Evidence("ranks without a shared collective", ", ".join(map(str, al.unaligned_ranks)) or "none", "text")),
            "Arrival skew and waits are measured on this common clock; their error is about the residual.",
            "Nothing to do unless the residual is large: then capture all ranks with one profiler session "
            "(nsys) or keep the traces' baseTimeNanoseconds."))
    big = [g for g in result.groups if g.busbw_median_bytes_per_s is not None and g.bytes]
    if big:
        g = max(big, key=lambda g: (g.bytes, g.count))
        out.append(Finding(
            "multigpu_bandwidth", "info",
            f"Largest {_kind(g.kind)} ({fmt_bytes(g.bytes)} {g.dtype or ''}) reaches "
            f"{_gbps(g.busbw_median_bytes_per_s)} bus bandwidth (median)",
            (Evidence("message size", g.bytes, "bytes"), Evidence("instances", g.count, "count"),
             Evidence("algorithm / protocol", f"{g.algorithm or 'n/a'} / {g.protocol or 'n/a'}", "text"),
             Evidence("transfer time, median", g.transfer_median_ns, "ns"),
             Evidence("bus bandwidth, median", _gbps(g.busbw_median_bytes_per_s), "text")),
            "Bus bandwidth (NCCL's definition) is comparable to the link's peak whatever the GPU count.",
            "Compare with the link's peak (NVLink, PCIe, network) and with nccl-tests on the same "
            "machine; small messages are latency-bound and never reach it."))
    return out
