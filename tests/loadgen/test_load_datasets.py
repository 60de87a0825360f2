"""Prompts of `tracestory load`: a ShareGPT file written here (usable pairs, vLLM's length
filter, shuffling, reuse, damaged files), the statement when no tokenizer is used, and
token-exact random prompts with a small byte-level BPE tokenizer trained here (its own encode is
the second source of every length)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tracestory.errors import TraceFormatError, UsageError
from tracestory.loadgen import LoadConfig, load_tokenizer, prompt_source, read_sharegpt, run_load

from sse_stub import Stub
from sse_stub import stub_server_fixture  # noqa: F401  (the stub_server fixture)


def words(n: int, w: str = "w") -> str:
    return " ".join(f"{w}{i}" for i in range(n))


SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": words(5, "a")}, {"from": "gpt", "value": words(6)}]},
    {"id": "short-prompt", "conversations": [{"from": "human", "value": words(3)}, {"from": "gpt", "value": words(9)}]},
    {"id": "one-turn", "conversations": [{"from": "human", "value": words(8)}]},
    "not an object",
    {"id": "short-reply", "conversations": [{"from": "human", "value": words(7, "s")}, {"from": "gpt", "value": "ok"}]},
    {"id": "b", "conversations": [{"from": "human", "value": words(10, "b")}, {"from": "gpt", "value": words(4)},
                                  {"from": "human", "value": "more"}]},
    {"id": "numbers", "conversations": [{"from": "human", "value": 5}, {"from": "gpt", "value": words(9)}]},
    {"id": "long", "conversations": [{"from": "human", "value": words(1025, "l")}, {"from": "gpt", "value": words(5)}]},
    {"id": "c", "conversations": [{"from": "human", "value": words(4, "c")}, {"from": "gpt", "value": words(30)}]},
]


@pytest.fixture
def sharegpt(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT))
    return path


def test_sharegpt_pairs_filter_and_order(sharegpt):
    # usable: two text turns -> a, short-prompt, short-reply, b, long, c (file order)
    pairs = read_sharegpt(sharegpt)
    assert [p[0].split()[0] for p in pairs] == ["a0", "w0", "s0", "b0", "l0", "c0"]
    cfg = LoadConfig(url="http://h", model="m", dataset="sharegpt", dataset_path=str(sharegpt), seed=4)
    src = prompt_source(cfg, load_tokenizer(None))
    # kept (vLLM's filter, word counts): a (5, 6), b (10, 4), c (4, 30); shuffled by default_rng(seed)
    lens = {"a0": (5, 6), "b0": (10, 4), "c0": (4, 30)}
    order = [pairs[k][0].split()[0] for k in np.random.default_rng(4).permutation(len(pairs))]
    kept = [x for x in order if x in lens]
    got = [src[i] for i in range(5)]
    assert [p.text.split()[0] for p in got] == kept + kept[:2]      # reused from the start
    assert [(p.prompt_len, p.output_len) for p in got] == [lens[x] for x in kept + kept[:2]]
    assert src.reused
    fixed = prompt_source(LoadConfig(url="http://h", model="m", dataset="sharegpt", dataset_path=str(sharegpt),
                                     seed=4, sharegpt_output_len=2), load_tokenizer(None))
    # a fixed output length drops the output-length checks: short-reply (7 words) is kept too
    assert sorted(fixed[i].text.split()[0] for i in range(4)) == ["a0", "b0", "c0", "s0"]
    assert {fixed[i].output_len for i in range(4)} == {2}


def test_sharegpt_prompts_are_what_is_sent(sharegpt, stub_server):
    stub = Stub()
    url = stub_server(stub)
    result = run_load(LoadConfig(url=url, model="m", dataset="sharegpt", dataset_path=str(sharegpt), seed=4,
                                 max_concurrency=1, num_requests=3, timeout_s=5))
    src = prompt_source(LoadConfig(url="http://h", model="m", dataset="sharegpt", dataset_path=str(sharegpt), seed=4),
                        load_tokenizer(None))
    assert [b["prompt"] for b in stub.bodies] == [src[i].text for i in range(3)]
    assert [b["max_tokens"] for b in stub.bodies] == [src[i].output_len for i in range(3)]
    assert all(r.ok for r in result.records)


@pytest.mark.parametrize("content, found", [
    ("{not json", "unreadable JSON"),
    ('{"conversations": []}', "a JSON dict"),
    ('[{"conversations": [{"value": "x"}]}]', "no conversation with two text turns among 1 entries"),
])
def test_damaged_sharegpt_is_one_line(tmp_path, content, found):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TraceFormatError) as e:
        read_sharegpt(path)
    assert str(e.value).startswith(f"{path}: expected a ShareGPT JSON list") and found in str(e.value)
    with pytest.raises(UsageError, match="no such file"):
        read_sharegpt(tmp_path / "missing.json")


def test_nothing_passes_the_length_filter(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps([{"conversations": [{"value": "hi"}, {"value": "hello there"}]}]))
    src = prompt_source(LoadConfig(url="http://h", model="m", dataset="sharegpt", dataset_path=str(path)),
                        load_tokenizer(None))
    with pytest.raises(TraceFormatError, match="none among 1 conversations"):
        src[0]


def test_without_a_tokenizer_the_statement_says_lengths_are_approximate(monkeypatch):
    c = load_tokenizer(None)
    assert c.tokenizer is None and not c.exact and "no --tokenizer given" in c.statement
    monkeypatch.setitem(sys.modules, "transformers", None)        # as if not installed
    c = load_tokenizer("some/model")
    assert not c.exact and "transformers is not installed" in c.statement and "word counts" in c.statement


def test_an_unavailable_tokenizer_is_stated_not_fatal(tmp_path):
    c = load_tokenizer(str(tmp_path / "no-such-tokenizer"))
    assert c.tokenizer is None and not c.exact and "cannot be loaded offline" in c.statement
    assert "\n" not in c.statement


def train_tokenizer(folder):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog and runs far away",
              "pack my box with five dozen liquor jugs", "héllo wörld, ünïcode 東京 text"] * 20
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>").save_pretrained(folder)


def test_random_prompts_are_token_exact_with_a_tokenizer(tmp_path):
    pytest.importorskip("transformers", reason="the transformers extra gives token-exact prompts")
    train_tokenizer(tmp_path / "tok")
    choice = load_tokenizer(str(tmp_path / "tok"))
    assert choice.exact and choice.tokenizer is not None
    cfg = LoadConfig(url="http://h", model="m", prompt_len_min=5, prompt_len_max=60, max_new_tokens=7, seed=1)
    src = prompt_source(cfg, choice)
    planned = np.random.default_rng([1, 1]).integers(5, 61, size=25).tolist()
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))   # the tokenizers library itself
    got = [src[i] for i in range(25)]
    assert [len(raw.encode(p.text, add_special_tokens=False).ids) for p in got] == planned
    assert [p.prompt_len for p in got] == planned and src.inexact == 0
    assert {p.output_len for p in got} == {7}
