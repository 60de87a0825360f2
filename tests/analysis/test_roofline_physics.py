"""Shape-based estimates kept inside physics: byte counts worked out by hand, and an estimate
above its roof dropped instead of reported."""

from __future__ import annotations

import json

import numpy as np

from tracestory.analysis.roofline import _cost, estimate_roofline
from tracestory.specs import Peaks
from tracestory.trace import StringPool, TraceMeta, build_trace, make_table


def test_fp32_to_bf16_copy_moves_six_bytes_per_element():
    # copy_(dst bf16 [1024, 1024], src fp32 [1024, 1024]): 2 bytes written + 4 read per element.
    flops, nbytes, _ = _cost("aten::copy_", json.dumps([[1024, 1024], [1024, 1024]]).encode(),
                             json.dumps(["c10::BFloat16", "float"]).encode(), float("nan"))
    assert (flops, nbytes) == (0.0, 6.0 * 1024 * 1024)


def _mm_trace(kernel_ns):
    """One aten::mm of [4096, 4096] x [4096, 4096] bf16 (2 * 4096^3 = 137.4 GFLOP) whose kernel
    took ``kernel_ns``."""
    pool = StringPool()
    ops = make_table("ops", name=pool.encode(["aten::mm"]), start_ns=[0], end_ns=[10_000_000], external_id=[7],
                     tid=[1], pid=[1], flops=[np.nan],
                     input_dims=np.array([json.dumps([[4096, 4096], [4096, 4096]]).encode()], dtype=object),
                     input_types=np.array([json.dumps(["c10::BFloat16", "c10::BFloat16"]).encode()], dtype=object))
    k = make_table("kernels", name=pool.encode(["nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_NNN"]), start_ns=[100],
                   end_ns=[100 + kernel_ns], external_id=[7], device=[0], stream=[7], correlation=[1])
    return build_trace(TraceMeta(source_path="hand.json", source_format="kineto"), pool, ops=ops, kernels=k)


PEAKS = Peaks(name="test GPU", flops_per_s={"bf16": 1e15}, dram_bytes_per_s=3e12, source="hand")


def test_estimate_above_the_roof_is_dropped_and_named():
    # 137.4 GFLOP in 1 ms is 137 TFLOP/s: 13.7% of a 1 PFLOP/s roof, kept.
    ok = estimate_roofline(_mm_trace(1_000_000), PEAKS)
    assert len(ok.points) == 1 and abs(ok.points[0].pct_of_roof - 2 * 4096 ** 3 / 1e-3 / 1e15 * 100) < 1e-9
    assert ok.dropped == ()
    # The same shapes in 10 us would be 13.7 PFLOP/s, 1374% of the roof: an estimate error.
    bad = estimate_roofline(_mm_trace(10_000), PEAKS)
    assert bad.points == () and len(bad.dropped) == 1 and bad.dropped[0][1] > 1000
    assert "above the roof dropped as estimate errors" in bad.note


# --------------------------------------------------------------------------- causal attention
import gzip
from pathlib import Path

from tracestory.analysis.roofline import kept_score_fraction
from tracestory.ingest.kineto import load_kineto

QWEN_H100 = Path(__file__).parents[1] / "data" / "field" / "AMD-AGI_TraceLens__h100_hf_qwen1.5-0.5b_chat.json.gz"


def _mask_count(sq, sk, bottom_right):
    """Entries an explicit boolean mask keeps: torch's documented ``tril(ones(L, S))`` for the
    top-left mask, ``tril(ones(L, S), diagonal=S - L)`` for the bottom-right one."""
    return int(np.tril(np.ones((sq, sk), dtype=bool), k=(sk - sq) if bottom_right else 0).sum())


def test_kept_score_fraction_matches_an_explicit_mask():
    for sq, sk in [(1, 1), (5, 5), (559, 559), (3, 7), (7, 3), (1, 513), (4, 4097), (64, 16)]:
        assert kept_score_fraction(sq, sk, 1) * sq * sk == _mask_count(sq, sk, False), (sq, sk)
        assert kept_score_fraction(sq, sk, 2) * sq * sk == _mask_count(sq, sk, True), (sq, sk)
        assert kept_score_fraction(sq, sk, 0) == 1.0 and kept_score_fraction(sq, sk, -1) == 1.0
    # square: half the matrix plus the diagonal, 559 * 560 / 2 of 559^2
    assert kept_score_fraction(559, 559, 1) == 559 * 560 / 2 / 559 ** 2


def test_causal_prefill_attention_on_the_h100_qwen_trace_counts_the_mask():
    # Read by hand from the JSON: 24 aten::_flash_attention_forward ops (one per layer), each with
    # "Input Dims" q = k = v = [16, 559, 16, 64] (B, S, H, D, bf16) and "Concrete Inputs"[8]
    # (is_causal) = "True", each launching one pytorch_flash::flash_fwd_kernel.
    # QK^T and PV over a causal 559 x 559 mask: 2 matmuls * 2 FLOP * B*H*D * (559 * 560 / 2)
    #   = 4 * 16 * 16 * 64 * 156_520 = 10_257_694_720 FLOP per op; 24 ops = 246_184_673_280.
    # (The full matrix would be 4 * 16 * 16 * 64 * 559^2 = 20_478_853_120 per op: about twice.)
    doc = json.loads(gzip.open(QWEN_H100).read())
    flash = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::_flash_attention_forward"]
    assert len(flash) == 24
    assert {e["args"]["Concrete Inputs"][8] for e in flash} == {"True"}
    assert {json.dumps(e["args"]["Input Dims"][0]) for e in flash} == {"[16, 559, 16, 64]"}
    trace = load_kineto(QWEN_H100)
    est = estimate_roofline(trace, None)
    fwd = [p for p in est.points if "flash_fwd_kernel" in p.label]
    assert len(fwd) == 1 and fwd[0].count == 24
    assert abs(fwd[0].flops / (24 * 10_257_694_720) - 1) < 1e-12  # float64 rounding only
    # bytes do not depend on the mask: q, k, v read and o written, 16*559*16*64 bf16 elements each
    assert abs(fwd[0].dram_bytes / (24 * 4 * 16 * 559 * 16 * 64 * 2) - 1) < 1e-12


def test_reader_keeps_the_causal_flag_of_each_attention_op():
    # Plain JSON: the flag at each op's is_causal position (schema order in native_functions.yaml).
    position = {"aten::scaled_dot_product_attention": 5, "aten::_scaled_dot_product_flash_attention": 4,
                "aten::_flash_attention_forward": 8}
    doc = json.loads(gzip.open(QWEN_H100).read())
    want = [(e["name"], e["args"]["Concrete Inputs"][position[e["name"]]] == "True")
            for e in sorted((e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] in position),
                            key=lambda e: (e["ts"], e["name"]))]
    trace = load_kineto(QWEN_H100)
    ops = trace.ops
    rows = [i for i in np.lexsort((trace.names(ops["name"]).astype(str), ops["start_ns"]))
            if trace.name(int(ops["name"][i])) in position]
    got = [(trace.name(int(ops["name"][i])), int(ops["causal"][i])) for i in rows]
    assert [n for n, _ in got] == [n for n, _ in want] and len(got) == 72
    # flash_attention_forward runs FlashAttention 2: causal bottom-right (2); the SDPA ops top-left (1)
    assert [c for _, c in got] == [(2 if n == "aten::_flash_attention_forward" else 1) if causal else 0
                                   for n, causal in want]
    # ops not in the table stay unknown
    other = np.array([trace.name(int(c)) not in position for c in ops["name"]])
    assert set(ops["causal"][other].tolist()) == {-1}


# --------------------------------------------------------------------------- fused MoE
B200_MOE = Path(__file__).parents[1] / "data" / "field" / "AMD-AGI_TraceLens__b200_vllm_moe_mxfp4_prefill_rank0of8.json.gz"


def test_fused_moe_op_is_not_spread_over_its_routing_and_gemm_kernels():
    # Plain JSON: each kernel's "External id" names the CPU op that launched it (the innermost,
    # latest-starting op with that id). vllm::moe_forward (inputs: hidden [888, 3072] and router
    # logits [888, 128], no expert weights) launched 252 kernels: 36 layers x 7 (routing histogram,
    # offsets, scores, MXFP8 quantize, two trtllm-gen bmm_* expert GEMMs, finalize).
    doc = json.loads(gzip.open(B200_MOE).read())
    ops = {}
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op":
            x = e["args"].get("External id")
            if x not in ops or e["ts"] >= ops[x]["ts"]:
                ops[x] = e
    moe_kernels = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel"
                   and ops.get(e["args"].get("External id"), {}).get("name") == "vllm::moe_forward"]
    assert len(moe_kernels) == 252 and len(set(moe_kernels)) == 7
    assert sum(n.startswith("bmm_") for n in moe_kernels) == 72
    only_under_moe = {n for n in set(moe_kernels)
                      if all(ops.get(e["args"].get("External id"), {}).get("name") == "vllm::moe_forward"
                             for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"] == n)}
    assert only_under_moe == set(moe_kernels)

    est = estimate_roofline(load_kineto(B200_MOE), None)
    labels = {p.label for p in est.points}
    assert labels.isdisjoint(moe_kernels)  # no point built from the op's one cost, GEMM or routing
    assert [(op, n) for op, n, _ in est.not_estimated] == [("vllm::moe_forward", 252)]
    assert "vllm::moe_forward (252 kernels) not estimated" in est.note
    assert "expert weights" in est.not_estimated[0][2]
    # the rest of the trace is still estimated (the attention projections' cuBLAS GEMMs)
    assert any(label.startswith("nvjet_tst_") for label in labels)


H200_LLAMA = Path(__file__).parents[1] / "data" / "h200" / "llama2layer_eager_decode.trace.json.gz"


def test_cudnn_causal_prefill_and_full_decode_attention_on_the_h200_llama_trace():
    # Read by hand from the JSON: aten::_cudnn_attention_forward, "Concrete Inputs"[10] is is_causal.
    # Prefill, 2 layers: q = k = v = [1, 32, 512, 128] (B, H, S, D), is_causal "True", one
    # cudnn_generated_fort_native_sdpa_sm90_* kernel each: 4 * 32 * 128 * (512 * 513 / 2)
    # = 2_151_677_952 FLOP per op. Decode, 16 steps x 2 layers: q [1, 32, 1, 128], k/v
    # [1, 32, S_k, 128] with S_k = 513..528, is_causal "False": 4 * 32 * 128 * S_k each, summed
    # 2 * 16384 * (513 + ... + 528) = 2 * 16384 * 8328 = 272_891_904 FLOP, over the sm80 sdpa
    # kernel and the lean_reduction kernel each decode op launches.
    doc = json.loads(gzip.open(H200_LLAMA).read())
    attn = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::_cudnn_attention_forward"]
    causal = [e for e in attn if e["args"]["Concrete Inputs"][10] == "True"]
    assert len(attn) == 34 and len(causal) == 2
    assert {json.dumps(e["args"]["Input Dims"][0]) for e in causal} == {"[1, 32, 512, 128]"}
    est = estimate_roofline(load_kineto(H200_LLAMA), None)
    by = {p.label: p for p in est.points}
    prefill = [p for label, p in by.items() if label.startswith("cudnn_generated_fort_native_sdpa_sm90")]
    assert len(prefill) == 1 and prefill[0].count == 2
    assert abs(prefill[0].flops / (2 * 2_151_677_952) - 1) < 1e-12
    decode = [p for label, p in by.items() if label.startswith("cudnn_generated_fort_native_sdpa_sm80")
              or "lean_reduction_kernel" in label]
    assert len(decode) == 2 and sum(p.count for p in decode) == 64
    assert abs(sum(p.flops for p in decode) / 272_891_904 - 1) < 1e-12
