"""Writes the two synthetic Nsight Systems SQLite exports of this folder (see README.md).

No public nsys export with CUDA graph replays was found, so these are built by hand: the tables
and columns are those of real exports (named in README.md), the rows are a small made-up
program: an eager prefill (6 kernels, each launched by ``cudaLaunchKernel``) then 8 decode steps,
each one ``cudaGraphLaunch`` of one graph of 5 kernel nodes, inside NVTX ranges.

* ``graph_nodes.sqlite``: the program as ``nsys profile --cuda-graph-trace=node`` records it:
  every node is a ``CUPTI_ACTIVITY_KIND_KERNEL`` row with ``graphNodeId``/``graphId`` and the
  ``correlationId`` of its ``cudaGraphLaunch`` call.
* ``graph_whole.sqlite``: the same program as nsys's default ``--cuda-graph-trace=graph``
  records it: one ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` row per launch, no kernel row for the nodes.

Run ``python3 make_graph_exports.py`` in this folder; the output is deterministic.
"""

import os
import sqlite3

PID = 4242
GPID = PID << 24                 # globalPid: pid in bits 24..47
GTID = GPID + PID                # globalTid of the main thread
DEVICE, CONTEXT, STREAM = 0, 1, 7
GRAPH_ID, GRAPH_EXEC_ID = 3, 4

KERNEL_COLUMNS = """
    start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL,
    greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER,
    demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER,
    cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL,
    gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL,
    staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
    localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
    sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER,
    qmdBulkReleaseDone INTEGER, qmdPreexitDone INTEGER, qmdLastCtaDone INTEGER, graphId INTEGER,
    clusterX INTEGER, clusterY INTEGER, clusterZ INTEGER, clusterSchedulingPolicy INTEGER,
    maxPotentialClusterSize INTEGER, maxActiveClusters INTEGER, sharedMemoryRequestedPercentage INTEGER,
    tensorSizeMinusOneElements TEXT NOT NULL"""
SCHEMA = f"""
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
CREATE TABLE META_DATA_CAPTURE (name TEXT NOT NULL, value TEXT);
CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT,
    isDiscrete INTEGER, l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER,
    smCount INTEGER, uuid TEXT, chipName TEXT, cuDevice INTEGER, computeMajor INTEGER, computeMinor INTEGER);
CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
    eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
    returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
    category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
    domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
    int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL ({KERNEL_COLUMNS});
"""
GRAPH_TRACE = """CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
    correlationId INTEGER, globalPid INTEGER, graphId INTEGER NOT NULL, graphExecId INTEGER NOT NULL);"""

STRINGS = [
    "cudaLaunchKernel_v7000", "cudaGraphLaunch_v10000", "cudaStreamSynchronize_v3020",
    # (demangled, short) kernel names, as nsys stores them
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::BFloat16>>(int, T2, T3)",
    "vectorized_elementwise_kernel",
    "void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>(T1 *, const T1 *, const T1 *, float, int, int)",
    "rms_norm_kernel",
    "nvjet_sm90_tst_128x128_64x4_1x2_h_bz_coopA_NTN", "nvjet_sm90_tst_128x128_64x4_1x2_h_bz_coopA_NTN",
    "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>, true>(Flash_fwd_params)",
    "flash_fwd_splitkv_kernel",
    "void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel>(T1 *, const T1 *, int)",
    "act_and_mul_kernel",
]
SID = {s: i + 1 for i, s in enumerate(dict.fromkeys(STRINGS))}
FILL, NORM, GEMM, ATTN, ACT = (STRINGS[i] for i in (3, 5, 7, 9, 11))
SHORT = {FILL: STRINGS[4], NORM: STRINGS[6], GEMM: STRINGS[8], ATTN: STRINGS[10], ACT: STRINGS[12]}
# the graph's kernel nodes in order, with their durations (ns)
NODES = [(NORM, 2_100), (GEMM, 9_800), (ATTN, 6_400), (ACT, 1_900), (GEMM, 8_700)]
PREFILL = [(FILL, 1_500), (NORM, 14_000), (GEMM, 120_000), (ATTN, 80_000), (ACT, 21_000), (GEMM, 110_000)]
STEPS = 8
T0 = 1_000_000_000


def kernel_row(start, end, corr, name, node=None, graph=None):
    return (start, end, DEVICE, CONTEXT, None, STREAM, corr, GPID, SID[name], SID[SHORT[name]], None, 0, 0, 64,
            132, 1, 1, 128, 1, 1, 0, 49152, 0, 0, corr, None, node, None, None, None, None, graph, 1, 1, 1, 0,
            0, 0, None, "")


def program():
    """Runtime calls, NVTX ranges, eager kernels and the graph replays, in time order."""
    api, nvtx, kernels, replays = [], [], [], []
    t, corr = T0, 0
    gpu = T0 + 20_000  # the GPU's clock runs ahead of nothing: kernels start after their launch
    start_prefill = t
    for name, dur in PREFILL:
        corr += 1
        api.append((t, t + 4_000, 0, GTID, corr, SID["cudaLaunchKernel_v7000"], 0, None))
        begin = max(gpu, t + 6_000)
        kernels.append(kernel_row(begin, begin + dur, corr, name))
        gpu = begin + dur + 1_000
        t += 5_000
    corr += 1
    api.append((t, gpu + 2_000, 0, GTID, corr, SID["cudaStreamSynchronize_v3020"], 0, None))
    t = gpu + 3_000
    nvtx.append((start_prefill, t, 59, None, None, None, "prefill", GTID, None, None, None))
    for step in range(STEPS):
        begin_step = t
        corr += 1
        api.append((t, t + 7_000, 0, GTID, corr, SID["cudaGraphLaunch_v10000"], 0, None))
        gpu = t + 12_000
        first = gpu
        for node, (name, dur) in enumerate(NODES, start=1):
            kernels.append(kernel_row(gpu, gpu + dur, corr, name, node=100 + node, graph=GRAPH_ID))
            gpu += dur + 600  # a device-side gap between two nodes of one replay
        replays.append((first, gpu - 600, DEVICE, CONTEXT, None, STREAM, corr, GPID, GRAPH_ID, GRAPH_EXEC_ID))
        corr += 1
        api.append((t + 8_000, gpu + 1_500, 0, GTID, corr, SID["cudaStreamSynchronize_v3020"], 0, None))
        t = gpu + 30_000  # host work between steps (sampling, scheduling)
        nvtx.append((begin_step, t, 59, None, None, None, f"decode_{step}", GTID, None, None, None))
    return api, nvtx, kernels, replays


def write(path, mode):
    if os.path.exists(path):
        os.remove(path)
    db = sqlite3.connect(path)
    db.executescript(SCHEMA + (GRAPH_TRACE if mode == "Graph" else ""))
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in SID.items()])
    db.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)", [
        ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"), ("EXPORT_PRODUCT_VERSION", "synthetic (2026.2 schema)"),
        ("EXPORT_SCHEMA_VERSION", "3.25.0"), ("DERIVED_BY", "tests/data/nsys_graphs/make_graph_exports.py")])
    db.executemany("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)", [
        ("CUDA_GRAPH_TRACE_OPTIONS:MODE", mode), ("CUDA_GRAPH_TRACE_OPTIONS:TRACE_DEVICE_GRAPH_LAUNCH", "true")])
    db.execute("INSERT INTO TARGET_INFO_GPU VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
               (0, DEVICE, "NVIDIA H100 80GB HBM3", "0000:19:00.0", 1, 52428800, 85520809984, 3352320000000,
                1980000000, 132, "00000000-0000-0000-0000-000000000000", "GH100", 0, 9, 0))
    db.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (GPID, PID, "python3"))
    api, nvtx, kernels, replays = program()
    if mode == "Graph":
        kernels = [k for k in kernels if k[26] is None]  # the nodes are not traced
        db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", replays)
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?, ?, ?, ?)", api)
    db.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, rangeId, category, color, text, globalTid, "
                   "endGlobalTid, textId, domainId) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", nvtx)
    db.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ({', '.join('?' * 40)})", kernels)
    db.commit()
    db.execute("VACUUM")
    db.close()


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    write(os.path.join(here, "graph_nodes.sqlite"), "Node")
    write(os.path.join(here, "graph_whole.sqlite"), "Graph")
