"""``tracestory serve`` on first contact: served model names, dtype spellings, and one line
(exit 2) instead of a traceback when torch is not installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tracestory.cli import build_parser


@pytest.mark.parametrize("argv, names", [
    ([], None),
    (["--served-model-name", "a", "b"], ["a", "b"]),
    (["--model", "meta-llama/Llama-3.1-8B"], ["meta-llama/Llama-3.1-8B"]),
    (["--model-name", "old"], ["old"]),                 # the older spelling, hidden from the help
])
def test_served_model_name_options(argv, names):
    assert build_parser().parse_args(["serve", *argv]).served_model_names == names


@pytest.mark.parametrize("given, shown", [("auto", "auto"), ("bfloat16", "bf16"), ("bf16", "bf16"),
                                          ("float16", "fp16"), ("float32", "fp32"), ("fp32", "fp32")])
def test_serve_dtype_spellings(given, shown):
    assert build_parser().parse_args(["serve", "--dtype", given]).dtype == shown


def test_serve_without_torch_is_one_line_exit_2():
    # torch made unimportable in a fresh interpreter (None in sys.modules stops its import)
    code = ("import sys; sys.modules['torch'] = None\n"
            "from tracestory.cli import main\n"
            "sys.exit(main(['serve', '--port', '0']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr == ("tracestory: error: torch not found: tracestory serve needs the Python package 'torch': "
                        "pip install 'tracestory[serve]'\n")


@pytest.mark.parametrize("argv, budget", [
    ([], None),                                        # per device: 2048 on CUDA, 256 on the CPU
    (["--max-num-batched-tokens", "4096"], 4096),      # vLLM's name
    (["--max-batch-tokens", "64"], 64),                # the older name
])
def test_token_budget_flag(argv, budget):
    assert build_parser().parse_args(["serve", *argv]).max_batch_tokens == budget


def test_token_budget_default_on_the_cpu_and_refusal(tmp_path):
    pytest.importorskip("torch")
    import json

    from tracestory.errors import UsageError
    from tracestory.serve import CPU_TOKEN_BUDGET, GPU_TOKEN_BUDGET, ServeOptions, build_server

    assert (CPU_TOKEN_BUDGET, GPU_TOKEN_BUDGET) == (256, 2048)
    log = tmp_path / "sched.jsonl"
    engine, _ = build_server(ServeOptions(num_blocks=64, event_log=str(log)))
    engine.log.flush()
    assert engine.scheduler.config.max_batch_tokens == 256
    assert json.loads(log.read_text().splitlines()[0])["max_batch_tokens"] == 256
    for bad in (0, -1):
        with pytest.raises(UsageError, match=f"--max-num-batched-tokens: expected an integer >= 1, found {bad}"):
            build_server(ServeOptions(num_blocks=64, max_batch_tokens=bad))
