"""Recommendation sentences that fit the program in hand.

Each function takes the run's facts and returns advice whose every clause has its precondition in
those facts: a tool of the GPU vendor in hand (Nsight on NVIDIA, rocprof on AMD), torch.compile
only for PyTorch, a fused RMSNorm / SwiGLU / RoPE only where the trace shows that block running
decomposed, the KV cache only for LLM decode, a lower precision only below the one the GEMMs run
in, CUDA graphs only to a program that does not replay them. Where no clause fits, the advice
says what to look at instead of naming a remedy.
"""

from __future__ import annotations

from .facts import RunFacts

_NCU = "Nsight Compute"
_ROC = "rocprof-compute (Omniperf) or rocprofv3 with counters"


def kernel_profiler(f: RunFacts, kernel: str | None = None) -> str:
    """The per-kernel profiler of the GPU vendor in hand, with a command when it is known."""
    if f.platform == "ROCm":
        return _ROC + (f" (kernel filter {kernel})" if kernel else "")
    if f.platform == "CUDA":
        return _NCU + (f" (ncu --kernel-name regex:{kernel})" if kernel else "")
    return "a kernel profiler (Nsight Compute on NVIDIA GPUs, rocprof-compute on AMD GPUs)"


def cpu_profiler(f: RunFacts) -> str:
    if f.producer.is_pytorch:
        return "py-spy, or torch.profiler with with_stack=True"
    return {"CUDA": "perf, or nsys with CPU sampling", "ROCm": "perf, or rocprofv3 with host tracing"}.get(
        f.platform, "perf, or the profiler of the GPU vendor with CPU sampling"
    )


def graph_capture(f: RunFacts) -> str | None:
    """How to capture the launch sequence in a graph; when part of the run replays graphs already,
    how to move more of it into them; None when graph replays carry most of the kernel time."""
    g = f.producer.graphs
    if f.producer.replays_graphs:
        return None
    if f.in_use.graphs:
        share = g.graph_time_fraction or 0.0
        return (
            f"move more of the step into graphs ({share * 100:.1f}% of kernel time is replayed from "
            f"{g.graph_launches} graph launch{'es' if g.graph_launches != 1 else ''} already; the rest runs "
            "outside them: graph breaks, eager ops, dynamic shapes)"
        )
    hip = f.platform == "ROCm"
    if f.producer.is_pytorch:
        return (
            "capture the step in "
            + ("HIP graphs" if hip else "CUDA Graphs")
            + " (torch.compile mode='reduce-overhead' or torch.cuda.graphs)"
        )
    return "capture the launch sequence in a " + (
        "HIP graph (hipStreamBeginCapture / hipGraphLaunch)"
        if hip
        else "CUDA graph (cudaStreamBeginCapture / cudaGraphLaunch)"
    )


def fusion(f: RunFacts) -> str:
    """Small-op fusion advice naming only what the trace shows unfused."""
    w, use = f.workload, f.in_use
    blocks = []
    if w.has("rms_norm_unfused") and not use.fused_norm:
        blocks.append("a fused RMSNorm (the trace runs it as pow/mean/rsqrt/mul ops)")
    if w.has("gated_act_unfused") and not use.fused_activation and w.is_llm:
        blocks.append("a fused SwiGLU (silu and mul run as separate ops)")
    if w.has("rope_unfused") and not use.fused_rope and w.is_llm:
        blocks.append("a fused rotary embedding (cos/sin/neg/cat ops)")
    if w.kind == "vision" and w.has("batch_norm") and f.producer.mode == "inference":
        blocks.append("batch norm folded into the convolutions (inference)")
    # torch.compile needs the Python side: PyTorch known from ATen kernels alone may be libtorch from C++
    compile_ = f.producer.is_pytorch and not use.compiled and len(f.trace.ops) > 0
    engine = f.producer.engine
    if engine == "vLLM":
        return (
            "fuse the small ops: vLLM compiles the model (torch.compile) and fuses them unless --enforce-eager "
            "or a compilation level of 0 is set; check the compilation config"
            + ("; " + "; ".join(blocks) if blocks else "")
        )
    if engine == "SGLang":
        return "fuse the small ops: SGLang runs torch.compile on the decode batch sizes with --enable-torch-compile" + (
            "; " + "; ".join(blocks) if blocks else ""
        )
    if compile_ and blocks:
        return "fuse the small ops: torch.compile (Inductor) fuses elementwise chains, or use " + "; ".join(blocks)
    if compile_:
        return "fuse the small ops: torch.compile (Inductor) fuses elementwise chains into one kernel each"
    if blocks:
        return "fuse the small ops: " + "; ".join(blocks)
    if use.compiled:
        return (
            "the run is compiled already: look at the small kernels it still launches (graph breaks, ops "
            "Inductor does not fuse) in the top kernels table"
        )
    return (
        "fuse the small kernels into fewer, larger ones (one pass over memory per fused chain) and launch fewer of them"
    )


def memory_bound(f: RunFacts) -> str:
    """Advice for kernels bound by DRAM bandwidth."""
    low = f.in_use.low_precision_gemm
    if f.workload.decodes:
        kv = "" if "fp8" in low or "int8" in low else " and KV cache"
        clauses = [
            f"lower-precision weights{kv} (fp8/int8/int4)"
            if not low
            else f"a quantized KV cache (the weights already run in {', '.join(low)})",
            "batch more sequences per weight read (decode reads every weight once per step)",
        ]
        head = "move fewer bytes per token: "
    else:
        clauses = [] if low else ["lower-precision data where accuracy allows"]
        head = "move fewer bytes: "
    clauses.append("fuse elementwise chains so intermediates stay on chip")
    return head + ", ".join(clauses[:-1]) + (", and " if len(clauses) > 1 else "") + clauses[-1]


def compute_bound(f: RunFacts) -> str:
    low = f.in_use.low_precision_gemm
    if low:
        return (
            f"the GEMMs already run in {', '.join(low)}: check tile shapes and padding, or do less work "
            "(skip padding, exploit sparsity or causality)"
        )
    return (
        "use a faster math path (" + precision_path(f) + ") or less work (skip padding, exploit sparsity or causality)"
    )


def precision_path(f: RunFacts) -> str:
    """The lower precision this GPU offers, from its compute capability or name."""
    devices = f.trace.meta.devices
    cc = max(((d.cc_major or 0) * 10 + (d.cc_minor or 0) for d in devices), default=0)
    name = " ".join(d.name or "" for d in devices).lower()
    if not cc and any(g in name for g in ("v100", "t4", "p100", "titan v")):
        cc = 70
    cores = "matrix cores" if f.platform == "ROCm" else "tensor cores"
    if "mi3" in name or cc >= 89:
        return f"fp8 {cores} where accuracy allows"
    if cc >= 80 or "mi2" in name:
        return f"bf16 {cores}" + ("" if f.platform == "ROCm" else " (fp8 needs Hopper/Ada or newer)")
    if cc:
        return f"fp16 {cores} (this GPU has no bf16 or fp8 {cores})"
    return "a lower precision the GPU supports (bf16/fp16, fp8 on Hopper and newer)"


def gemm(f: RunFacts) -> str:
    low = f.in_use.low_precision_gemm
    conv = " (and convolution)" if f.workload.has("conv") else ""
    if low:
        return (
            f"check the GEMM{conv} shapes: larger batches per GEMM and dimensions that fill the matrix-unit "
            f"tiles; the GEMMs already run in {', '.join(low)}"
        )
    return (
        f"check the GEMM{conv} shapes and precision: larger batches per GEMM, dimensions multiples of 64/128 "
        f"for the {'matrix' if f.platform == 'ROCm' else 'tensor'} cores, and {precision_path(f)}"
    )


def communication(f: RunFacts) -> str:
    """Advice that fits the collective and the program."""
    t = f.trace
    names = " ".join(t.name(int(c)) for c in set(t.kernels["name"][:200_000].tolist())).lower()
    if "alltoall" in names or "all_to_all" in names or ("dispatch" in names and "combine" in names):
        what = "embedding rows per rank" if f.workload.kind == "recommender" else "tokens per expert"
        return (
            f"balance what each rank sends in the all-to-all ({what}) and overlap the exchange with compute "
            "(pipeline the next micro-batch's exchange)"
        )
    if f.producer.mode == "training" and any(n in names for n in ("allreduce", "reduce_scatter", "reducescatter")):
        return (
            "overlap gradient collectives with the backward pass (DDP/FSDP bucketing, larger buckets) or "
            "reduce their volume (lower-precision gradients)"
        )
    if f.producer.mode == "inference":
        return (
            "overlap the tensor-parallel collectives with compute (async TP, fused all-reduce + norm, one-shot "
            "all-reduce for small messages) or use fewer ranks for small batches"
        )
    return "overlap the collectives with compute or send less per step"


def attention(f: RunFacts) -> str:
    use = f.in_use
    if f.workload.has("unfused_attention") and not use.fused_attention:
        return "replace the unfused attention (batched GEMMs with a softmax between them) by a fused kernel " + (
            "(torch.nn.functional.scaled_dot_product_attention)" if f.producer.is_pytorch else "(FlashAttention-style)"
        )
    if use.fused_attention:
        if f.workload.decodes and not use.split_kv:
            return (
                f"attention already runs in fused kernels ({use.fused_attention}); for decode, a kernel "
                "that splits the KV length across blocks (split-KV / flash-decoding) keeps the GPU full at "
                "small batch"
            )
        return (
            f"attention already runs in fused kernels ({use.fused_attention}): check its shapes (head dim, "
            "sequence padding) and profile the top attention kernel with " + kernel_profiler(f)
        )
    return "use a fused attention kernel suited to the phase"


def copies(f: RunFacts, top_kind: str | None) -> str:
    if top_kind == "memcpy_dtod":
        return (
            "most copy time is device-to-device: look for layout copies (.contiguous(), transposes, "
            "concatenations) and copies into communication or cache buffers that an in-place or fused op "
            "would avoid"
        )
    if top_kind == "memset":
        return "avoid re-zeroing buffers every step (reuse them, or allocate without zeroing)"
    if f.producer.is_pytorch:
        return (
            "remove host<->device copies from the step (pinned memory, keep tensors on the GPU, avoid "
            ".item()/.cpu() in the loop)"
        )
    return "remove host<->device copies from the loop (pinned memory, keep data on the GPU, copy asynchronously)"


def recapture(f: RunFacts) -> str:
    """How to capture this program again so that a report can tell more, in the tool that made this
    trace: torch.profiler for a Kineto trace, Nsight Systems for an nsys export, rocprofv3 for a
    rocprof trace. Each clause names only what these inputs lack (phases, op shapes, graph nodes)."""
    fmt = f.analysis.trace.meta.source_format
    no_phases = f.analysis.phases.source == "none"
    no_ops = len(f.analysis.trace.ops) == 0
    if fmt == "kineto":
        steps = (
            "a `schedule` so each iteration is a `ProfilerStep` (this trace has no step markers)"
            if no_phases
            else "the same `schedule` or `record_function` ranges"
        )
        shapes = (
            " (this trace has no CPU ops: the CPU activity and shapes give GPU time per operator)" if no_ops else ""
        )
        return (
            "run the workload under `torch.profiler.profile(activities=[CPU, CUDA], record_shapes=True, "
            f"profile_memory=True)`{shapes} with {steps}, then `prof.export_chrome_trace(...)`"
            + (" (on ROCm, CUDA activity records the HIP kernels)." if f.platform == "ROCm" else ".")
        )
    if fmt.startswith("nsys"):
        ranges = " and NVTX ranges around each step (this trace has none)" if no_phases else ""
        graphs = " --cuda-graph-trace=node" if f.in_use.graphs or f.producer.is_pytorch else ""
        return (
            f"`nsys profile --trace=cuda,nvtx,osrt{graphs} -o NAME <program>`{ranges}, then "
            "`nsys export --type sqlite NAME.nsys-rep` (or pass the .nsys-rep itself)."
        )
    if fmt.startswith("rocprof"):
        return "`rocprofv3 --kernel-trace --memory-copy-trace --marker-trace --output-format json -- <program>`" + (
            ", with roctx ranges around each step (this trace has none)." if no_phases else "."
        )
    return "capture the program with its GPU vendor's timeline profiler (Nsight Systems, rocprofv3 or torch.profiler)."
