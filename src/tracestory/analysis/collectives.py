"""NCCL collectives per rank, matched across ranks, with NCCL's bandwidth formulas.

Per rank (:func:`rank_collectives`): one row per NCCL kernel (``nccl*Kernel_*`` names). Its
arguments come from ``trace.collectives`` (Kineto's "Collective name", "In/Out msg nelems",
"dtype", "Group size", "Process Group Name/Ranks", "Seq") when the source recorded them; for
other kernels (Nsight Systems input, or a profiler that dropped the args) the type, dtype,
algorithm and protocol are parsed from the kernel name and the sizes are unknown (None).
Algorithm (RING, TREE, NVLS, COLLNET_DIRECT, PAT, ...) and protocol (LL, LL128, SIMPLE) always
come from the kernel name when it names them.

Matching (:func:`match_collectives`): one collective is the same on every rank of its process
group when it has the same key ``(process group, p2p or collective, sequence)``; the sequence is
the "Seq" argument when the rank recorded it for every row of that group, else the order of
occurrence within the group on that rank (which assumes every rank's trace covers the same
collectives: the usual case with a ``torch.profiler`` schedule, not when the windows differ).
Without a process group name (nsys) all NCCL kernels of a rank form one group. When some of
a rank's NCCL kernels have args and others do not (Kineto: kernels whose launch happened
before the trace began, so nothing links them to their ``record_param_comms`` op), the
latter are not matched (``seq`` -1): how many such kernels a rank has varies between ranks.

Per matched collective (:func:`collective_stats`), with the ranks' clocks aligned (offsets
from :mod:`.multigpu`): duration per rank; arrival = kernel start; skew = last arrival - first
arrival; the last-arriving rank; each rank's wait = last arrival - its arrival, and its spin =
``min(wait, its duration)``: the part of its kernel that ran before the last peer arrived, NCCL
busy-waiting on the GPU, not moving data (with one rank known, 0: the wait cannot be told from
one rank); transfer time = the last-arriving rank's duration (the only one
without waiting in it; with one rank known, its whole duration, so a lower bound on bandwidth).

Bandwidth (NCCL tests, doc/PERFORMANCE.md): ``algbw = S / t`` with ``t`` the transfer time and
``S`` the collective's size in bytes, which NCCL defines as the whole array: all-reduce,
broadcast, reduce, all-to-all: the (per-rank) input; all-gather: the OUTPUT (``n`` x the
per-rank input); reduce-scatter: the INPUT (``n`` x the per-rank output). PyTorch records
element counts of the input and output, so ``S = max(in, out) x element size`` covers every
case. ``busbw = algbw x factor`` with factor ``2(n-1)/n`` (all-reduce), ``(n-1)/n``
(all-gather, reduce-scatter, all-to-all), 1 (broadcast, reduce, send/recv); ``n`` = group size.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..trace import Trace

KINDS = ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "reduce",
         "sendrecv", "send", "recv", "barrier", "gather", "scatter")
P2P_KINDS = ("sendrecv", "send", "recv")
NCCL_KERNEL = re.compile(r"^(?:void\s+)?nccl\w*Kernel", re.IGNORECASE)

# canonical kind from a name squeezed to lower-case letters, first prefix that matches
_KIND_PREFIX = (("allreduce", "allreduce"), ("allgather", "allgather"), ("reducescatter", "reduce_scatter"),
                ("alltoall", "alltoall"), ("broadcast", "broadcast"), ("reduce", "reduce"),
                ("sendrecv", "sendrecv"), ("send", "send"), ("recv", "recv"), ("barrier", "barrier"),
                ("gather", "gather"), ("scatter", "scatter"))
# PyTorch dtype names ("dtype" arg) and NCCL kernel-name dtype tokens -> bytes per element
DTYPE_BYTES = {
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "long": 8, "int": 4, "short": 2, "char": 1,
    "byte": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1, "complexfloat": 8, "complexdouble": 16, "complexhalf": 4, "uint16": 2,
    "uint32": 4, "uint64": 8,
    "int8_t": 1, "uint8_t": 1, "int32_t": 4, "uint32_t": 4, "int64_t": 8, "uint64_t": 8,
    "__nv_bfloat16": 2, "__nv_fp8_e4m3": 1, "__nv_fp8_e5m2": 1,
    "i8": 1, "u8": 1, "i32": 4, "u32": 4, "i64": 8, "u64": 8, "f16": 2, "f32": 4, "f64": 8,
    "bf16": 2, "f8e4m3": 1, "f8e5m2": 1,
}
_ALGOS = ("RING", "TREE", "NVLS", "NVLS_TREE", "COLLNET_DIRECT", "COLLNET_CHAIN", "COLLNET", "PAT")
_PROTOS = {"LL": "LL", "LL128": "LL128", "SIMPLE": "SIMPLE"}
_REDOPS = ("sum", "prod", "max", "min", "premulsum", "sumpostdiv", "avg")


def canonical_kind(name: str) -> str | None:
    """``"_allgather_base"`` -> ``"allgather"``, ``"ReduceScatter"`` -> ``"reduce_scatter"``."""
    squeezed = re.sub(r"[^a-z]", "", name.lower())
    for prefix, kind in _KIND_PREFIX:
        if squeezed.startswith(prefix):
            return kind
    return None


def busbw_factor(kind: str | None, n: int | None) -> float | None:
    """NCCL's bus-bandwidth correction for ``n`` ranks (see the module docstring)."""
    if kind is None or n is None or n < 1:
        return None
    if kind == "allreduce":
        return 2.0 * (n - 1) / n
    if kind in ("allgather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    if kind in ("broadcast", "reduce") + P2P_KINDS:
        return 1.0
    return None


@dataclass(frozen=True)
class NcclKernelName:
    kind: str | None
    algorithm: str | None
    protocol: str | None
    dtype: str | None
    redop: str | None


def parse_nccl_kernel(name: str) -> NcclKernelName | None:
    """Fields of an NCCL kernel name; None for a kernel that is not NCCL's.

    Handles the pre-2.19 form ``ncclKernel_AllReduce_RING_LL_Sum_float(...)``, the 2.19+ form
    ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)`` and symmetric kernels
    ``ncclSymDevKernel_AllReduce_..._sum_bf16``."""
    if not NCCL_KERNEL.match(name):
        return None
    base = re.sub(r"^(?:void\s+)?", "", name).split("(", 1)[0].split("<", 1)[0]
    tokens = base.split("_")[1:]
    kind = canonical_kind(tokens[0]) if tokens else None
    algo = proto = dtype = redop = None
    i = 1
    while i < len(tokens):
        tok, up = tokens[i], tokens[i].upper()
        pair = f"{up}_{tokens[i + 1].upper()}" if i + 1 < len(tokens) else ""
        if algo is None and pair in _ALGOS:
            algo, i = pair, i + 2
            continue
        if algo is None and up in _ALGOS:
            algo = up
        elif proto is None and up in _PROTOS:
            proto = _PROTOS[up]
        elif redop is None and tok.lower() in _REDOPS:
            redop = tok.lower()
        elif dtype is None and tok.lower() in DTYPE_BYTES:
            dtype = tok.lower()
        i += 1
    # names split dtypes such as "int8_t" / "__nv_bfloat16" on "_": look for them whole
    if dtype is None:
        m = re.search(r"_(u?int\d+_t|__nv_bfloat16|__nv_fp8_e\dm\d|half|float|double)$", base)
        dtype = m.group(1) if m else None
    return NcclKernelName(kind, algo, proto, dtype, redop)


def dtype_bytes(dtype: str | None) -> int | None:
    return DTYPE_BYTES.get(dtype.lower()) if dtype else None


@dataclass(frozen=True, eq=False)
class RankCollectives:
    """One rank's NCCL kernels, one row each, in start order; times on the rank's own clock.

    Integer columns use -1 for unknown; string columns are object arrays ("" = unknown)."""

    start_ns: np.ndarray      # int64
    end_ns: np.ndarray        # int64
    kernel_index: np.ndarray  # int64 row in trace.kernels
    kind: np.ndarray          # str: one of KINDS, "" if unknown
    dtype: np.ndarray         # str: the "dtype" arg (PyTorch name) or the kernel name's token
    in_nelems: np.ndarray     # int64
    out_nelems: np.ndarray    # int64
    bytes: np.ndarray         # int64: S of the module docstring, -1 when sizes are unknown
    group_size: np.ndarray    # int64
    pg: np.ndarray            # str: process group name, "" when not recorded
    pg_ranks: np.ndarray      # str: "[0, 1]" or ""
    seq: np.ndarray           # int64: the matching sequence (Seq arg or order in the group), -1: not matched
    seq_from_arg: np.ndarray  # bool: seq is the recorded "Seq"
    algorithm: np.ndarray     # str
    protocol: np.ndarray      # str
    step: np.ndarray          # int64: index of the rank's step containing the start, -1

    def __len__(self) -> int:
        return int(self.start_ns.size)

    @property
    def is_p2p(self) -> np.ndarray:
        return np.isin(self.kind, P2P_KINDS)

    def with_steps(self, step: np.ndarray) -> RankCollectives:
        import dataclasses

        return dataclasses.replace(self, step=np.asarray(step, dtype=np.int64))


def _obj(values) -> np.ndarray:
    values = list(values)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def rank_collectives(trace: Trace) -> RankCollectives:
    """The NCCL kernels of one trace (see the module docstring)."""
    k = trace.kernels
    codes = np.unique(k["name"]) if len(k) else np.zeros(0, dtype=np.int32)
    parsed = {int(c): parse_nccl_kernel(trace.name(int(c))) for c in codes}
    nccl_codes = np.array([c for c, p in parsed.items() if p is not None], dtype=np.int32)
    rows = np.flatnonzero(np.isin(k["name"], nccl_codes)) if len(k) else np.zeros(0, dtype=np.int64)
    # rows of trace.collectives (args) by kernel row
    c = trace.collectives
    arg_of = np.full(len(k), -1, dtype=np.int64)
    if len(c):
        ok = (c["kernel_index"] >= 0) & (c["kernel_index"] < len(k))
        arg_of[c["kernel_index"][ok]] = np.flatnonzero(ok)
        rows = np.union1d(rows, c["kernel_index"][ok])
    rows = rows[np.argsort(k["start_ns"][rows], kind="stable")]
    n = rows.size
    a = arg_of[rows]
    has = a >= 0
    ai = np.where(has, a, 0)

    def arg_int(col: str) -> np.ndarray:
        if not len(c):
            return np.full(n, -1, dtype=np.int64)
        return np.where(has, c[col][ai].astype(np.int64), -1)

    def arg_str(col: str) -> np.ndarray:
        if not len(c):
            return _obj([""] * n)
        return _obj(trace.name(int(x)) if h else "" for x, h in zip(c[col][ai], has))

    names = [parsed.get(int(code)) for code in k["name"][rows]]
    arg_kind = arg_str("name")
    kind = _obj((canonical_kind(ak) if ak else None) or (p.kind if p else None) or ""
                for ak, p in zip(arg_kind, names))
    arg_dtype = arg_str("dtype")
    dtype = _obj(d or (p.dtype if p else None) or "" for d, p in zip(arg_dtype, names))
    in_n, out_n = arg_int("in_nelems"), arg_int("out_nelems")
    esize = np.array([dtype_bytes(d) or -1 for d in dtype], dtype=np.int64)
    nel = np.maximum(in_n, out_n)
    nbytes = np.where((nel >= 0) & (esize > 0), nel * esize, -1)
    pg = arg_str("pg_name")
    seq_arg = arg_int("seq")
    kind_arr = kind
    p2p = np.isin(kind_arr, P2P_KINDS)
    seq = np.full(n, -1, dtype=np.int64)
    from_arg = np.zeros(n, dtype=bool)
    for g in dict.fromkeys(zip(pg.tolist(), p2p.tolist())):  # a handful of groups
        sel = (pg == g[0]) & (p2p == g[1])
        if (seq_arg[sel] >= 0).all():
            seq[sel] = seq_arg[sel]
            from_arg[sel] = True
        else:
            seq[sel] = np.arange(int(sel.sum()))
    if has.any():
        seq[~has] = -1  # NCCL kernels without args next to ones with: launched before the trace began
    return RankCollectives(
        start_ns=k["start_ns"][rows].astype(np.int64), end_ns=k["end_ns"][rows].astype(np.int64),
        kernel_index=rows.astype(np.int64), kind=kind_arr, dtype=dtype, in_nelems=in_n, out_nelems=out_n,
        bytes=nbytes, group_size=arg_int("group_size"), pg=pg, pg_ranks=arg_str("pg_ranks"),
        seq=seq, seq_from_arg=from_arg,
        algorithm=_obj((p.algorithm if p else None) or "" for p in names),
        protocol=_obj((p.protocol if p else None) or "" for p in names),
        step=np.full(n, -1, dtype=np.int64),
    )


# ------------------------------------------------------------------ matching across ranks


@dataclass(frozen=True, eq=False)
class Matching:
    """Collectives matched across ranks: ``rows[i, j]`` is the row of key ``i`` in rank
    ``ranks[j]``'s :class:`RankCollectives`, or -1 when that rank has no such collective."""

    ranks: tuple[int, ...]
    keys: tuple[tuple[str, bool, int], ...]  # (process group, p2p, sequence)
    rows: np.ndarray                         # (n_keys, n_ranks) int64


def match_collectives(per_rank: Sequence[RankCollectives], ranks: Sequence[int]) -> Matching:
    """Match rows of every rank by ``(process group, p2p, sequence)``; keys in sorted order."""
    groups: dict[tuple[str, bool], int] = {}
    parts = []
    for j, rc in enumerate(per_rank):
        gid = np.array([groups.setdefault((g, bool(p)), len(groups)) for g, p in zip(rc.pg, rc.is_p2p)],
                       dtype=np.int64)
        keep = rc.seq >= 0
        parts.append((np.full(int(keep.sum()), j, dtype=np.int64), gid[keep], rc.seq[keep],
                      np.flatnonzero(keep).astype(np.int64)))
    if not parts or sum(p[0].size for p in parts) == 0:
        return Matching(tuple(ranks), (), np.zeros((0, len(ranks)), dtype=np.int64))
    rank_i, gid, seq, row = (np.concatenate(x) for x in zip(*parts))
    keys2 = np.stack([gid, seq], axis=1)
    uniq, inverse = np.unique(keys2, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    table = np.full((len(uniq), len(ranks)), -1, dtype=np.int64)
    table[inverse, rank_i] = row
    names = {v: k for k, v in groups.items()}
    keys = tuple((names[int(g)][0], names[int(g)][1], int(s)) for g, s in uniq)
    return Matching(tuple(int(r) for r in ranks), keys, table)


def matched_times(per_rank: Sequence[RankCollectives], m: Matching, column: str) -> np.ndarray:
    """``(n_keys, n_ranks)`` float array of a time column (rank clocks), NaN where absent."""
    out = np.full(m.rows.shape, np.nan)
    for j, rc in enumerate(per_rank):
        r = m.rows[:, j]
        ok = r >= 0
        out[ok, j] = getattr(rc, column)[r[ok]]
    return out


# ------------------------------------------------------------------ per collective


@dataclass(frozen=True)
class CollectiveStat:
    """One collective across the ranks that ran it; times aligned to the reference clock."""

    pg: str
    seq: int
    kind: str
    dtype: str | None
    bytes: int | None
    group_size: int | None
    algorithm: str | None
    protocol: str | None
    ranks: tuple[int, ...]
    start_ns: tuple[int, ...]          # per rank in ``ranks``, aligned
    end_ns: tuple[int, ...]
    duration_ns: tuple[int, ...]
    wait_ns: tuple[int, ...]           # last arrival - own arrival
    skew_ns: int | None                # last - first arrival; None with one rank
    end_spread_ns: int | None          # last - first end (the alignment residual); None with one rank
    last_rank: int | None              # None with one rank, or when all arrived together
    transfer_ns: int                   # the last-arriving rank's duration
    algbw_bytes_per_s: float | None
    busbw_bytes_per_s: float | None
    step: int | None                   # step index on the reference (first) rank, None if none
    consistent: bool                   # kind and size agree on every rank
    spin_ns: tuple[int, ...] = ()      # per rank: the part of its kernel spent waiting, min(wait, duration)

    @property
    def total_wait_ns(self) -> int:
        return int(sum(self.wait_ns))


def collective_stats(per_rank: Sequence[RankCollectives], m: Matching,
                     offsets_ns: Sequence[int]) -> tuple[CollectiveStat, ...]:
    """Every matched collective, in order of first aligned arrival. ``offsets_ns[j]`` is added
    to rank ``m.ranks[j]``'s times to put them on the reference clock."""
    if not m.keys:
        return ()
    off = np.asarray(offsets_ns, dtype=np.float64)
    start = matched_times(per_rank, m, "start_ns") + off
    end = matched_times(per_rank, m, "end_ns") + off
    present = m.rows >= 0
    first_arrival = np.nanmin(np.where(present, start, np.inf), axis=1)
    out = []
    for i in np.argsort(first_arrival, kind="stable"):
        js = np.flatnonzero(present[i])
        rc0 = per_rank[js[0]]
        r0 = m.rows[i, js[0]]
        s = start[i, js].astype(np.int64)
        e = end[i, js].astype(np.int64)
        d = e - s
        last = int(np.argmax(s))
        wait = s[last] - s
        kinds = {per_rank[j].kind[m.rows[i, j]] for j in js}
        sizes = {int(per_rank[j].bytes[m.rows[i, j]]) for j in js}
        kind = rc0.kind[r0] or ""
        nbytes = int(rc0.bytes[r0])
        gsize = int(rc0.group_size[r0])
        n = gsize if gsize > 0 else (len(js) if len(js) > 1 else None)
        transfer = int(d[last])
        algbw = nbytes / (transfer * 1e-9) if nbytes >= 0 and transfer > 0 else None
        factor = busbw_factor(kind or None, n)
        step = int(rc0.step[r0])
        out.append(CollectiveStat(
            pg=m.keys[i][0], seq=m.keys[i][2], kind=kind, dtype=rc0.dtype[r0] or None,
            bytes=nbytes if nbytes >= 0 else None, group_size=gsize if gsize > 0 else None,
            algorithm=rc0.algorithm[r0] or None, protocol=rc0.protocol[r0] or None,
            ranks=tuple(m.ranks[j] for j in js), start_ns=tuple(s.tolist()), end_ns=tuple(e.tolist()),
            duration_ns=tuple(d.tolist()), wait_ns=tuple(wait.tolist()),
            skew_ns=int(s.max() - s.min()) if js.size > 1 else None,
            end_spread_ns=int(e.max() - e.min()) if js.size > 1 else None,
            last_rank=m.ranks[js[last]] if js.size > 1 and s[last] > s.min() else None,
            transfer_ns=transfer, algbw_bytes_per_s=algbw,
            busbw_bytes_per_s=algbw * factor if algbw is not None and factor is not None else None,
            step=step if step >= 0 else None, consistent=len(kinds) == 1 and len(sizes) == 1,
            spin_ns=tuple(np.clip(wait, 0, np.maximum(d, 0)).tolist()),
        ))
    return tuple(out)


# ------------------------------------------------------------------ grouped for the table


@dataclass(frozen=True)
class CollectiveGroup:
    """Collectives of one kind, size, dtype, group and algorithm, over instances and ranks."""

    kind: str
    bytes: int | None
    dtype: str | None
    pg: str
    group_size: int | None
    algorithm: str | None
    protocol: str | None
    count: int                          # collectives (instances)
    duration_min_ns: int                # over every (instance, rank)
    duration_median_ns: float
    duration_max_ns: int
    transfer_median_ns: float
    busbw_median_bytes_per_s: float | None
    skew_median_ns: float | None
    skew_max_ns: int | None
    last_rank: int | None               # the rank most often last to arrive
    last_rank_count: int                # how many of ``count`` it was last
    total_wait_ns: int                  # summed over instances and ranks


def group_collectives(stats: Sequence[CollectiveStat]) -> tuple[CollectiveGroup, ...]:
    """Groups of :func:`collective_stats` rows, largest total time (duration sum) first."""
    buckets: dict[tuple, list[CollectiveStat]] = {}
    for s in stats:
        buckets.setdefault((s.kind, s.bytes, s.dtype, s.pg, s.group_size, s.algorithm, s.protocol), []).append(s)
    out = []
    for key, ss in buckets.items():
        durs = np.concatenate([np.asarray(s.duration_ns, dtype=np.int64) for s in ss])
        skews = np.array([s.skew_ns for s in ss if s.skew_ns is not None], dtype=np.int64)
        bws = [s.busbw_bytes_per_s for s in ss if s.busbw_bytes_per_s is not None]
        lasts = [s.last_rank for s in ss if s.last_rank is not None]
        if lasts:
            vals, counts = np.unique(lasts, return_counts=True)
            top = int(np.argmax(counts))
            last, last_n = int(vals[top]), int(counts[top])
        else:
            last, last_n = None, 0
        out.append((int(durs.sum()), CollectiveGroup(
            kind=key[0], bytes=key[1], dtype=key[2], pg=key[3], group_size=key[4], algorithm=key[5],
            protocol=key[6], count=len(ss), duration_min_ns=int(durs.min()),
            duration_median_ns=float(np.median(durs)), duration_max_ns=int(durs.max()),
            transfer_median_ns=float(np.median([s.transfer_ns for s in ss])),
            busbw_median_bytes_per_s=float(np.median(bws)) if bws else None,
            skew_median_ns=float(np.median(skews)) if skews.size else None,
            skew_max_ns=int(skews.max()) if skews.size else None,
            last_rank=last, last_rank_count=last_n,
            total_wait_ns=int(sum(s.total_wait_ns for s in ss)),
        )))
    out.sort(key=lambda t: (-t[0], t[1].kind, t[1].pg))
    return tuple(g for _, g in out)
