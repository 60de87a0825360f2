"""Answer ``--goal`` and ``--question``: map each question to the findings and report sections
that answer it, or say that these inputs do not.

Model: a question is matched to **intents** by keywords (whole-word or prefix matches on its
lower-cased words: "decode", "ITL", "all-reduce", "occupancy", ...). Each intent names the
finding rules that speak to it and the report sections where its numbers are. A question is
answered by the findings of those rules that fired (their titles are the answer) and by the
sections that exist in this report; when no intent matches, or the matched intents have neither
a finding nor a section with data, the answer says "not answered by these inputs" and why
(for example: a question about communication on a single-GPU trace).

Limits: keyword intents, not language understanding; a question that uses none of the words
below is reported as not understood, never guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Intent:
    name: str
    words: tuple[str, ...]          # lower-case keywords; a trailing * matches a prefix
    rules: tuple[str, ...]          # finding rule ids that answer it
    sections: tuple[str, ...]       # report sections that hold its numbers
    needs: str | None = None        # what the inputs must hold, said when they do not


INTENTS = (
    Intent("time breakdown", ("slow*", "bottleneck*", "bound", "where", "spend*", "dominat*", "time", "faster",
                               "optimi*", "speed*", "critical"),
           ("dominant_category", "gpu_idle", "cpu_stall", "critical_path", "bound"),
           ("Executive Summary", "Execution Story", "Visualizations")),
    Intent("decode steps", ("decode", "decoding", "token*", "itl", "tpot", "generation", "generate", "step*",
                            "iteration*", "prefill"),
           ("step_trend", "first_step", "step_outlier", "itl_trend"), ("Execution Story",)),
    Intent("host and launches", ("launch*", "cpu", "host", "overhead", "python", "graph*", "cudagraph*", "idle",
                                 "gap*", "sync*"),
           ("gpu_idle", "cpu_stall", "eager_fusion", "graph_replay", "critical_path"), ("Execution Story",)),
    Intent("kernel efficiency", ("kernel*", "occupancy", "roofline", "stall*", "register*", "bandwidth", "flop*",
                                 "compute-bound", "memory-bound", "efficien*", "utili*", "sm", "tensor"),
           ("bound", "occupancy_limiter", "occupancy_achieved"), ("Hardware Behavior Analysis",),
           needs="Nsight Compute metrics (or recorded op shapes for an estimate)"),
    Intent("memory", ("memory", "oom", "alloc*", "fragment*", "hbm", "vram", "cache"), ("memory",),
           ("Memory",), needs="memory events (profile_memory=True)"),
    Intent("communication", ("nccl", "rccl", "all-reduce", "allreduce", "all-gather", "allgather", "collective*",
                             "communication", "comm", "multi-gpu", "rank*", "straggler*", "overlap*",
                             "tensor-parallel", "tp", "distributed"),
           ("communication", "straggler", "imbalance", "exposed_comm", "busbw", "comm_overlap"),
           ("Multi-GPU",), needs="collectives or several ranks"),
    Intent("compilation", ("compile*", "inductor", "fusion", "fuse*", "triton", "eager"),
           ("eager_fusion", "compiled", "fusion"), ("Execution Story",)),
    Intent("serving", ("serving", "batch*", "queue*", "ttft", "throughput", "latency", "request*", "goodput",
                       "scheduler", "preempt*", "qps"),
           ("batch_stall", "itl_trend", "queueing"), ("Continuous Batching",),
           needs="a scheduler event log (tracestory serve --event-log)"),
    Intent("copies", ("memcpy", "copy", "copies", "h2d", "d2h", "pcie", "transfer*"), ("memcpy_share",),
           ("Execution Story",)),
    Intent("precision", ("fp8", "fp4", "mxfp4", "nvfp4", "bf16", "fp16", "int8", "quantiz*", "precision"),
           ("dominant_category", "bound"), ("Appendix",)),
)

_WORD = re.compile(r"[a-z0-9][a-z0-9\-]*")


@dataclass(frozen=True)
class Answer:
    question: str
    intents: tuple[str, ...]
    findings: tuple[str, ...]     # titles of the findings that answer it
    sections: tuple[str, ...]     # sections of this report that hold the numbers
    answered: bool
    why_not: str | None = None    # when not answered: what is missing


def _matches(words: set[str], keys: tuple[str, ...]) -> bool:
    for k in keys:
        if k.endswith("*"):
            if any(w.startswith(k[:-1]) for w in words):
                return True
        elif k in words:
            return True
    return False


def answer(question: str, findings, sections_with_data) -> Answer:
    """Answer one question from ``findings`` (objects with ``rule`` and ``title``) and the titles
    of the report sections that hold data for these inputs."""
    words = set(_WORD.findall(question.lower()))
    intents = [i for i in INTENTS if _matches(words, i.words)]
    if not intents:
        return Answer(question, (), (), (), False, "no known topic in the question (see the report's sections)")
    rules = {r for i in intents for r in i.rules}
    found = tuple(dict.fromkeys(f.title for f in findings if f.rule in rules))
    have = set(sections_with_data)
    sections = tuple(dict.fromkeys(s for i in intents for s in i.sections if s in have))
    if found or sections:
        return Answer(question, tuple(i.name for i in intents), found, sections, True)
    needs = [i.needs for i in intents if i.needs]
    why = ("these inputs hold no " + " or ".join(needs)) if needs else "no finding of these inputs speaks to it"
    return Answer(question, tuple(i.name for i in intents), (), (), False, why)


def answer_all(goal: str | None, questions, findings, sections_with_data) -> tuple[Answer, ...]:
    """The goal (when given) and every question, in order."""
    asked = ([goal] if goal else []) + [q for q in questions if q]
    return tuple(answer(q, findings, sections_with_data) for q in asked)
