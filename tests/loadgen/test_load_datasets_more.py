"""The custom JSONL and prefix_repetition datasets. Expected values come from the JSONL lines
the test writes (read back with plain ``json``), a direct numpy draw of the documented
permutations, and word counts (the word rule: one token a word)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from tracestory.errors import TraceFormatError, UsageError
from tracestory.loadgen import LoadConfig, load_tokenizer, prompt_source, read_custom

WORDS = load_tokenizer(None)


def write_jsonl(path, rows, blank_lines=False):
    lines = [json.dumps(r) for r in rows]
    if blank_lines:
        lines.insert(1, "   ")
    path.write_text("\n".join(lines) + "\n")
    return path


def custom_cfg(path, **kw):
    return LoadConfig(url="http://h", model="m", dataset="custom", dataset_path=str(path), **kw)


ROWS = [{"prompt": "alpha beta gamma", "output_tokens": 7},
        {"prompt": "one two"},
        {"prompt": "a b c d e", "output_tokens": 3},
        {"prompt": "single", "extra": "ignored by the reader"}]


def test_custom_lines_in_file_order_with_their_output_lengths(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ROWS, blank_lines=True)
    assert read_custom(path) == [("alpha beta gamma", 7), ("one two", None), ("a b c d e", 3), ("single", None)]
    src = prompt_source(custom_cfg(path, disable_shuffle=True), WORDS)
    got = [src[i] for i in range(4)]
    assert [p.text for p in got] == [r["prompt"] for r in ROWS]
    assert [p.prompt_len for p in got] == [3, 2, 5, 1]                 # words of each prompt
    assert [p.output_len for p in got] == [7, 256, 3, 256]            # the line's output_tokens, else 256
    assert not src.reused
    src[4]
    assert src.reused and src[5].text == ROWS[1]["prompt"]           # index 5 -> line 5 % 4 = 1


def test_custom_output_len_flag_and_minus_one(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    fixed = prompt_source(custom_cfg(path, disable_shuffle=True, custom_output_len=11), WORDS)
    assert [fixed[i].output_len for i in range(4)] == [11] * 4
    with pytest.raises(TraceFormatError, match="2 of 4 lines without it"):
        prompt_source(custom_cfg(path, custom_output_len=-1), WORDS)
    every = write_jsonl(tmp_path / "q.jsonl", [ROWS[0], ROWS[2]])
    per_line = prompt_source(custom_cfg(every, disable_shuffle=True, custom_output_len=-1), WORDS)
    assert [per_line[0].output_len, per_line[1].output_len] == [7, 3]


def test_custom_shuffle_is_the_documented_permutation(tmp_path):
    rows = [{"prompt": f"w{i} " * (i + 1)} for i in range(9)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    src = prompt_source(custom_cfg(path, seed=5), WORDS)
    order = np.random.default_rng(5).permutation(9)
    assert [src[i].text for i in range(9)] == [rows[k]["prompt"] for k in order]


@pytest.mark.parametrize(("text", "found"), [
    ('{"prompt": "ok"}\n{"prompt": 3}\n', "line 2 has no string 'prompt'"),
    ('{"prompt": "ok"}\nnot json\n', "line 2 is not JSON"),
    ('["prompt"]\n', "line 1 has no string 'prompt'"),
    ('{"prompt": "x", "output_tokens": 0}\n', "line 1 has output_tokens 0"),
    ('{"prompt": "x", "output_tokens": true}\n', "line 1 has output_tokens true"),
    ("\n\n", "no line"),
])
def test_custom_bad_lines_are_refused_with_their_number(tmp_path, text, found):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=found):
        read_custom(path)


def test_custom_cli_bad_file_is_one_line_exit_2(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    p = subprocess.run([sys.executable, "-m", "tracestory.cli", "load", "--url", "http://127.0.0.1:9", "--model",
                        "m", "--dataset-name", "custom", "--dataset-path", str(path), "--num-prompts", "2",
                        "--no-progress"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    err = [x for x in p.stderr.splitlines() if x.startswith("tracestory: error")]
    assert len(err) == 1 and str(path) in err[0] and "line 2" in err[0]
    missing = subprocess.run([sys.executable, "-m", "tracestory.cli", "load", "--model", "m", "--dataset-name",
                              "custom", "--no-progress"], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--dataset-path: expected a local JSONL file" in missing.stderr
    with pytest.raises(UsageError, match="no such file"):
        read_custom(tmp_path / "absent.jsonl")


def test_prefix_repetition_prompts_share_prefixes_block_by_block():
    P, pre, suf, n = 4, 12, 5, 10
    cfg = LoadConfig(url="http://h", model="m", dataset="prefix_repetition", prefix_len=pre, suffix_len=suf,
                     num_prefixes=P, prefix_output_len=9, seed=3)
    src = prompt_source(cfg, WORDS)
    prompts = [src[i] for i in range(n)]
    words = [p.text.split() for p in prompts]
    assert all(len(w) == pre + suf for w in words) and {p.prompt_len for p in prompts} == {pre + suf}
    assert {p.output_len for p in prompts} == {9} and src.inexact == 0
    prefixes = [tuple(w[:pre]) for w in words]
    assert len(set(prefixes)) == P                                     # 10 requests over 4 prefixes
    # block b (requests 4b .. 4b+3) uses each prefix once, in default_rng([seed, 5, b]).permutation(4)
    first = {}
    for b in range(2):
        block = prefixes[b * P:(b + 1) * P]
        assert len(set(block)) == P
        for pos, k in enumerate(np.random.default_rng([3, 5, b]).permutation(P)):
            assert first.setdefault(int(k), block[pos]) == block[pos]
    assert Counter(prefixes).most_common()[-1][1] >= 2                 # every prefix used twice or more
    suffixes = [tuple(w[pre:]) for w in words]
    assert len(set(suffixes)) == n                                     # each request its own suffix
    again = prompt_source(cfg, WORDS)
    assert [again[i].text for i in range(n)] == [p.text for p in prompts]


@pytest.mark.parametrize(("kw", "found"), [
    ({"num_prefixes": 0}, "--prefix-repetition-num-prefixes: expected an integer >= 1, found 0"),
    ({"prefix_len": 0}, "--prefix-repetition-prefix-len: expected an integer >= 1, found 0"),
    ({"custom_output_len": -2, "dataset": "custom", "dataset_path": "x"}, "--custom-output-len: expected"),
    ({"dataset": "sonnets"}, "--dataset-name: expected one of random, sharegpt, custom, prefix_repetition, sonnet"),
    ({"dataset": "sonnet"}, "--dataset-path: expected a local text file with --dataset-name sonnet"),
])
def test_dataset_settings_are_checked(kw, found):
    base = {"url": "http://h", "model": "m", "dataset": "prefix_repetition"}
    base.update(kw)
    with pytest.raises(UsageError, match=found.replace("(", r"\(").replace(")", r"\)")):
        LoadConfig(**base).validate()


POEM = ["shall the small test compare its", "each line a row of words", "",
        "no sonnet here but lines written", "six words in every line here", "and then six more words again"]


def test_sonnet_prompts_follow_the_line_counts(tmp_path):
    path = tmp_path / "poem.txt"
    path.write_text("\n".join(POEM) + "\n")
    # 5 non-blank lines of 6 words: average 6; the base sentence "Pick as many lines as you can
    # from these poem lines:" has 11 words
    cfg = LoadConfig(url="http://h", model="m", dataset="sonnet", dataset_path=str(path), sonnet_input_len=48,
                     sonnet_prefix_len=24, sonnet_output_len=9, seed=2)
    src = prompt_source(cfg, WORDS)
    lines = [x for x in POEM if x]
    # lines in all: round((48 - 11) / 6) = round(6.17) = 6; prefix lines: round((24 - 11) / 6) = round(2.17) = 2
    assert (src.num_lines, src.num_prefix) == (6, 2)
    for i in range(3):
        p = src[i]
        body = p.text.split("\n")
        assert body[0] == "Pick as many lines as you can from these poem lines:" and body[-1] == ""
        assert body[1:3] == lines[:2] and len(body[1:-1]) == 6
        # 11 + 6 lines x 6 words = 47 <= 48: the first draw is kept
        picks = np.random.default_rng([2, 8, i]).integers(0, 5, size=4)
        assert body[3:7] == [lines[k] for k in picks]
        assert p.prompt_len == 47 and p.output_len == 9
    assert src.inexact == 0 and prompt_source(cfg, WORDS)[2].text == src[2].text


def test_sonnet_prompt_longer_than_the_input_len_is_counted(tmp_path):
    path = tmp_path / "poem.txt"
    path.write_text("one two three four five six seven eight nine ten\n")
    # base 11 words + lines of 10: input 28 -> round(17 / 10) = 2 lines -> 31 words > 28 on every draw
    src = prompt_source(LoadConfig(url="http://h", model="m", dataset="sonnet", dataset_path=str(path),
                                   sonnet_input_len=28, sonnet_prefix_len=0), WORDS)
    assert src[0].prompt_len == 31 and src.inexact == 1
    with pytest.raises(UsageError, match="--sonnet-input-len: expected more than the base prompt's 11 tokens"):
        prompt_source(LoadConfig(url="http://h", model="m", dataset="sonnet", dataset_path=str(path),
                                 sonnet_input_len=11), WORDS)
