"""First contact with ``tracestory bench`` and ``tracestory eval``: one dtype spelling, a help
text for every option, no reStructuredText markup in the help, one line (exit 2) for a bad
``--model``.

Expected values are the spellings and messages the commands promise (written here), checked on
the real parser and on real CPU runs.
"""

from __future__ import annotations

import argparse
import json

import pytest

from tracestory.cli import build_parser
from tracestory.cli import main as cli_main


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


def _my_parsers() -> dict[str, argparse.ArgumentParser]:
    top = _subparsers(build_parser())
    out = {"bench": top["bench"], "eval": top["eval"], "serve": top["serve"]}
    out.update({f"bench {k}": v for k, v in _subparsers(top["bench"]).items()})
    out.update({f"eval {k}": v for k, v in _subparsers(top["eval"]).items()})
    return out


def test_every_option_has_help_and_no_rst_markup():
    parsers = _my_parsers()
    assert {"bench llama", "bench attention-decode", "bench fp8", "bench moe", "eval ppl", "serve"} <= set(parsers)
    for name, p in parsers.items():
        for a in p._actions:
            if a.option_strings and a.help is not argparse.SUPPRESS:
                assert a.help, f"{name} {a.option_strings[0]} has no help text"
        text = p.format_help()
        assert "``" not in text and ":mod:" not in text and ":func:" not in text, name


@pytest.mark.parametrize("workload", ["llama", "attention-decode", "fp8"])
@pytest.mark.parametrize("given, shown", [("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16"),
                                          ("float16", "fp16"), ("fp32", "fp32"), ("float32", "fp32")])
def test_one_dtype_spelling_across_bench_commands(workload, given, shown):
    args = build_parser().parse_args(["bench", workload, "--dtype", given])
    assert args.dtype == shown


@pytest.mark.parametrize("workload", ["llama", "attention-decode", "fp8"])
def test_unknown_dtype_is_a_usage_error(workload, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["bench", workload, "--dtype", "int8"])
    assert e.value.code == 2
    assert "expected a dtype bf16, fp16 or fp32 (or bfloat16, float16, float32), found 'int8'" in capsys.readouterr().err


def test_dtype_in_torch_spelling_is_printed_by_its_short_name(tmp_path, capsys):
    out = tmp_path / "l.json"
    rc = cli_main(["bench", "llama", "--preset", "tiny", "--device", "cpu", "--dtype", "float32", "--layers", "1",
                   "--kv-len", "4", "--warmup-ms", "0", "--rep-ms", "0", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "(fp32)" in text and "float32" not in text
    assert json.loads(out.read_text())["args"]["dtype"] == "fp32"


def test_eval_precisions_accept_torch_names():
    args = build_parser().parse_args(["eval", "ppl", "--model", "m", "--precision", "bfloat16,fp8-weight,float32"])
    assert args.precision == ["bf16", "fp8-weight", "fp32"]


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing", "expected a local Hugging Face checkpoint folder, found nothing there"),
    (lambda d: d, "expected a Hugging Face checkpoint folder with config.json, found none in it"),
    (lambda d: (d / "config.json").write_text("{}") and d, "expected a loadable Hugging Face tokenizer, found"),
])
def test_eval_ppl_bad_model_is_one_line(tmp_path, capsys, make, message):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat " * 20)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    model = make(ckpt)
    rc = cli_main(["eval", "ppl", "--model", str(model), "--text-file", str(text), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith(f"tracestory: error: {model}: ") and message in err


@pytest.mark.parametrize("argv, extra", [
    (["bench", "llama", "--preset", "tiny"], "torch"),
    (["eval", "ppl", "--model", "."], "bench"),
])
def test_without_torch_is_one_line_exit_2(argv, extra):
    import subprocess
    import sys

    # torch made unimportable in a fresh interpreter (None in sys.modules stops its import)
    code = f"import sys; sys.modules['torch'] = None\nfrom tracestory.cli import main\nsys.exit(main({argv!r}))\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.endswith(f"needs the Python package 'torch': pip install 'tracestory[{extra}]'\n")
    assert r.stderr.count("\n") == 1
