"""benchmarks/gpu/serve_table.py, the script behind docs/BENCHMARKS.md's serving rows: its new
parts (decode p50 per batch size, the weight bytes a decode step reads, stall clusters) against
values worked out by hand or by a plain loop over the repository's TP=2 capture log."""

import gzip
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "serve_table.py"
LOG = ROOT / "tests" / "data" / "tp_serve_gpu" / "torch" / "serve.sched.jsonl.gz"


def _module():
    spec = importlib.util.spec_from_file_location("serve_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_stall_clusters_split_at_gaps_and_give_the_period():
    c = _module().stall_clusters([4.6, 0.0, 0.1, 1.5, 1.55, 1.7, 3.0])
    assert c == {"clusters": 4, "starts_s": [0.0, 1.5, 3.0, 4.6], "intervals_s": [1.5, 1.5, 1.6],
                 "interval_p50_s": 1.5}
    assert _module().stall_clusters([])["clusters"] == 0


def test_weight_bytes_of_llama_3_8b_in_fp8():
    # per layer: q 4096x4096, k and v 1024x4096, o 4096x4096, gate/up/down 3 x 14336x4096 parameters,
    # one byte each in FP8, one fp32 scale per output row (4096 + 2 x 1024 + 4096 + 2 x 14336 + 4096
    # rows: q, k, v, o, gate, up, down), two bf16 norm vectors of 4096; 32 layers; the LM head
    # 128,256 x 4,096 in bf16
    layer = 4096 * 4096 * 2 + 1024 * 4096 * 2 + 3 * 14336 * 4096
    scales = 4 * (4096 + 2 * 1024 + 4096 + 2 * 14336 + 4096)
    want = 32 * (layer + scales + 2 * 4096 * 2) + 128256 * 4096 * 2
    got = _module().weight_bytes_per_gpu({"fp8": "rowwise", "layers": 32, "vocab": 128256}, 1)
    assert got == want
    assert _module().weight_bytes_per_gpu({"fp8": "rowwise", "layers": 32, "vocab": 128256}, 2) == want / 2


def test_decode_p50_per_batch_on_the_tp2_capture(tmp_path):
    (tmp_path / "serve.sched.jsonl.gz").write_bytes(LOG.read_bytes())
    out = tmp_path / "row.json"
    p = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--gpus", "2", "--json", str(out)],
                       capture_output=True, text=True, check=True)
    assert p.stdout.strip().splitlines()[-1].startswith("row: 2 GPU(s), decode p50 ")
    row = json.loads(out.read_text())
    # the same by a plain loop: iterations after the first 20, less those a profiler mark held
    # (the marked one's predecessor and itself), decode-only ones grouped by member count
    its = [x for x in map(json.loads, gzip.open(LOG, "rt")) if x["type"] == "iteration"][20:]
    held = {i for i, x in enumerate(its) if x.get("profiler_ns")} | {i - 1 for i, x in enumerate(its) if x.get("profiler_ns")}
    by: dict[int, list[float]] = {}
    for i, x in enumerate(its):
        if i not in held and not x.get("prefill_tokens"):
            by.setdefault(len(x["members"]), []).append((x["t_end_ns"] - x["t_start_ns"]) / 1e6)
    assert {int(k): v for k, v in row["decode_p50_ms_by_batch"].items()} == {
        b: round(statistics.median(v), 3) for b, v in sorted(by.items())}
    assert row["stall_clusters"]["clusters"] <= row["over_3x_median"]


def test_a_folder_without_a_log_is_one_line_and_exit_2(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--gpus", "1"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [f"{tmp_path}: expected serve.sched.jsonl[.gz] (and load.summary.json), "
                                             "found none"]
