"""bench fp8 on a CPU: the reference quantizers (hand-computed values), case tables, CLI parsing.

The Triton kernels are compared with these references on the GPU (tests/gpu/test_fp8_gpu.py).
"""


import json

import pytest
import torch

from tracestory.bench import fp8
from tracestory.cli import build_parser
from tracestory.cli import main as cli_main


def test_per_tensor_hand_values():
    x = torch.tensor([[1.0, -2.0], [0.5, 4.0]])
    q, s = fp8.ref_quantize_per_tensor(x)
    # amax 4 -> scale 4/448, x * 112: 112, -224, 56, 448 are all exact e4m3 values.
    assert q.dtype == torch.float8_e4m3fn
    assert q.float().tolist() == [[112.0, -224.0], [56.0, 448.0]]
    assert s.shape == (1,) and s.item() == pytest.approx(4.0 / 448.0, rel=1e-7)


def test_per_row_hand_values_and_zero_row():
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [-7.0, 3.5, 1.75]])
    q, s = fp8.ref_quantize_per_row(x)
    assert s[:, 0].tolist() == pytest.approx([2.0 / 448, 1.0, 7.0 / 448], rel=1e-7)
    # row 0: x * 224; row 2: x * 64 (3.5*64=224, 1.75*64=112): all exact in e4m3.
    assert q.float().tolist() == [[224.0, -448.0, 112.0], [0.0, 0.0, 0.0], [-448.0, 224.0, 112.0]]


def test_per_row_rounds_to_nearest_e4m3():
    # amax 448 -> inv 1; 17 lies between e4m3 neighbours 16 and 18 (step 2 in [16, 32)): a tie
    # goes to the even mantissa (16); 17.5 goes to 18; 300 lies between 288 and 320 -> 288.
    x = torch.tensor([[448.0, 17.0, 17.5, 300.0]])
    q, _ = fp8.ref_quantize_per_row(x)
    assert q.float().tolist() == [[448.0, 16.0, 18.0, 288.0]]


def _mx_exponent(amax: float) -> int:
    """Smallest integer e with amax <= 448 * 2**e, by search (float64 is exact here)."""
    for e in range(-127, 128):
        if amax <= 448.0 * 2.0 ** e:
            return e
    return 127


def test_mxfp8_scales_match_search_and_no_clipping():
    g = torch.Generator().manual_seed(3)
    x = torch.randn((4, 128), generator=g) * torch.tensor([1e-3, 1.0, 30.0, 5e3])[:, None]
    # Boundary blocks: amax exactly 448 (e=0), just above 448 (e=1), exactly 1 (e=-8).
    x[0, :32] = torch.linspace(-1, 1, 32) * 448.0
    x[1, :32] = 0.0
    x[1, 5] = float(torch.nextafter(torch.tensor(448.0), torch.tensor(1e9)))
    x[2, :32] = 0.25
    x[2, 7] = 1.0
    q, sc = fp8.ref_quantize_mxfp8(x)
    assert q.shape == (4, 128) and sc.shape == (4, 4) and sc.dtype == torch.uint8
    for r in range(4):
        for b in range(4):
            blk = x[r, 32 * b:32 * (b + 1)].double()
            e = _mx_exponent(float(blk.abs().max()))
            assert int(sc[r, b]) == e + 127, (r, b)
            scaled = blk * 2.0 ** -e
            assert float(scaled.abs().max()) <= 448.0      # nothing clips
            assert float(scaled.abs().max()) > 224.0       # and the range is used (smallest e)
            # e4m3 keeps 3 mantissa bits: relative error <= 2**-4 above the subnormal range
            deq = q[r, 32 * b:32 * (b + 1)].double()
            assert torch.all((deq - scaled).abs() <= 2.0 ** -4 * scaled.abs() + 2.0 ** -10)
    assert int(sc[0, 0]) == 127 + 0 and int(sc[1, 0]) == 127 + 1 and int(sc[2, 0]) == 127 - 8


def test_mxfp8_dequantize_and_zero_block():
    x = torch.zeros((1, 64))
    x[0, 32:] = torch.arange(32) / 4.0       # amax 7.75 -> e = -5 (448/32 = 14 >= 7.75 > 7)
    q, sc = fp8.ref_quantize_mxfp8(x)
    assert sc.tolist() == [[0, 122]]          # all-zero block: e clamps to -127 (byte 0)
    deq = fp8.dequantize_mxfp8(q, sc)
    # arange/4 * 32 = 8*i: exact in e4m3 for i < 32 except where 3 mantissa bits do not suffice
    expect = [(float(v) * 32) for v in torch.arange(32) / 4.0]
    got = (deq[0, 32:] * 32).tolist()
    for g_, e_ in zip(got, expect):
        assert abs(g_ - e_) <= e_ * 2 ** -4
    assert deq[0, :32].abs().sum().item() == 0.0


def test_mxfp8_needs_k_multiple_of_32():
    with pytest.raises(Exception, match="multiple of 32"):
        fp8.ref_quantize_mxfp8(torch.ones((2, 48)))


def test_fp8_code_diff():
    a = torch.tensor([1.0, 2.0, 3.0, -4.0]).to(torch.float8_e4m3fn)
    b = torch.tensor([1.0, 2.25, 3.0, -4.0]).to(torch.float8_e4m3fn)  # 2 -> 2.25: the next code
    frac, steps = fp8.fp8_code_diff(a, b)
    assert frac == 0.25 and steps == 1
    assert fp8.fp8_code_diff(a, a) == (0.0, 0)


def test_case_tables_and_selection():
    assert fp8.select_cases(None, None) == [c for s in ("small", "medium", "large") for c in fp8.CASES[s]]
    assert fp8.select_cases(None, [(1, 2, 3)]) == [(1, 2, 3)]
    assert fp8.select_cases("large", [(8192, 8192, 8192)]) == list(fp8.CASES["large"])  # no duplicate
    assert (8192, 8192, 8192) in fp8.CASES["large"]    # the 8192^3 target case
    for cases in fp8.CASES.values():                    # _scaled_mm and MXFP8 alignment
        for m, n, k in cases:
            assert n % 16 == 0 and k % 32 == 0
    with pytest.raises(Exception, match="unknown set 'huge'"):
        fp8.select_cases("huge", None)


def test_cli_parsing():
    args = build_parser().parse_args(["bench", "fp8", "--test-cases", "small,medium", "--custom", "512,1024,2048",
                                      "--custom", "64x128x256", "--dtype", "float16", "--iterations", "7",
                                      "--profile", "torch", "--no-fast-accum", "--json", "o.json"])
    assert args.custom == [(512, 1024, 2048), (64, 128, 256)]
    # the torch spelling float16 is the same dtype as fp16, shown by its short name
    assert (args.dtype, args.iterations, args.profile, args.fast_accum, args.json) == \
        ("fp16", 7, "torch", False, "o.json")
    assert args.test_cases == "small,medium"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "fp8", "--custom", "1,2"])


def test_older_profiler_flags_are_deprecated_aliases(capsys):
    args = build_parser().parse_args(["bench", "fp8", "--use-profiler", "--trace-out", "t.json.gz"])
    assert (args.profile, args.profile_out) == ("torch", "t.json.gz")
    err = capsys.readouterr().err
    assert "--use-profiler is deprecated, use --profile torch" in err
    assert "--trace-out is deprecated, use --profile-out" in err
    # one pair of profiling flags in the help; the older spellings are hidden
    sub = build_parser()._subparsers._group_actions[0].choices["bench"]._subparsers._group_actions[0]
    text = sub.choices["fp8"].format_help()
    assert "--profile-out" in text and "--use-profiler" not in text and "--trace-out" not in text


def test_cpu_run_stops_with_message(capsys):
    if torch.cuda.is_available():
        pytest.fail("this test is for the CPU (CI) machine")
    assert cli_main(["bench", "fp8", "--test-cases", "small"]) == 2
    assert "bench fp8 needs a CUDA GPU" in capsys.readouterr().err


# --------------------------------------------------------------------------- the run on a CPU
# The Triton kernels need CUDA; here the reference quantizers stand in for them (the GPU tests
# compare the two), and torch's CPU _scaled_mm runs the FP8 matmuls, so the whole run and the
# command's output are exercised without a GPU.
@pytest.fixture
def cpu_setup(monkeypatch):
    import sys
    import types

    from tracestory.bench import common

    fake = types.ModuleType("tracestory.models.quant_triton")
    fake.quantize_per_tensor = fp8.ref_quantize_per_tensor
    fake.quantize_per_row = fp8.ref_quantize_per_row
    fake.quantize_mxfp8 = fp8.ref_quantize_mxfp8
    monkeypatch.setitem(sys.modules, "tracestory.models.quant_triton", fake)
    setup = fp8.Fp8Setup(common.open_device("cpu"), 90, "MXFP8 matmul needs SM100 (stand-in)")
    monkeypatch.setattr(fp8, "prepare_fp8", lambda device=None: setup)
    return setup


def test_run_fp8_results(cpu_setup):
    (case,) = fp8.run_fp8([(64, 32, 64)], "bfloat16", 2, setup=cpu_setup)
    assert (case.M, case.N, case.K) == (64, 32, 64) and not case.failed
    # A [64, 64] bf16 read once (8192 B) + fp8 written (4096 B) + scales: 4 B, 64 rows x 4 B, 64*64/32 E8M0 bytes
    assert [(q.method, q.bytes_min, q.mismatch_fraction) for q in case.quant] == [
        ("per-tensor", 8192 + 4096 + 4, 0.0), ("per-row", 8192 + 4096 + 256, 0.0), ("mxfp8", 8192 + 4096 + 128, 0.0)]
    # the baseline carries the dtype's short name; MXFP8 matmul is gated off; FLOPs = 2*M*N*K
    assert [m.method for m in case.matmul] == ["bf16", "fp8-tensor", "fp8-row"]
    assert all(m.error is None and m.flops == 2 * 64 * 32 * 64 for m in case.matmul)
    assert case.matmul[0].speedup_vs_baseline == 1.0
    assert all(m.rel_err_vs_ref < 1e-2 and m.rel_err_vs_fp32 < 0.25 for m in case.matmul)


def test_cli_fp8_prints_and_writes_json(cpu_setup, tmp_path, capsys):
    out = tmp_path / "fp8.json"
    assert cli_main(["bench", "fp8", "--custom", "64,32,64", "--iterations", "2", "--dtype", "bfloat16",
                     "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "MXFP8 matmul skipped: MXFP8 matmul needs SM100 (stand-in)" in text
    assert "=== M=64, N=32, K=64 (bf16) ===" in text and "SUMMARY: matmuls" in text and "bfloat16" not in text
    doc = json.loads(out.read_text())
    assert doc["dtype"] == "bf16" and doc["iterations"] == 2
    assert [m["method"] for m in doc["cases"][0]["matmul"]] == ["bf16", "fp8-tensor", "fp8-row"]


def test_cli_fp8_older_profiler_flags_still_write_a_trace(cpu_setup, tmp_path, capsys):
    import gzip

    trace = tmp_path / "fp8.trace.json.gz"
    assert cli_main(["bench", "fp8", "--custom", "64,32,64", "--iterations", "2", "--use-profiler",
                     "--trace-out", str(trace)]) == 0
    with gzip.open(trace, "rt") as f:
        names = [e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "user_annotation"]
    assert names.count("BENCHMARK") == 1                 # the first case's timed work
    assert "deprecated" in capsys.readouterr().err
