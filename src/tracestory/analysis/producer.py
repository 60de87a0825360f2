"""What produced the trace: framework, serving engine, compiler, graph replays, training or
inference, and the GPU platform, each with the names that show it.

Recommendations carry preconditions on this record (CUDA-graph advice needs a PyTorch program
that does not already replay graphs; torch.compile advice needs PyTorch; gradient advice needs a
training step), so advice is only given to programs it fits.

Signals (names only; no timing):

* **PyTorch**: CPU ops named ``aten::*`` / ``autograd::*`` or a ``ProfilerStep#N`` range; without
  CPU ops (a GPU-only trace: torch.profiler with CUDA activities only, an nsys run without NVTX),
  kernels of PyTorch's own library (ATen: ``at::native::*``, ``void at::native::...``,
  ``at_cuda_detail::``, ``c10::`` types in ATen kernels) or Inductor kernels, which only a PyTorch
  program launches.
* **torch.compile**: Inductor kernels (``triton_poi_*``, ``triton_red_*``, ``triton_per_*``,
  ``triton_tem_*``) or ``CompiledFxGraph`` / ``Torch-Compiled Region`` ranges.
* **graph replays**: :mod:`.graphs` (kernels launched by ``cudaGraphLaunch`` / ``hipGraphLaunch``).
* **serving engine**: vLLM ops (``vllm::*``) or ``execute_context_*`` ranges with vLLM ops;
  SGLang kernels (``sgl_kernel``, ``sgl_hip``) or ``step[DECODE|EXTEND ...]`` ranges; TensorRT-LLM
  op or range names (``tensorrt_llm``). Kernel libraries alone (trtllm-gen GEMMs run inside vLLM)
  never name the engine.
* **training**: backward ops (``*Backward*``, ``autograd::engine::evaluate_function``) or an
  optimizer step (``Optimizer.step``); **inference** when model ops (GEMM, convolution, attention,
  embedding, norm) ran and none of those did, or a serving engine ran; without CPU ops the kernels
  tell it where they can (gradient kernels: training; attention, convolution or norm kernels
  (a model's layers, not GEMMs alone) and no gradient kernel: inference); else ``unknown`` (a
  toy program or a GEMM test says neither).
* **platform**: HIP API names (``hip*``) or AMD kernel libraries mean ROCm; CUDA API names mean CUDA,
  and so does any Nsight Systems export (it records NVIDIA GPUs only).

Limits: a trace without CPU ops (nsys without NVTX, a kernel-only export) says nothing about the
framework or the mode: they are ``unknown``, never guessed; python stack names are not read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..trace import Trace
from .graphs import GraphReplays, graph_replays

# Sources that never record CPU ops (rocprof v1 keeps API calls and base kernel names only): the absence
# of PyTorch ops there says nothing about the framework.
NO_CPU_OPS = ("rocprof-json",)
_PYTORCH_OP = re.compile(r"^(aten|autograd|c10d|profiler)::|^ProfilerStep#\d+$")
# ATen's kernels: launched only by PyTorch (libtorch), whatever program calls it.
_ATEN_KERNEL = re.compile(r"^(void )?at::native::|\bat::native::|^(void )?at_cuda_detail::|\bcunn_")
_INDUCTOR_KERNEL = re.compile(r"^triton_(poi|red|per|tem)_")
_COMPILED_RANGE = re.compile(r"CompiledFxGraph|Torch-Compiled Region")
_BACKWARD = re.compile(r"Backward|^autograd::engine::evaluate_function|_backward(_data)?$")
_OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)")
# Kernels that only a backward pass runs (gradients of conv, norm, attention), or only inference.
_BACKWARD_KERNEL = re.compile(r"backward|_bwd|bwd_|dgrad|wgrad|igemm_wrw|GammaBetaBackward|grad_input", re.I)
_INFERENCE_KERNEL = re.compile(r"_no_training|legit_no_training", re.I)
_MODEL_KERNEL = re.compile(r"flash|fmha|attention|attn|fprop|winograd|layer_?norm|rms_?norm|batch_?norm|softmax", re.I)
# Ops of a model's forward pass: without one, no backward does not make a run "inference".
_MODEL_OP = re.compile(r"^aten::(linear|addmm|mm|bmm|matmul|conv\w*|_convolution|cudnn_convolution|\w*attention\w*|"
                       r"embedding\w*|layer_norm|batch_norm|group_norm|rms_norm|_scaled_mm)$|^vllm::|^sgl_kernel::")
_ENGINES = (
    ("vLLM", re.compile(r"^vllm::|^_C::|^vllm\.")),
    ("SGLang", re.compile(r"^sgl_kernel::|^sglang::|^step\[(DECODE|EXTEND|PREFILL|MIXED)")),
    ("TensorRT-LLM", re.compile(r"tensorrt_llm|^trtllm::")),
)
_SGLANG_KERNEL = re.compile(r"sgl_kernel|sgl_hip")
_ROCM_KERNEL = re.compile(r"^Cijk_|^_ZN5aiter|^void ck::|mfma", re.IGNORECASE)


@dataclass(frozen=True)
class Producer:
    framework: str               # "pytorch", "none" (a plain CUDA/HIP program), "unknown"
    engine: str | None           # "vLLM", "SGLang", "TensorRT-LLM" or None
    compiled: bool               # torch.compile (Inductor) kernels or regions present
    graphs: GraphReplays
    mode: str                    # "training", "inference", "unknown"
    platform: str                # "CUDA", "ROCm", "unknown"
    evidence: tuple[str, ...]    # one short phrase per conclusion

    @property
    def is_pytorch(self) -> bool:
        return self.framework == "pytorch"

    @property
    def replays_graphs(self) -> bool:
        return self.graphs.replays_graphs

    def __repr__(self) -> str:
        what = [self.framework, self.engine or "", "compiled" if self.compiled else "",
                "graphs" if self.replays_graphs else "", self.mode, self.platform]
        return f"Producer({', '.join(w for w in what if w)})"


def _names(trace: Trace, codes: np.ndarray) -> list[str]:
    return [trace.strings[c] for c in np.unique(codes) if c >= 0]


def _first(names, pattern: re.Pattern) -> str | None:
    return next((n for n in names if pattern.search(n)), None)


def detect_producer(trace: Trace) -> Producer:
    """The :class:`Producer` of one trace (see the module docstring for the signals)."""
    ops = _names(trace, trace.ops["name"])
    ranges = _names(trace, trace.ranges["name"])
    kernels = _names(trace, trace.kernels["name"])
    apis = _names(trace, trace.api["name"])
    cpu_names = ops + ranges
    evidence = []

    torch_name = _first(cpu_names, _PYTORCH_OP)
    aten_kernel = None if torch_name else (_first(kernels, _ATEN_KERNEL) or _first(kernels, _INDUCTOR_KERNEL))
    if torch_name:
        framework = "pytorch"
        evidence.append(f"PyTorch ops ({torch_name})")
    elif aten_kernel:
        framework = "pytorch"
        evidence.append(f"PyTorch's kernels without PyTorch ops on the CPU side ({aten_kernel[:60]})")
    elif cpu_names or (apis and trace.meta.source_format not in NO_CPU_OPS):
        framework = "none"
        evidence.append("no PyTorch ops among the CPU-side names: a program without PyTorch")
    else:
        framework = "unknown"

    engine = None
    for label, pattern in _ENGINES:
        hit = _first(cpu_names, pattern) or (label == "SGLang" and _first(kernels, _SGLANG_KERNEL))
        if hit:
            engine = label
            evidence.append(f"{label} ({hit[:60]})")
            break

    inductor = _first(kernels, _INDUCTOR_KERNEL)
    region = _first(cpu_names, _COMPILED_RANGE)
    compiled = bool(inductor or region)
    if compiled:
        evidence.append(f"torch.compile ({(inductor or region)[:60]})")

    graphs = graph_replays(trace)
    if graphs.graph_kernels:
        evidence.append(f"{graphs.graph_kernels} of {graphs.kernel_count} kernels replayed by "
                        f"{graphs.graph_launches} graph launch{'es' if graphs.graph_launches != 1 else ''}")

    backward = _first(ops + ranges, _BACKWARD)
    optimizer = _first(ops + ranges, _OPTIMIZER)
    model_op = _first(ops, _MODEL_OP)
    if backward or optimizer:
        mode = "training"
        evidence.append(f"training ({(backward or optimizer)[:60]})")
    elif not model_op and _first(kernels, _BACKWARD_KERNEL):
        # no CPU op tells (a GPU-only trace, a graph replay): the kernels' own names do
        mode = "training"
        evidence.append(f"training (backward kernel {_first(kernels, _BACKWARD_KERNEL)[:60]})")
    elif not model_op and (_first(kernels, _INFERENCE_KERNEL) or _first(kernels, _MODEL_KERNEL)):
        mode = "inference"
        hit = _first(kernels, _INFERENCE_KERNEL) or _first(kernels, _MODEL_KERNEL)
        evidence.append(f"inference (model kernels such as {hit[:60]} and no gradient kernel)")
    elif framework == "pytorch" and engine:
        mode = "inference"
    elif framework == "pytorch" and model_op:
        mode = "inference"
        evidence.append(f"inference: model ops ({model_op}) and no backward pass")
    else:
        mode = "unknown"

    if any(a.lower().startswith("hip") for a in apis) or _first(kernels, _ROCM_KERNEL):
        platform = "ROCm"
    elif any(a.lower().startswith("cu") for a in apis) or kernels:
        platform = "CUDA" if not _first(kernels, _ROCM_KERNEL) else "ROCm"
    elif trace.meta.source_format.startswith("nsys"):
        platform = "CUDA"   # Nsight Systems records NVIDIA GPUs only, even a capture that missed their work
    else:
        platform = "unknown"
    return Producer(framework, engine, compiled, graphs, mode, platform, tuple(evidence))
