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


def _checkpoint_and_text(tmp_path):
    """A tiny random Llama with a word-level tokenizer saved into ``tmp_path``, and a text file."""
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
    return ckpt, text, model, vocab, words


def test_cli_on_local_checkpoint_and_text_file(tmp_path, capsys):
    ckpt, text, model, vocab, words = _checkpoint_and_text(tmp_path)
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


def test_cli_fp8_matmul_precisions_beside_bf16(tmp_path, capsys):
    ckpt, text, _, _, _ = _checkpoint_and_text(tmp_path)
    out = tmp_path / "ppl.json"
    rc = cli_main(["eval", "ppl", "--model", str(ckpt), "--precision", "fp8-rowwise,fp8-tensorwise", "--input-len",
                   "16", "--num-chunks", "2", "--text-file", str(text), "--device", "cpu", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    ppls = {r["precision"]: r["ppl"] for r in doc["results"]}
    assert list(ppls) == ["bf16", "fp8-rowwise", "fp8-tensorwise"]            # bf16 added as the baseline
    for p in ("fp8-rowwise", "fp8-tensorwise"):
        assert math.isfinite(ppls[p]) and ppls[p] != ppls["bf16"]
    got = {d["precision"]: d for d in doc["deltas"]}
    for p in ("fp8-rowwise", "fp8-tensorwise"):
        assert got[p]["bf16_ppl"] == ppls["bf16"]
        assert got[p]["delta"] == pytest.approx(ppls[p] - ppls["bf16"], abs=1e-12)
    assert "vs bf16" in capsys.readouterr().out


def _e4m3(u):
    """float64 -> nearest e4m3fn value by hand (3 mantissa bits, exponent >= -6, |u| <= 448)."""
    a = u.abs()
    step = torch.pow(2.0, torch.floor(torch.log2(a.clamp(min=2.0 ** -6))) - 3)
    return torch.sign(u) * torch.minimum(torch.round(a / step) * step, torch.tensor(448.0, dtype=u.dtype))


@pytest.mark.parametrize("mode", ["rowwise", "tensorwise"])
def test_hf_linears_run_the_fp8_matmul(mode):
    from tracestory.models import fp8

    model = _tiny_model()
    dense = model.model.layers[0].self_attn.q_proj.weight.detach().double().clone()      # [32, 32]
    assert fp8.quantize_linears(model, mode) == 2 * 7                # q k v o gate up down; lm_head kept
    assert isinstance(model.lm_head, torch.nn.Linear)
    q_proj = model.model.layers[0].self_attn.q_proj
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(4))
    y = q_proj(x).double()
    # float64 reference: quantise (amax / 448 scales) -> matmul -> scale
    xd = x.double()
    ax = xd.abs().amax(dim=1, keepdim=True) if mode == "rowwise" else xd.abs().amax()
    aw = dense.abs().amax(dim=1, keepdim=True) if mode == "rowwise" else dense.abs().amax()
    qx, qw = _e4m3(xd * (448 / ax)), _e4m3(dense * (448 / aw))
    ref = (qx @ qw.T) * (ax / 448) * ((aw / 448).T if mode == "rowwise" else aw / 448)
    mag = xd.abs() @ dense.abs().T
    assert torch.all((y - ref).abs() <= 1e-6 * mag)                  # fp32 accumulation of exact products
    assert (y - xd @ dense.T).abs().max() > 0                        # and it is not the dense product
