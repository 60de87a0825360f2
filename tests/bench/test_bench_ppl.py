"""eval ppl: the perplexity formula against a hand computation on a tiny random Llama built here."""

import json
import math

import pytest
import torch
import transformers

from tracestory.bench import ppl
from tracestory.cli import main as cli_main

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "home"]


def _tiny_model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(WORDS) + 1, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval()


def _hand_ppl(model, chunks):
    """exp(mean NLL) per chunk with logsumexp in float64 math, then the geometric mean."""
    per = []
    for c in chunks:
        with torch.no_grad():
            z = model(input_ids=torch.tensor([c])).logits[0].double().tolist()
        nll = []
        for i in range(len(c) - 1):
            m = max(z[i])
            lse = m + math.log(sum(math.exp(v - m) for v in z[i]))
            nll.append(lse - z[i][c[i + 1]])
        per.append(math.exp(sum(nll) / len(nll)))
    return per, math.exp(sum(math.log(p) for p in per) / len(per))


def test_make_chunks():
    assert ppl.make_chunks(list(range(10)), 4, None) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ppl.make_chunks(list(range(10)), 3, 2) == [[0, 1, 2], [3, 4, 5]]
    assert ppl.make_chunks([1, 2], 4, 5) == []


def test_perplexity_matches_hand_computation():
    model = _tiny_model()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, len(WORDS) + 1, (40,), generator=g).tolist()
    chunks = ppl.make_chunks(ids, 12, 3)
    r = ppl.evaluate(model, chunks, name="tiny", precision="fp32")
    per, overall = _hand_ppl(model, chunks)
    assert r.per_chunk_ppl == pytest.approx(per, rel=1e-5)
    assert r.ppl == pytest.approx(overall, rel=1e-5)
    assert (r.num_chunks, r.input_len, r.tokens_scored) == (3, 12, 3 * 11)


def test_fp8_weight_variant_rounds_linear_weights():
    model = _tiny_model()
    before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    n = ppl.fake_quant_fp8_weights(model)
    after = model.model.layers[0].mlp.up_proj.weight.detach()
    assert n == 2 * 7 + 1                         # q,k,v,o,gate,up,down per layer + lm_head
    row_amax = before.abs().amax(dim=1, keepdim=True)
    # row-wise e4m3: error <= half a step, i.e. 2**-4 relative, plus the subnormal floor
    assert torch.all((after - before).abs() <= before.abs() * 2 ** -4 + row_amax / 448 * 2 ** -9)
    assert not torch.equal(after, before)


def test_cli_on_local_checkpoint_and_text_file(tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    ckpt = tmp_path / "tiny"
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]").save_pretrained(ckpt)
    model = _tiny_model()
    model.save_pretrained(ckpt)
    g = torch.Generator().manual_seed(2)
    words = [WORDS[i] for i in torch.randint(0, len(WORDS), (50,), generator=g).tolist()]
    text = tmp_path / "t.txt"
    text.write_text(" ".join(words))
    out = tmp_path / "ppl.json"
    rc = cli_main(["eval", "ppl", "--model", str(ckpt), "--precision", "fp32,fp8-weight", "--input-len", "16",
                   "--num-chunks", "2", "--text-file", str(text), "--device", "cpu", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    ids = [vocab[w] for w in words]
    _, expect = _hand_ppl(model, [ids[:16], ids[16:32]])
    fp32 = doc["results"][0]
    assert fp32["precision"] == "fp32" and fp32["num_chunks"] == 2
    assert fp32["ppl"] == pytest.approx(expect, rel=1e-5)
    assert doc["results"][1]["precision"] == "fp8-weight"
    assert doc["results"][1]["ppl"] != fp32["ppl"]
